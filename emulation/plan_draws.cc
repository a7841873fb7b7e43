#include "emulation/plan_draws.h"

#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "common/splitmix64.h"
#include "emulation/report_files.h"

namespace edgetrain::emulation {

namespace {

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

}  // namespace

Range parse_range(const std::string& text, const std::string& what) {
  static const std::regex form(R"(^([0-9]*\.?[0-9]+)(:([0-9]*\.?[0-9]+))?$)");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    throw std::invalid_argument(what + " must be a number or A:B");
  Range r;
  r.lo = std::stod(m[1].str());
  r.hi = m[3].matched ? std::stod(m[3].str()) : r.lo;
  return r;
}

LinkProfile parse_link_profile(const std::string& text) {
  LinkProfile profile;
  std::map<std::string, Range*> keys = {{"delay", &profile.delay},
                                        {"jitter", &profile.jitter},
                                        {"loss", &profile.loss},
                                        {"bandwidth", &profile.bandwidth}};
  std::map<std::string, bool> seen;
  for (const std::string& item : split_fields(text)) {
    const auto equals = item.find('=');
    const std::string key = item.substr(0, equals);
    if (equals == std::string::npos || !keys.count(key)) {
      throw std::invalid_argument("--link: unknown item '" + item +
                                  "' (delay, jitter, loss, bandwidth)");
    }
    const Range value = parse_range(item.substr(equals + 1), "--link: " + key);
    if (!seen[key]) *keys[key] = value;
    seen[key] = true;
  }
  return profile;
}

double draw(const Range& range, std::uint64_t seed, std::uint64_t worker, const std::string& key) {
  constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  std::uint64_t key_hash = 0;
  for (const char c : key) key_hash = key_hash * 31 + static_cast<unsigned char>(c);
  const std::uint64_t mixed =
      seed * kGolden + (worker + 1) * 0xbf58476d1ce4e5b9ULL + key_hash * 0x94d049bb133111ebULL;
  runtime::SplitMix64 generator{mixed - kGolden};  // next() adds φ back before mixing
  const std::uint64_t fraction_bits = generator.next() >> 12;
  return range.lo + (range.hi - range.lo) * static_cast<double>(fraction_bits) / 4503599627370496.0;
}

void declare_plan_settings(settings::Table& t, PlanOptions& o) {
  t.add("seed", o.seed, "seed of the draws");
  t.add("workers", o.workers, "number of workers (required)").range(1, 4000).required();
  t.add("link", o.link, "impaired link, e.g. delay=20:80,jitter=5,loss=0.01,bandwidth=1000:5000");
  t.add("impaired", o.impaired, "how many workers (the first K) get --link (default: all)");
  t.add("slowdown", o.slowdown, "A or A:B, drawn per worker");
  t.add("network", o.network, "addresses on loopback, or a /30 per worker in namespaces")
      .choices({"loopback", "netns"});
  t.add("subnet", o.subnet, "S of 10.S.0.0/16 (netns)").range(0, 255);
  t.add("reachable", o.reachable, "share of the time each link is up (down windows below 1)")
      .range(0.01, 1);
  t.add("outage-period", o.outage_period, "one down window per period").range(1, 1e7).unit("seconds");
  t.add("outage-start", o.outage_start, "links up before this").range(0, 1e7).unit("seconds");
}

std::pair<std::string, std::string> worker_addresses(const PlanOptions& o, unsigned worker) {
  if (o.network != "netns") return {"127.0.0.1", "127.0.0.1:0"};
  const unsigned base = worker * 4;
  const std::string prefix =
      "10." + std::to_string(o.subnet) + "." + std::to_string(base / 256) + ".";
  return {prefix + std::to_string(base % 256 + 2),
          prefix + std::to_string(base % 256 + 1) + ":5684"};
}

std::string plan_csv(const PlanOptions& o) {
  const LinkProfile link = parse_link_profile(o.link);
  const Range slowdown = parse_range(o.slowdown, "--slowdown");
  std::ostringstream csv;
  csv << "worker,address,listen,delay_ms,jitter_ms,loss,bandwidth_kbps,slowdown,link_seed,"
         "outage_period_s,outage_s,outage_phase_s,outage_from_s\n";
  for (unsigned i = 0; i < o.workers; i++) {
    const auto [address, listen] = worker_addresses(o, i);
    std::string delay = "0", jitter = "0", loss = "0", bandwidth = "0";
    if (i < o.impaired) {
      delay = number_text(draw(link.delay, o.seed, i, "delay"));
      jitter = number_text(draw(link.jitter, o.seed, i, "jitter"));
      loss = number_text(draw(link.loss, o.seed, i, "loss"));
      bandwidth = number_text(draw(link.bandwidth, o.seed, i, "bandwidth"));
    }
    csv << i << ',' << address << ',' << listen << ',' << delay << ',' << jitter << ',' << loss
        << ',' << bandwidth << ',' << number_text(draw(slowdown, o.seed, i, "slowdown")) << ','
        << o.seed * 100003 + i;
    if (o.reachable < 1) {
      const double phase = o.outage_start + o.outage_period * i / o.workers;
      csv << ',' << number_text(o.outage_period) << ','
          << number_text((1 - o.reachable) * o.outage_period) << ',' << number_text(phase) << ','
          << number_text(o.outage_start) << '\n';
    } else {
      csv << ",0,0,0,0\n";
    }
  }
  return csv.str();
}

}  // namespace edgetrain::emulation
