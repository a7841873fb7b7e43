#!/usr/bin/env bash
# edgetrain-sim --mode gossip as a program (sim/README.md "Gossip"): the same seed writes the
# same sim.csv byte for byte, the outputs are there with the columns scripts read, and
# settings that do not fit the mode are refused by name with exit status 2 before any data
# loads.
# usage: sim_gossip_cli.sh EDGETRAIN_SIM
sim="$1"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
data="$(basename "$mnist_dir")"

common=(--mode gossip --data "$data" --model mlp --workers 6 --iterations 40 --eval-every 20 --eval-examples 300
        --speed-classes 1,0.5 --quiet)
for run in a b; do
  "$sim" "${common[@]}" --gossip ad-psgd --seed 4 --out "$work/$run" >"$work/$run.log" 2>&1 ||
    fail "edgetrain-sim --mode gossip: $(tail -3 "$work/$run.log")"
done
cmp -s "$work/a/sim.csv" "$work/b/sim.csv" || fail "the same seed wrote two different sim.csv files"
for file in summary.md accuracy-vs-time.svg accuracy-vs-bytes.svg; do
  [ -s "$work/a/$file" ] || fail "no $file"
done
head -1 "$work/a/sim.csv" | grep -q '^method,virtual_time,mean_iterations,bytes_per_peer,mean_accuracy,min_accuracy,max_accuracy,consensus_accuracy,' ||
  fail "sim.csv's columns changed: $(head -1 "$work/a/sim.csv")"
[ "$(wc -l <"$work/a/sim.csv")" = 4 ] || fail "expected the start and two evaluations in sim.csv"
"$sim" "${common[@]}" --gossip ad-psgd --seed 5 --out "$work/c" >/dev/null 2>&1 || fail "seed 5 failed"
cmp -s "$work/a/sim.csv" "$work/c/sim.csv" && fail "another seed wrote the same sim.csv"
echo "ok: same seed, same sim.csv; another seed, another"

# A refused setting: exit status 2 and the setting's name in the message.
refused() {
  local name="$1"; shift
  local status=0
  "$sim" "$@" --quiet --out "$work/refused" >"$work/refused.log" 2>&1 || status=$?
  [ "$status" = 2 ] || fail "expected exit status 2 for $*, got $status: $(cat "$work/refused.log")"
  grep -q -- "$name" "$work/refused.log" || fail "the message for $* does not name $name: $(cat "$work/refused.log")"
}
printf '{"peers": [{"name": "a"}, {"name": "b"}, {"name": "c"}], "edges": [[0, 1], [1, 2], [2, 0]]}' >"$work/three.json"
refused --publish-fraction --mode gossip --gossip ad-psgd --publish-fraction 0.1
refused --topology-file --mode gossip --workers 4 --topology-file "$work/three.json"
refused --staleness --mode gossip --staleness delay
refused --topology --mode async --topology full
refused --speed-schedule --mode gossip --speed-classes 1,2 --speed-schedule 10:2:0.5
refused --speed-schedule --mode gossip --speed-schedule 10-0.5
refused --speed-classes --mode gossip --speed-classes 1,-2
refused --degree --mode gossip --workers 5 --topology random-regular --degree 3
echo "ok: settings that do not fit --mode gossip are refused by name"
