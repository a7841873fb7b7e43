#!/usr/bin/env bash
# A gossip fleet (edgetrain-worker --mode gossip) as separate programs on loopback DTLS with
# X.509 identities from one test CA: four peers in a ring train a small MLP on mnist-small with
# no server. One peer is killed with SIGKILL mid-run: its neighbours go on without it (they
# skip it with backoff) and, restarted, it resumes from its checkpoint. At the end the peers'
# checkpoints are evaluated (edgetrain-fleet-eval): the mean peer and the consensus model
# pass a bound, and nothing was refused. Peer-3 may be another program (PEER_3_COMMAND,
# e.g. the aarch64 build under qemu-aarch64) than the host build the others run.
# usage: [PEER_3_COMMAND=...] [ITERATIONS=400] \
#          gossip_fleet.sh WORKER TOPOLOGY FLEET_EVAL MIN_ACCURACY [PEER ARGS...]
worker="$1"; topology="$2"; fleet_eval="$3"; min_accuracy="$4"; shift 4
peer_args=("$@")
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
bash "$(dirname "$0")/make_test_certificates.sh" "$work/certs" peer-0 peer-1 peer-2 peer-3 || exit $?

base=$(free_udp_ports 4)
"$topology" --kind ring --peers 4 --addresses '127.0.0.1:{port}' --base-port "$base" --out "$work/topology.json"

# A small MLP: a dense model crosses CoAP in 1 KiB Block2 blocks, one round trip each, so a
# peer's pull of the default mlp (400 KB) takes hundreds of round trips.
# The peers run until every one has done `iterations` (then SIGTERM): AD-PSGD's peers never
# wait for each other, so an --iterations limit would end them at very different times, and
# a time limit would make the test's figures depend on how busy the machine is.
iterations=${ITERATIONS:-400}
model="input 28x28x1; fc 16 relu; fc 10"
start_peer() {  # start_peer I LOG
  local i="$1"
  local command=("$worker")
  [ "$i" = 3 ] && [ -n "${PEER_3_COMMAND:-}" ] && read -r -a command <<<"$PEER_3_COMMAND"
  start_program "$2" "${command[@]}" --mode gossip --topology "$work/topology.json" --peer-name "peer-$i" \
    --cert "$work/certs/peer-$i.crt" --cert-key "$work/certs/peer-$i.key" --ca "$work/certs/ca.crt" \
    --model "$model" --data mnist-small --lr 0.05 --duration 600 --neighbour-wait 2 --checkpoint-every 25 \
    --state-dir "$work/state-$i" --stats-file "$work/peer-$i.json" --quiet ${peer_args[@]+"${peer_args[@]}"}
  peer_pids[$i]=$last_pid
}
peer_pids=()
for i in 0 1 2 3; do start_peer "$i" "$work/peer-$i.log"; done

wait_for_json "$work/peer-2.json" iteration -ge $((iterations / 3)) 90 "${peer_pids[2]}" ||
  fail "peer-2 did not reach iteration $((iterations / 3))"
kill -KILL "${peer_pids[2]}"
wait "${peer_pids[2]}" 2>/dev/null || true
killed_at=$(json_get "$work/peer-2.json" iteration)
echo "killed peer-2 (SIGKILL) near iteration $killed_at"
# Its neighbours go on without it.
for i in 1 3; do
  at=$(json_get "$work/peer-$i.json" iteration)
  wait_for_json "$work/peer-$i.json" iteration -ge $((at + 20)) 30 "${peer_pids[$i]}" ||
    fail "peer-$i stopped when its neighbour peer-2 was killed (at iteration $at)"
done
start_peer 2 "$work/peer-2-restarted.log"
wait_for_json "$work/peer-2.json" resumed_iteration -gt 0 30 "${peer_pids[2]}" || fail "peer-2 did not resume from a checkpoint"
resumed=$(json_get "$work/peer-2.json" resumed_iteration)
echo "peer-2 resumed at iteration $resumed"
[ "$resumed" -ge $((killed_at - 25)) ] || fail "peer-2 resumed at $resumed, more than a checkpoint interval before $killed_at"

for i in 0 1 2 3; do
  wait_for_json "$work/peer-$i.json" iteration -ge "$iterations" 120 "${peer_pids[$i]}" ||
    fail "peer-$i did not reach iteration $iterations"
done
for i in 0 1 2 3; do kill -TERM "${peer_pids[$i]}"; done
for i in 0 1 2 3; do wait_for_exit "${peer_pids[$i]}" 30 || fail "peer-$i exited with status $? after SIGTERM"; done
for i in 0 1 2 3; do
  [ "$(json_get "$work/peer-$i.json" state)" = stopped ] || fail "peer-$i's stats file does not say stopped"
  [ "$(json_get "$work/peer-$i.json" models_refused)" -eq 0 ] || fail "peer-$i refused a neighbour's model"
  [ "$(json_get "$work/peer-$i.json" requests_refused)" -eq 0 ] || fail "peer-$i refused a neighbour's request"
  [ "$(json_get "$work/peer-$i.json" exchanges)" -gt 0 ] || fail "peer-$i never exchanged a model"
done
"$fleet_eval" --data mnist-small --model "$model" --out "$work/fleet.json" "$work"/state-{0,1,2,3}/peer.safetensors
mean=$(json_get "$work/fleet.json" mean_accuracy); consensus=$(json_get "$work/fleet.json" consensus_accuracy)
echo "mean peer accuracy $mean (min $(json_get "$work/fleet.json" min_accuracy)), consensus model $consensus"
json_compare "$(json_get "$work/fleet.json" min_accuracy)" -ge "$min_accuracy" || fail "a peer's accuracy is below $min_accuracy"
json_compare "$consensus" -ge "$min_accuracy" || fail "the consensus model's accuracy $consensus is below $min_accuracy"
! grep -q "gossip peer failed" "$work"/peer-*.log || fail "a peer failed"
echo "PASS"
