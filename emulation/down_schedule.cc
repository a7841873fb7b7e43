#include "emulation/down_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace edgetrain::emulation {
namespace {

// Position of `t` within its period, in [0, period).
double within_period(double t, double phase, double period) {
  const double x = std::fmod(t - phase, period);
  return x < 0 ? x + period : x;
}

// Seconds of [0, t] inside [a, b).
double overlap(double a, double b, double t) { return std::max(0.0, std::min(b, t) - a); }

bool number_text(const std::string& text, double& value) {
  if (text.empty()) return false;
  std::size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    return false;
  }
  return used == text.size() && std::isfinite(value);
}

}  // namespace

bool DownSchedule::down_at(double t) const {
  for (const DownWindow& w : windows)
    if (t >= w.start_s && t < w.start_s + w.length_s) return true;
  return period_s > 0 && down_s > 0 && t >= from_s &&
         within_period(t, phase_s, period_s) < down_s;
}

double DownSchedule::down_seconds_until(double t) const {
  double total = 0;
  // Explicit windows, merged so that overlapping ones count once.
  std::vector<DownWindow> sorted = windows;
  std::sort(sorted.begin(), sorted.end(),
            [](const DownWindow& a, const DownWindow& b) { return a.start_s < b.start_s; });
  double covered_until = 0;
  for (const DownWindow& w : sorted) {
    const double a = std::max(w.start_s, covered_until), b = w.start_s + w.length_s;
    if (b > a) total += overlap(a, b, t);
    covered_until = std::max(covered_until, b);
  }
  if (period_s > 0 && down_s > 0 && t > from_s) {
    // The down part of the period that holds from_s, then whole periods, then the last.
    const double first_down_start = from_s - within_period(from_s, phase_s, period_s);
    for (double start = first_down_start; start < t; start += period_s)
      total += overlap(std::max(start, from_s), start + down_s, t);
  }
  return total;
}

void DownSchedule::check(const std::string& what) const {
  for (const DownWindow& w : windows)
    if (!(w.start_s >= 0 && std::isfinite(w.start_s) && w.length_s > 0 &&
          std::isfinite(w.length_s)))
      throw std::invalid_argument(what + ": a down window needs a start >= 0 and a length > 0");
  if (!(std::isfinite(period_s) && period_s >= 0 && std::isfinite(down_s) && down_s >= 0 &&
        std::isfinite(phase_s) && std::isfinite(from_s) && from_s >= 0))
    throw std::invalid_argument(what + ": outage period, length and start must be finite and >= 0");
  if (down_s > 0 && period_s <= 0)
    throw std::invalid_argument(what + ": an outage length needs an outage period");
  if (period_s > 0 && down_s >= period_s)
    throw std::invalid_argument(what + ": the outage length must be shorter than its period " +
                                "(the link would never come up)");
}

std::vector<DownWindow> parse_down_windows(const std::string& text, const std::string& what) {
  std::vector<DownWindow> windows;
  if (text.empty()) return windows;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    const std::size_t plus = item.find('+');
    DownWindow w;
    if (plus == std::string::npos || !number_text(item.substr(0, plus), w.start_s) ||
        !number_text(item.substr(plus + 1), w.length_s) || w.start_s < 0 || w.length_s <= 0)
      throw std::invalid_argument(what + ": '" + item +
                                  "' is not START+LEN (seconds, START >= 0, LEN > 0)");
    windows.push_back(w);
    begin = end + 1;
  }
  return windows;
}

}  // namespace edgetrain::emulation
