// CPU budgets of emulated boards: each worker process runs in its own cgroup with a CPU
// quota (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us, or v2 cpu.max), so a board's speed is
// a real limit on its CPU time rather than a sleep. Workers belong to speed classes (a name
// and a share of one core), and a schedule changes the shares during the run (a background
// load arriving and leaving). This file turns the settings into the list of quota changes
// the launcher applies (edgetrain-emulation-report cpu-plan): edgetrain-emulate does no
// arithmetic.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace edgetrain::emulation {

struct CpuClass {
  std::string name;
  double share = 1;  // of one core: 0.25 is a quarter of a core's time
};

// Between `start` and `end` seconds of the run, the shares of the workers of `class_name`
// (every worker when empty) are multiplied by `factor`. Windows may overlap: factors multiply.
struct CpuWindow {
  double start = 0, end = 0, factor = 1;
  std::string class_name;
};

// "pi5=1,pi4=0.6,pi3=0.35,zero2w=0.2" (NAME=SHARE, SHARE in (0, 64]) or plain shares
// "1,0.5,0.25" (named c0, c1, ...). Throws std::invalid_argument naming the item at fault.
std::vector<CpuClass> parse_cpu_classes(std::string_view text);
// "60-120:0.5,200-260:0.25@pi3": START-END:FACTOR[@CLASS], seconds, FACTOR in (0, 64],
// START < END; CLASS must be one of `classes`. Empty text: no windows.
std::vector<CpuWindow> parse_cpu_schedule(std::string_view text,
                                          const std::vector<CpuClass>& classes);

struct CpuChange {
  double elapsed = 0;  // seconds into the run
  unsigned worker = 0;
  std::string class_name;
  double share = 0;            // of one core, after the schedule's factors
  std::uint64_t quota_us = 0;  // per period; at least kMinimumQuotaMicros
  std::uint64_t period_us = 0;
};

// The kernel refuses quotas below 1 ms (cgroup v1 and v2 alike).
inline constexpr std::uint64_t kMinimumQuotaMicros = 1000;

// Worker i is in class i mod K (classes equally filled, the same on every run). Returns the
// quota of every worker at 0 s, then each change at the schedule's boundaries (only for the
// workers whose share changes), in time order and then worker order.
std::vector<CpuChange> plan_cpu_changes(unsigned workers, const std::vector<CpuClass>& classes,
                                        const std::vector<CpuWindow>& schedule,
                                        std::uint64_t period_us);

// CSV: elapsed_s,worker,class,share,quota_us,period_us.
std::string cpu_changes_csv(const std::vector<CpuChange>& changes);

}  // namespace edgetrain::emulation
