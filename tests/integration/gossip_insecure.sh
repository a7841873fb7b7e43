#!/usr/bin/env bash
# --insecure gossip (worker/README.md, "Gossip"): two peers over plain CoAP, with no
# certificates, known by the names they declare, train a small MLP for a few iterations
# and exchange models. (Until issue 34 every such peer exited at once: its endpoint parsed
# its own address as a coaps:// URI.)
# usage: gossip_insecure.sh WORKER TOPOLOGY
worker="$1"; topology="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

base=$(free_udp_ports 2)
"$topology" --kind full --peers 2 --addresses '127.0.0.1:{port}' --base-port "$base" --out "$work/topology.json"
# Each runs 4 s (its neighbour may start a moment later: a peer that finds nobody at a
# neighbour's address skips it with backoff and tries again).
pids=()
for i in 0 1; do
  start_program "$work/peer-$i.log" "$worker" --mode gossip --insecure --topology "$work/topology.json" \
    --peer-name "peer-$i" --model "input 28x28x1; fc 16 relu; fc 10" --data mnist-small --lr 0.05 \
    --neighbour-wait 2 --duration 4 --stats-file "$work/peer-$i.json" --quiet
  pids[$i]=$last_pid
done
for i in 0 1; do
  wait_for_exit "${pids[$i]}" 60 || fail "peer-$i exited with status $?: $(tail -n 5 "$work/peer-$i.log")"
  [ "$(json_get "$work/peer-$i.json" iteration)" -gt 0 ] || fail "peer-$i trained no iteration"
  [ "$(json_get "$work/peer-$i.json" exchanges)" -gt 0 ] || fail "peer-$i exchanged no model over plain CoAP"
  [ "$(json_get "$work/peer-$i.json" models_refused)" = 0 ] || fail "peer-$i refused a neighbour's model"
done
echo "PASS: two --insecure gossip peers trained over plain CoAP: $(json_get "$work/peer-0.json" exchanges) and $(json_get "$work/peer-1.json" exchanges) exchanges"
