#!/usr/bin/env bash
# Workload balancing of gossip peers under a CPU quota that changes (edgetrain-worker --mode
# gossip --balance-target): two paper-CNN peers on loopback DTLS; peer-0 runs in a cgroup
# whose quota goes from a whole core to a tenth of one and back. Checks, from peer-0's stats
# file: its batch shrinks to at most a third when the quota drops (so its iterations keep to
# the target instead of taking ten times longer) and grows back at least twofold when the
# quota returns; the balanced iteration time stays within a factor of the target under the
# low quota. Skips (77) without root or a cgroup cpu controller.
# usage: gossip_balance_quota.sh WORKER TOPOLOGY
worker="$1"; topology="$2"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist
[ "$(id -u)" = 0 ] || { echo "SKIP: cgroups need root"; exit 77; }
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  grep -qw cpu /sys/fs/cgroup/cgroup.controllers || { echo "SKIP: no cgroup v2 cpu controller"; exit 77; }
  cgroup=/sys/fs/cgroup/edgetrain-gossip-$$
  set_quota() { echo "$1 100000" >"$cgroup/cpu.max"; }
else
  root=$(dirname "$(ls /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us 2>/dev/null | head -n1)")
  [ "$root" != . ] || { echo "SKIP: no cgroup cpu controller"; exit 77; }
  cgroup=$root/edgetrain-gossip-$$
  set_quota() { echo 100000 >"$cgroup/cpu.cfs_period_us"; echo "$1" >"$cgroup/cpu.cfs_quota_us"; }
fi
mkdir "$cgroup"
trap 'stop_started_programs; rmdir "$cgroup" 2>/dev/null; rm -rf "$work"' EXIT
set_quota 100000
bash "$(dirname "$0")/../integration/make_test_certificates.sh" "$work/certs" peer-0 peer-1 || exit $?
base=$(python3 -c '
import socket
s = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')
read -r port0 port1 <<<"$base"
"$topology" --kind ring --peers 2 --out "$work/topology.json"
jq --arg a "127.0.0.1:$port0" --arg b "127.0.0.1:$port1" '.peers[0].address = $a | .peers[1].address = $b' \
  "$work/topology.json" >"$work/t.json" && mv "$work/t.json" "$work/topology.json"

target=0.3
for i in 0 1; do
  prefix=()
  # peer-0 joins the cgroup before it execs, so every thread it starts is in it
  [ "$i" = 0 ] && prefix=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cgroup")
  start_program "$work/peer-$i.log" ${prefix[@]+"${prefix[@]}"} "$worker" --mode gossip --topology "$work/topology.json" \
    --peer-name "peer-$i" --cert "$work/certs/peer-$i.crt" --cert-key "$work/certs/peer-$i.key" --ca "$work/certs/ca.crt" \
    --model paper-cnn --data mnist-small --lr 0.05 --balance-target "$target" --min-batch 2 --max-batch 512 \
    --publish-fraction 0.01 --duration 150 --stats-file "$work/peer-$i.json"
done
# printed by fail with the logs: the counters say whether a peer was computing or waiting
watched_logs+=("$work/peer-0.json" "$work/peer-1.json")
stats="$work/peer-0.json"
batch() { json_get "$stats" batch; }
wait_for_json "$stats" iteration -ge 15 40 || fail "peer-0 did not reach iteration 15"
full=$(batch)
echo "whole core: batch $full, $(json_get "$stats" examples_per_second) examples/s"
set_quota 10000
# At a tenth of a core the first steps still use the large batch (several seconds each), and
# the measured speed is a running mean: one CI run (from a whole-core batch of 453) was still
# at 190 after 20 s, so the bound is generous; the check is that the batch comes down.
wait_for_json "$stats" batch -le $((full / 3)) 45 || fail "the batch stayed at $(batch) (from $full) under a tenth of a core"
sleep 3
low=$(batch); low_time=$(json_get "$stats" last_iteration_seconds)
echo "a tenth of a core: batch $low, last iteration ${low_time} s (target $target s)"
json_compare "$low_time" -le "$(awk -v t="$target" 'BEGIN { print 3 * t }')" ||
  fail "an iteration under the low quota took $low_time s, more than 3x the target $target s"
set_quota 100000
# One CI run saw the batch stay put for 30 s after the core came back (cause unknown: the
# stats files are printed on failure to tell); the bound is 60 s.
wait_for_json "$stats" batch -ge $((2 * low)) 60 || fail "the batch stayed at $(batch) (from $low) when the core came back"
echo "whole core again: batch $(batch)"
echo "PASS"
