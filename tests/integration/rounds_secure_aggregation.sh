#!/usr/bin/env bash
# Secure aggregation in federated rounds on real processes (issue 39, part 2;
# server/secure_round.h): edgetrain-server --mode rounds --secure-aggregation with six workers
# over DTLS on loopback, the mlp on mnist-small. Two workers leave right after their masked
# input was accepted (--test-secagg-drop-after-input): round 0 still closes (their self-masks
# are reconstructed from the others' shares), and the model after it equals the round's start
# plus the mean of all six clipped deltas to within half a quantization step
# (secagg_round_check.py, from the files the workers write under --test-secagg-dump); the
# server's state directory and log hold 32 bytes of no device's delta. Round 1 goes on with the
# four left; the server is killed with SIGKILL in it: the restart keeps round 0's close, begins
# round 1 again as attempt 1 (secagg_attempt.json), the four redo it and it closes.
# usage: rounds_secure_aggregation.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
here="$(dirname "$0")"

devices=(w1 w2 w3 w4 w5 w6)
dropping=(w5 w6)
for name in "${devices[@]}"; do add_device "$server" "$work/keys.toml" "$name" "$work/$name.toml"; done
mkdir -p "$work/dump"
server_args=(--state-dir "$work/state" --keystore "$work/keys.toml" --model mlp --lr 0.05 --mode rounds
             --secure-aggregation --secagg-threshold 0.6 --round-clip-norm 0.5 --round-deadline 6
             --min-clients 6 --local-steps 2 --server-lr 1)
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
port=$server_port
for i in "${!devices[@]}"; do
  name=${devices[$i]}
  drop=()
  [[ " ${dropping[*]} " == *" $name "* ]] && drop=(--test-secagg-drop-after-input)
  start_worker "$work/$name.log" "$work/$name.stats.json" "$worker" --config "$work/$name.toml" --mode rounds \
    --server "coaps://127.0.0.1:$port" --model mlp --data mnist-small --worker-id "$i" --workers 6 --lr 0.05 \
    --quiet --duration 60 --give-up-after 20 --test-secagg-dump "$work/dump" "${drop[@]}"
done

wait_for_json "$server_stats" rounds.rounds_closed -ge 1 25 "$server_pid" || fail "round 0 did not close"
[ "$(json_get "$server_stats" rounds.secagg_last_key_holders) $(json_get "$server_stats" rounds.secagg_last_survivors) $(json_get "$server_stats" rounds.secagg_last_unmasking_senders)" = "6 6 4" ] ||
  fail "round 0 closed with (U1 U3 unmasking) = $(jq -c '.rounds | [.secagg_last_key_holders, .secagg_last_survivors, .secagg_last_unmasking_senders]' "$server_stats"), not 6 6 4"
for name in "${dropping[@]}"; do  # left after its input: the run ended, no unmasking answered
  wait_for_json "$work/$name.stats.json" state = stopped 10 || fail "$name did not leave after its masked input"
  [ "$(json_get "$work/$name.stats.json" rounds_trained)" = 0 ] || fail "$name finished a round"
done

# Kill the server in round 1 once its keys step has closed (the dead w5 and w6 hold it to
# its deadline), then restart it on the same port.
wait_for_json "$server_stats" rounds.secagg_keys -ge 4 15 "$server_pid" || fail "round 1's keys step did not fill"
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
[ "$(jq .round "$work/state/secagg_attempt.json")" = 1 ] || fail "secagg_attempt.json: $(cat "$work/state/secagg_attempt.json")"
echo "killed the server (SIGKILL) in secure round 1, step $(json_get "$server_stats" rounds.secagg_step)"
start_server "$server" "$work/server-2.log" --port "$port" "${server_args[@]}"
[ "$(json_get "$server_stats" rounds.round)" = 1 ] || fail "restarted in round $(json_get "$server_stats" rounds.round), not 1"
[ "$(json_get "$server_stats" rounds.secagg_attempt)" = 1 ] || fail "round 1 did not begin again as attempt 1"
wait_for_json "$server_stats" rounds.round -ge 2 30 "$server_pid" || fail "round 1 did not close after the restart"
[ "$(json_get "$server_stats" rounds.secagg_last_key_holders) $(json_get "$server_stats" rounds.secagg_last_survivors)" = "4 4" ] ||
  fail "round 1 did not close with the four left: $(jq -c .rounds "$server_stats")"

# Round 0's model against the six deltas (round 1's start model is what the four pulled).
python3 "$here/secagg_round_check.py" model "$work/dump" 0 1 "${devices[@]}" -- "${dropping[@]}" ||
  fail "the model after the secure round is not the survivors' mean"
# Nothing of one device's delta in what the server keeps or logs.
files=("$work/server-1.log" "$work/server-2.log")
while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$work/state" -type f -print0)
! python3 "$here/secagg_round_check.py" secrets "$work/dump" 0 "$work/dump/w1.r0.quantized.u32" >/dev/null 2>&1 ||
  fail "the leak check does not find a delta in the file it came from"
for round in 0 1; do python3 "$here/secagg_round_check.py" secrets "$work/dump" "$round" "${files[@]}" || fail "a delta leaked"; done
! grep -q ERROR "$work/server-1.log" "$work/server-2.log" || fail "an ERROR in the server's log"
echo "PASS: secure round 0 closed with 2 of 6 devices gone after their input and equals the plain mean; round 1 survived a SIGKILL (attempt 1); no delta in the server's state or logs"
