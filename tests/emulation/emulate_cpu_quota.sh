#!/usr/bin/env bash
# Emulated boards with real CPU budgets (edgetrain-emulate --cpu-classes, cgroups): two
# paper-CNN workers (compute-bound; an MLP step mostly waits on the network), one with a
# whole core and one with a tenth of one, and a schedule that halves the fast one's share
# from 8 s to 14 s. Checks: each worker's cgroup holds its class's quota at
# the start and the scheduled one during the window (read from the cgroup files while the
# run goes on); the slow worker trains markedly fewer steps than the fast one (the quota is a
# real limit, not a sleep); the run's cgroups are gone afterwards. Skips (77) without root or
# a cgroup cpu controller.
# usage: emulate_cpu_quota.sh BUILD_DIR
build_dir="$1"
emulate="$(dirname "$0")/../../emulation/edgetrain-emulate"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist
[ "$(id -u)" = 0 ] || { echo "SKIP: cgroups need root"; exit 77; }
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  grep -qw cpu /sys/fs/cgroup/cgroup.controllers || { echo "SKIP: no cgroup v2 cpu controller"; exit 77; }
  quota_of() { cut -d' ' -f1 "$1/cpu.max"; }
  cgroups=/sys/fs/cgroup
else
  cgroups=$(dirname "$(ls /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us 2>/dev/null | head -n1)")
  [ "$cgroups" != . ] || { echo "SKIP: no cgroup cpu controller"; exit 77; }
  quota_of() { cat "$1/cpu.cfs_quota_us"; }
fi
run_cgroups() { local d; for d in "$cgroups"/edgetrain-emulate-*; do [ ! -d "$d" ] || echo "$d"; done; }
before=$(run_cgroups)

"$emulate" --build-dir "$build_dir" --out "$work/run" --workers 2 --model paper-cnn --data mnist-small --pull-every 4 \
  --cpu-classes fast=1,slow=0.1 --cpu-schedule 8-14:0.5@fast --duration 22 --eval-interval 10 --quiet \
  >"$work/emulate.log" 2>&1 &
emulate_pid=$!
watched_logs+=("$work/emulate.log" "$work/run/logs/worker-0.log" "$work/run/logs/worker-1.log")

# The run's cgroup, once its workers are in it.
run_cgroup=""
for _ in $(seq 1 200); do
  run_cgroup=$(comm -13 <(echo "$before") <(run_cgroups) | head -n1)
  # (cgroup files report size 0: read them)
  [ -n "$run_cgroup" ] && [ -n "$(cat "$run_cgroup/w1/cgroup.procs" 2>/dev/null)" ] && break
  sleep 0.1
done
[ -n "$run_cgroup" ] || fail "no cgroup edgetrain-emulate-* appeared under $cgroups"
[ "$(quota_of "$run_cgroup/w0")" = 100000 ] && [ "$(quota_of "$run_cgroup/w1")" = 10000 ] ||
  fail "quotas at the start: w0 $(quota_of "$run_cgroup/w0"), w1 $(quota_of "$run_cgroup/w1"); expected 100000 and 10000"
worker1_pid=$(head -n1 "$run_cgroup/w1/cgroup.procs")
grep -q edgetrain-worker "/proc/$worker1_pid/cmdline" || fail "the process in w1's cgroup is not a worker"
sleep 11   # into the window 8-14 s (the clock starts when the workers do)
[ "$(quota_of "$run_cgroup/w0")" = 50000 ] || fail "the schedule did not halve w0's quota: $(quota_of "$run_cgroup/w0")"
[ "$(quota_of "$run_cgroup/w1")" = 10000 ] || fail "the schedule changed w1, which is not in class fast"
status=0
wait "$emulate_pid" || status=$?
[ "$status" = 0 ] || fail "edgetrain-emulate exited with status $status"
[ ! -e "$run_cgroup" ] || fail "the run's cgroup $run_cgroup is still there"
grep -q "quotas of 1 workers changed" "$work/run/events.log" || fail "no quota change in events.log"
[ "$(tail -n +2 "$work/run/cpu-plan.csv" | wc -l)" = 4 ] || fail "cpu-plan.csv: $(cat "$work/run/cpu-plan.csv")"
[ -s "$work/run/logs/cpu-stat-w1.txt" ] && grep -q nr_throttled "$work/run/logs/cpu-stat-w1.txt" || fail "no cpu.stat of w1 kept"

# workers.csv: worker,address,...,slowdown,steps,...: the fast worker trains more.
steps() { awk -F, -v w="$1" 'NR == 1 { for (c = 1; c <= NF; c++) if ($c == "steps") col = c } NR > 1 && $1 == w { print $col }' "$work/run/workers.csv"; }
fast=$(steps 0) slow=$(steps 1)
echo "steps: fast worker $fast, slow worker $slow"
[ -n "$fast" ] && [ -n "$slow" ] && [ "$slow" -gt 0 ] || fail "workers.csv: $(cat "$work/run/workers.csv")"
[ "$fast" -ge $((2 * slow)) ] || fail "a tenth of a core did not slow worker 1 down: $slow steps against $fast"
echo "cgroup quotas applied, changed on schedule, removed; fast $fast steps, slow $slow"
