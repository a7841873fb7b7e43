// When an emulated link is down (issue 38 part 1): a device reachable only part of the
// time, behind Wi-Fi that comes and goes, a board that sleeps, a diurnal pattern. While a
// link is down the impairer drops every datagram on it, both ways (link_impairer.h).
//
// A schedule is any of, together (down when either says so):
//   - explicit windows, "START+LEN,START+LEN,..." in seconds from the impairer's start;
//   - a periodic pattern: from `from_s` on, down for `down_s` of every `period_s` seconds,
//     the down part starting at `phase_s` (mod the period). A diurnal pattern is one with a
//     period of 86400 s. edgetrain-emulate's --reachable R --outage-period P gives worker i
//     of N the phase from + i·P/N, so a share 1 − R of the fleet is down at any time
//     (ours: evenly spread phases, the simplest fleet where no moment is special).
// Pure functions of the time: no clock is read here.
#pragma once

#include <string>
#include <vector>

namespace edgetrain::emulation {

struct DownWindow {
  double start_s = 0, length_s = 0;
};

struct DownSchedule {
  std::vector<DownWindow> windows;
  double period_s = 0;  // 0: no periodic pattern
  double down_s = 0;    // per period, < period_s
  double phase_s = 0;
  double from_s = 0;    // the periodic pattern starts here (up before)

  bool empty() const { return windows.empty() && !(period_s > 0 && down_s > 0); }
  // Whether the link is down `t` seconds after the start.
  bool down_at(double t) const;
  // Seconds the link was down in [0, t] (a window counts once where windows overlap each
  // other, not where one overlaps the periodic pattern: give one or the other).
  double down_seconds_until(double t) const;
  // Throws std::invalid_argument naming `what` and the fault: negative or non-finite
  // numbers, a period with down_s ≥ period_s, down_s without a period.
  void check(const std::string& what) const;
};

// "START+LEN,..." (seconds, numbers ≥ 0, LEN > 0); empty text: no windows. Throws
// std::invalid_argument "WHAT: ..." naming the item at fault.
std::vector<DownWindow> parse_down_windows(const std::string& text, const std::string& what);

}  // namespace edgetrain::emulation
