// The seeded plan of an emulated run (edgetrain-emulation-report plan): every worker's
// address, the impairer's listen address for it, its link profile and slowdown drawn for
// the seed, and its link's seed, as the CSV the launcher reads (plan.csv). The draws are
// the numbers of the bash splitmix64 the launcher used before
// (tests/emulation/emulate_plan_draws.sh keeps them): a seed gives every experiment the
// same devices it always had.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "common/settings.h"

namespace edgetrain::emulation {

// "A" or "A:B", numbers >= 0: a value drawn uniformly in [A, B] per worker.
struct Range {
  double lo = 0, hi = 0;
};

// Throws std::invalid_argument "WHAT must be a number or A:B".
Range parse_range(const std::string& text, const std::string& what);

struct LinkProfile {
  Range delay, jitter, loss, bandwidth;
};

// "delay=20:80,jitter=5,loss=0.01,bandwidth=1000:5000" (ms, ms, probability, kbit/s); a key
// not given is 0; a key given twice: the first counts. Throws std::invalid_argument naming
// the item at fault ("--link: ...").
LinkProfile parse_link_profile(const std::string& text);

// One draw for (seed, worker, key): splitmix64 of seed·φ + (worker+1)·c1 + hash(key)·c2,
// the top 52 bits as the fraction of [lo, hi].
double draw(const Range& range, std::uint64_t seed, std::uint64_t worker, const std::string& key);

struct PlanOptions {
  std::uint64_t seed = 1;
  unsigned workers = 1;
  std::string link;                  // parse_link_profile's text; empty: no impairment
  std::string slowdown = "0";        // parse_range's text
  std::string network = "loopback";  // or "netns"
  // The first K workers get the link profile (the default: all).
  unsigned impaired = std::numeric_limits<unsigned>::max();
  int subnet = 100;  // S of 10.S.0.0/16 (netns)
  // Down windows (emulation/down_schedule.h): below 1, worker i of N is down for
  // (1 − reachable)·outage_period of every period from outage_start on, its phase
  // outage_start + i·outage_period/N.
  double reachable = 1, outage_period = 120, outage_start = 30;
};

// `edgetrain-emulation-report plan`'s flags: --seed, --workers (required, 1..4000), --link,
// --impaired, --slowdown, --network (loopback or netns) and --subnet (0..255), bound to
// OPTIONS, which must outlive the table's parse().
void declare_plan_settings(settings::Table& table, PlanOptions& options);

// Worker i's address and the impairer's listen address for it: on loopback 127.0.0.1 and
// any port; in namespaces a /30 per worker in 10.S.0.0/16 (host side .1, worker .2).
std::pair<std::string, std::string> worker_addresses(const PlanOptions& options, unsigned worker);

// The plan as CSV: worker,address,listen,delay_ms,jitter_ms,loss,bandwidth_kbps,slowdown,
// link_seed,outage_period_s,outage_s,outage_phase_s,outage_from_s (numbers with 6
// significant digits; a worker without impairment has 0 for the link's four; link_seed =
// seed·100003 + worker; the outage columns 0 when always reachable). Throws
// std::invalid_argument for a bad --link or --slowdown.
std::string plan_csv(const PlanOptions& options);

}  // namespace edgetrain::emulation
