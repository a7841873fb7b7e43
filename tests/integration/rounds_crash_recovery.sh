#!/usr/bin/env bash
# Federated rounds (--mode rounds) as separate programs on loopback DTLS: three workers, the
# mlp on mnist-small, drop-stragglers. A worker is killed with SIGKILL mid-run: the rounds
# still close at their deadline (stragglers counted). Then the server is killed with SIGKILL
# while a round holds acknowledged deltas: the restarted server is in the same round with
# every acknowledged delta (or, if the close beat the kill, in a later round), the round
# closes, training goes on, and the test accuracy passes a bound.
# usage: rounds_crash_recovery.sh SERVER WORKER MIN_ACCURACY
server="$1"; worker="$2"; min_accuracy="$3"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for i in 0 1 2; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
server_args=(--state-dir "$work/state" --keystore "$work/keys.toml" --model mlp --lr 0.05 --mode rounds
             --round-policy drop-stragglers --round-deadline 4 --min-clients 3 --local-steps 20
             --eval-data mnist-small --eval-interval 1)
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
port=$server_port

worker_pids=()
for i in 0 1 2; do
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "$worker" --config "$work/w$i.toml" --mode rounds --lr 0.05 \
    --compressor none --server "coaps://127.0.0.1:$port" --model mlp --data mnist-small --worker-id "$i" --workers 3 \
    --quiet --duration 100 --give-up-after 60
  worker_pids+=("$last_pid")
done

wait_for_json "$server_stats" rounds.rounds_closed -ge 2 30 "$server_pid" || fail "fewer than 2 rounds closed in 30 s"
kill -KILL "${worker_pids[2]}"
echo "killed worker w2 (SIGKILL) after $(json_get "$server_stats" rounds.rounds_closed) rounds"
closed=$(json_get "$server_stats" rounds.rounds_closed)
wait_for_json "$server_stats" rounds.rounds_closed -ge $((closed + 2)) 30 "$server_pid" ||
  fail "rounds stopped closing after a worker was killed"
wait_for_json "$server_stats" rounds.round_stragglers -ge 1 5 "$server_pid" || fail "no straggler counted"

# A round holding both live workers' deltas, waiting for w2 until its deadline: kill then.
wait_for_json "$server_stats" rounds.round_deltas_received = 2 30 "$server_pid" ||
  fail "no round with two acknowledged deltas seen"
round_before=$(json_get "$server_stats" rounds.round)
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
echo "killed the server (SIGKILL) in round $round_before holding 2 acknowledged deltas"

start_server "$server" "$work/server-2.log" --port "$port" "${server_args[@]}"
round_after=$(json_get "$server_stats" rounds.round)
deltas_after=$(json_get "$server_stats" rounds.round_deltas_received)
echo "restarted in round $round_after with $deltas_after deltas"
if [ "$round_after" -eq "$round_before" ]; then
  [ "$deltas_after" -ge 2 ] || fail "round $round_before restarted with $deltas_after of its 2 acknowledged deltas"
else
  [ "$round_after" -gt "$round_before" ] || fail "restarted in round $round_after, before round $round_before"
fi
wait_for_json "$server_stats" rounds.round -gt "$round_after" 20 "$server_pid" || fail "the round did not close after the restart"
wait_for_json "$server_stats" rounds.rounds_closed -ge 3 40 "$server_pid" || fail "training did not go on after the restart"
wait_for_json "$server_stats" last_evaluation.accuracy -ge "$min_accuracy" 30 "$server_pid" ||
  fail "test accuracy $(json_get "$server_stats" last_evaluation.accuracy) stayed below $min_accuracy"
echo "accuracy $(json_get "$server_stats" last_evaluation.accuracy) at round $(json_get "$server_stats" rounds.round)"
! grep -q ERROR "$work/server-1.log" "$work/server-2.log" || fail "an ERROR in the server's log"
echo "PASS"
