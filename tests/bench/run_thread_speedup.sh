#!/usr/bin/env bash
# The Trainer's paper-CNN step on 1 and 2 threads, at batch 10 and 32: the 2-thread
# speed-up (issue 40 part 3), for one kernel_bench build or two side by side (e.g. main's
# and a branch's). Runs are paired and interleaved (1 thread, then 2, for each build in
# turn, PAIRS times), so a machine whose load drifts affects both sides of a pair alike;
# each pair's speed-up is 1-thread ms / 2-thread ms (medians of the steps in each run), and
# the median over the pairs is printed, with the fastest steps' ratio beside it and the load
# average at the start and the end. A shared machine lowers 2-thread figures most (the
# second thread competes with other processes): quote the load average with them.
#   usage: tests/bench/run_thread_speedup.sh [kernel_bench [other kernel_bench]]
#          (default build/host/tests/kernel_bench; PAIRS=5 STEPS=40 BATCHES="10 32")
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
benches=("${@:-$root/build/host/tests/kernel_bench}")
pairs="${PAIRS:-5}"
steps="${STEPS:-40}"
batches="${BATCHES:-10 32}"
for bench in "${benches[@]}"; do
  [[ -x "$bench" ]] || { echo "run_thread_speedup.sh: no executable $bench" >&2; exit 1; }
done

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-50s %9s %9s %9s %13s\n' batch build ms_1thr ms_2thr speedup speedup_min
for batch in $batches; do
  declare -A ms1=() ms2=() ratio=() ratio_min=()
  for ((pair = 0; pair < pairs; pair++)); do
    for i in "${!benches[@]}"; do
      one=$("${benches[$i]}" --path trainer --batch "$batch" --threads 1 --steps "$steps")
      two=$("${benches[$i]}" --path trainer --batch "$batch" --threads 2 --steps "$steps")
      a=$(field ms_per_step <<<"$one"); b=$(field ms_per_step <<<"$two")
      am=$(field min_ms <<<"$one"); bm=$(field min_ms <<<"$two")
      ms1[$i]+="$a "; ms2[$i]+="$b "
      ratio[$i]+="$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", a / b }') "
      ratio_min[$i]+="$(awk -v a="$am" -v b="$bm" 'BEGIN { printf "%.4f", a / b }') "
    done
  done
  for i in "${!benches[@]}"; do
    printf '%-6s %-50s %9.3f %9.3f %8.2fx %12.2fx\n' "$batch" "${benches[$i]}" \
      "$(tr ' ' '\n' <<<"${ms1[$i]}" | grep . | median)" \
      "$(tr ' ' '\n' <<<"${ms2[$i]}" | grep . | median)" \
      "$(tr ' ' '\n' <<<"${ratio[$i]}" | grep . | median)" \
      "$(tr ' ' '\n' <<<"${ratio_min[$i]}" | grep . | median)"
  done
  unset ms1 ms2 ratio ratio_min
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
