#!/usr/bin/env bash
# A poisoned neighbour (issue 37 part 4): three --insecure gossip peers on a ring of 3 on
# loopback, where peer-2 is gossip_poisoned_peer, serving a model whose output bias is 1e30.
# The two honest edgetrain-worker peers must refuse every model of peer-2 (the magnitude
# bound), say so once in their logs, count it under peer-2 in their stats files' "neighbours",
# and keep training and mixing with each other.
# usage: gossip_bad_neighbour.sh WORKER TOPOLOGY POISONED_PEER
worker="$1"; topology="$2"; poisoned="$3"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

model="input 28x28x1; fc 16 relu; fc 10"
base=$(free_udp_ports 3)
"$topology" --kind ring --peers 3 --addresses '127.0.0.1:{port}' --base-port "$base" --out "$work/topology.json"
start_program "$work/peer-2.log" "$poisoned" $((base + 2)) "$model" 12 1e30
poisoned_pid=$last_pid
pids=()
for i in 0 1; do
  start_program "$work/peer-$i.log" "$worker" --mode gossip --insecure --topology "$work/topology.json" \
    --peer-name "peer-$i" --model "$model" --data mnist-small --lr 0.05 \
    --neighbour-wait 2 --duration 6 --stats-file "$work/peer-$i.json" --quiet
  pids[$i]=$last_pid
done
for i in 0 1; do
  wait_for_exit "${pids[$i]}" 60 || fail "peer-$i exited with status $?: $(tail -n 5 "$work/peer-$i.log")"
  s="$work/peer-$i.json"
  other=$((1 - i))
  [ "$(json_get "$s" iteration)" -gt 5 ] || fail "peer-$i trained $(json_get "$s" iteration) iterations"
  [ "$(json_get "$s" neighbours.peer-2.refused)" -ge 1 ] || fail "peer-$i did not refuse peer-2: $(json_get "$s" neighbours)"
  [ "$(json_get "$s" neighbours.peer-2.mixed)" = 0 ] || fail "peer-$i mixed peer-2's poisoned model in"
  [ "$(json_get "$s" neighbours.peer-2.last_refusal)" = "model above the magnitude bound from a neighbour" ] ||
    fail "peer-$i refused peer-2 for: $(json_get "$s" neighbours.peer-2.last_refusal)"
  [ "$(json_get "$s" neighbours.peer-$other.refused)" = 0 ] || fail "peer-$i refused its honest neighbour"
  [ "$(json_get "$s" neighbours.peer-$other.mixed)" -gt 0 ] || fail "peer-$i mixed nothing of peer-$other"
  json_compare "$(json_get "$s" last_loss)" -lt 5 || fail "peer-$i's loss is $(json_get "$s" last_loss)"
  said=$(grep -c "peer-2.*refused" "$work/peer-$i.log" || true)
  [ "$said" = 1 ] || fail "peer-$i logged peer-2's refusal $said times (once expected)"
done
kill -TERM "$poisoned_pid" 2>/dev/null || true
echo "PASS: the honest peers refused peer-2's 1e30 bias $(json_get "$work/peer-0.json" neighbours.peer-2.refused) and $(json_get "$work/peer-1.json" neighbours.peer-2.refused) times and trained on: $(json_get "$work/peer-0.json" iteration) and $(json_get "$work/peer-1.json" iteration) iterations, losses $(json_get "$work/peer-0.json" last_loss) and $(json_get "$work/peer-1.json" last_loss)"
