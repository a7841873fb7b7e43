#!/usr/bin/env bash
# DISTREAL's run-time choice under a changing CPU quota (issue 14 part 4), for real: one
# federated-rounds worker with the paper CNN's dropout table (boards/) in a cgroup with a
# whole core, whose quota drops to 3% of a core from 10 s to 24 s. The worker picks its drop
# rates from the time left before each round's deadline and its measured step time, so its
# stats file (read while the run goes on) must show the table's most accurate point at
# first, a thinner point while the quota is low, and the most accurate one again after.
# Why 3%: a round of 40 steps must not fit its 3 s deadline at the low quota on a fast CPU
# (40 paper-CNN steps of ~3.5 ms at 3% are ~4.7 s). At 8%, a CPU with 3.5 ms steps fitted the
# whole round in the deadline and rightly kept the most accurate point, and the test failed.
# Skips (77) without root or a cgroup cpu controller.
# usage: emulate_distreal_quota.sh BUILD_DIR
build_dir="$1"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
emulate="$repo/emulation/edgetrain-emulate"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist
[ "$(id -u)" = 0 ] || { echo "SKIP: cgroups need root"; exit 77; }
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  grep -qw cpu /sys/fs/cgroup/cgroup.controllers || { echo "SKIP: no cgroup v2 cpu controller"; exit 77; }
else
  [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] || [ -f /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us ] ||
    { echo "SKIP: no cgroup cpu controller"; exit 77; }
fi
table="$repo/boards/paper-cnn-dropout-table.json"

"$emulate" --build-dir "$build_dir" --out "$work/run" --workers 1 --model paper-cnn --data mnist-small \
  --mode rounds --compressor none --local-steps 40 --round-deadline 3 --dropout-table "$table" \
  --cpu-classes board=1 --cpu-schedule 10-24:0.03 --duration 36 --eval-interval 10 --quiet \
  >"$work/emulate.log" 2>&1 &
emulate_pid=$!
watched_logs+=("$work/emulate.log" "$work/run/logs/worker-0.log")

# The worker's drop rates over time, from its stats file (rewritten after every delta), each
# tagged with the quota phase the emulator had entered by then: its events.log says when it
# applied the schedule's changes. Phases follow the run's own clock, not this script's, so a
# loaded machine that starts the run late does not shift them.
stats="$work/run/logs/worker-0.0.stats.json"
events="$work/run/events.log"
: >"$work/choices.txt"
while kill -0 "$emulate_pid" 2>/dev/null; do
  changes=$(grep -c "cpu: the quotas of" "$events" 2>/dev/null) || changes=0
  phase=$(case "$changes" in 0) echo before ;; 1) echo low ;; *) echo after ;; esac)
  rates=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dropout"]["drop_rates"])' "$stats" 2>/dev/null) &&
    [ -n "$rates" ] && echo "$phase $SECONDS $rates" >>"$work/choices.txt"
  sleep 0.5
done
status=0
wait "$emulate_pid" || status=$?
[ "$status" = 0 ] || fail "edgetrain-emulate exited with status $status"
# The table's most accurate point and its relative times, from the table itself.
read -r best thinner < <(python3 - "$table" <<'PY'
import json, sys
points = json.load(open(sys.argv[1]))["points"]
best = max(points, key=lambda p: p["accuracy"])
fmt = lambda p: ",".join("%g" % r for r in p["drop_rates"])
print(fmt(best), "|".join(fmt(p) for p in points if p["relative_time"] < best["relative_time"]))
PY
)
echo "most accurate point $best; thinner points $thinner"
# Per phase, the choices after its first SKIP seconds: a round under way when the quota
# changed ends at the width chosen before (a round lasts its 3 s deadline plus the pull).
pick() { awk -v p="$1" -v skip="$2" '$1 == p { if (!t0) t0 = $2; if ($2 >= t0 + skip) print $3 }' "$work/choices.txt" | sort -u | paste -sd' '; }
early=$(pick before 0)
low=$(pick low 4)
late=$(pick after 4)
# Each change of phase or choice, with this script's seconds, for the log.
awk '$1 " " $3 != last { print "  " $0; last = $1 " " $3 }' "$work/choices.txt"
echo "choices: before the load [$early], under it [$low], after it [$late]"
# Before the drop the most accurate point must be chosen; a load spike on a shared machine
# may make a round thinner for a while, so it need not be the only choice.
echo " $early " | grep -q " $best " || fail "before the quota dropped the worker trained [$early], never the most accurate point $best"
echo " $low " | grep -Eq " ($thinner) " || fail "under 3% of a core the worker never chose a thinner point: [$low]"
echo " $late " | grep -q " $best " || fail "after the quota came back the worker did not return to $best: [$late]"
selections=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dropout"]["selections"])' "$stats")
[ "$selections" -ge 2 ] || fail "the stats file counts $selections changes of the choice; expected at least 2"
echo "DISTREAL followed the quota: $best -> [$low] -> $best ($selections changes)"
