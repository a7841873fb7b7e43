#include "emulation/cpu_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <set>
#include <stdexcept>

namespace edgetrain::emulation {
namespace {

// Every item, empty ones included ("a," is "a" and "": a trailing comma is an error).
std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  std::size_t begin = 0;
  for (std::size_t end; (end = text.find(separator, begin)) != std::string_view::npos;
       begin = end + 1)
    items.emplace_back(text.substr(begin, end - begin));
  items.emplace_back(text.substr(begin));
  return items;
}

double number(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !std::isfinite(value))
    throw std::invalid_argument(what + ": '" + text + "' is not a number");
  return value;
}

void check_factor(double value, const std::string& what) {
  if (!(value > 0 && value <= 64)) throw std::invalid_argument(what + " must be in (0, 64]");
}

std::string text_of(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

}  // namespace

std::vector<CpuClass> parse_cpu_classes(std::string_view text) {
  std::vector<CpuClass> classes;
  std::set<std::string> names;
  const std::regex name_pattern("[A-Za-z][A-Za-z0-9_-]{0,31}");
  for (const std::string& item : split(text, ',')) {
    const std::string where = "--cpu-classes item '" + item + "'";
    CpuClass c;
    const auto equals = item.find('=');
    if (equals == std::string::npos) {
      c.name = "c" + std::to_string(classes.size());
      c.share = number(item, where);
    } else {
      c.name = item.substr(0, equals);
      if (!std::regex_match(c.name, name_pattern))
        throw std::invalid_argument(where +
                                    ": a class name is a letter then letters, digits, '_' or '-'");
      c.share = number(item.substr(equals + 1), where);
    }
    check_factor(c.share, where + ": the share of a core");
    if (!names.insert(c.name).second)
      throw std::invalid_argument(where + ": class '" + c.name + "' named twice");
    classes.push_back(c);
  }
  if (classes.empty()) throw std::invalid_argument("--cpu-classes: no class given");
  return classes;
}

std::vector<CpuWindow> parse_cpu_schedule(std::string_view text,
                                          const std::vector<CpuClass>& classes) {
  std::vector<CpuWindow> windows;
  if (text.empty()) return windows;
  const std::regex pattern(R"(([^-:@]+)-([^-:@]+):([^-:@]+)(@(.+))?)");
  for (const std::string& item : split(text, ',')) {
    const std::string where = "--cpu-schedule item '" + item + "'";
    std::smatch m;
    if (!std::regex_match(item, m, pattern))
      throw std::invalid_argument(where + ": expected START-END:FACTOR[@CLASS]");
    CpuWindow w;
    w.start = number(m[1].str(), where);
    w.end = number(m[2].str(), where);
    w.factor = number(m[3].str(), where);
    w.class_name = m[5].str();
    if (!(w.start >= 0 && w.start < w.end))
      throw std::invalid_argument(where + ": needs 0 <= START < END (seconds)");
    check_factor(w.factor, where + ": the factor");
    if (!w.class_name.empty() &&
        std::none_of(classes.begin(), classes.end(),
                     [&](const CpuClass& c) { return c.name == w.class_name; }))
      throw std::invalid_argument(where + ": no class '" + w.class_name + "' in --cpu-classes");
    windows.push_back(w);
  }
  return windows;
}

std::vector<CpuChange> plan_cpu_changes(unsigned workers, const std::vector<CpuClass>& classes,
                                        const std::vector<CpuWindow>& schedule,
                                        std::uint64_t period_us) {
  if (classes.empty()) throw std::invalid_argument("cpu plan: no classes");
  if (period_us < kMinimumQuotaMicros || period_us > 1000000)
    throw std::invalid_argument("--cpu-period must be 1000..1000000 µs");
  std::set<double> boundaries{0};
  for (const CpuWindow& w : schedule) boundaries.insert({w.start, w.end});
  std::vector<CpuChange> changes;
  std::vector<double> current(workers, -1);
  for (const double t : boundaries) {
    for (unsigned i = 0; i < workers; ++i) {
      const CpuClass& c = classes[i % classes.size()];
      double share = c.share;
      for (const CpuWindow& w : schedule)
        if (t >= w.start && t < w.end && (w.class_name.empty() || w.class_name == c.name))
          share *= w.factor;
      if (share == current[i]) continue;
      current[i] = share;
      const auto quota =
          static_cast<std::uint64_t>(std::llround(share * static_cast<double>(period_us)));
      changes.push_back({t, i, c.name, share, std::max(quota, kMinimumQuotaMicros), period_us});
    }
  }
  return changes;
}

std::string cpu_changes_csv(const std::vector<CpuChange>& changes) {
  std::string csv = "elapsed_s,worker,class,share,quota_us,period_us\n";
  for (const CpuChange& c : changes)
    csv += text_of(c.elapsed) + "," + std::to_string(c.worker) + "," + c.class_name + "," +
           text_of(c.share) + "," + std::to_string(c.quota_us) + "," + std::to_string(c.period_us) +
           "\n";
  return csv;
}

}  // namespace edgetrain::emulation
