#!/usr/bin/env bash
# End to end on one machine: edgetrain-server and three edgetrain-worker processes over
# DTLS-PSK on loopback train the MLP on MNIST until the server's evaluator reports a test
# accuracy above FLOOR. Also checks that the server's socket ingress (DTLS, headers,
# handshakes) exceeds the payload ingress in its log, and that everything stops cleanly.
# usage: train_to_accuracy.sh SERVER WORKER [FLOOR]
server="$1"; worker="$2"; floor="${3:-0.70}"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for i in 0 1 2; do add_device "$work/keys.toml" "w$i"; done
start_server "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model mlp --eval-data mnist --eval-interval 1
echo "server on port $server_port"

worker_pids=()
for i in 0 1 2; do
  start_program "$work/w$i.log" "$worker" --config "$work/w$i.toml" --server "coaps://127.0.0.1:$server_port" \
    --model mlp --data mnist --worker-id "$i" --workers 3 --duration 75
  worker_pids+=("$last_pid")
done

# The evaluator logs "test accuracy 0.8695, loss ... at version 439 (0.0 s); ingress ..."
# every second while the version changes.
accuracy_line=""
deadline=$((SECONDS + 70))
while [ -z "$accuracy_line" ]; do
  accuracy_line=$(awk -v floor="$floor" '/test accuracy/ { for (i = 1; i < NF; i++) if ($i == "accuracy" && $(i+1) + 0 > floor) { print; exit } }' "$work/server.log")
  [ -n "$accuracy_line" ] && break
  [ "$SECONDS" -lt "$deadline" ] || fail "no test accuracy above $floor within 70 s"
  kill -0 "$server_pid" 2>/dev/null || fail "the server died"
  sleep 0.2
done
echo "reached: $accuracy_line"

# The socket sees every payload byte plus DTLS records, CoAP headers and the handshakes.
payload=$(sed -nE 's/.*ingress ([0-9]+) payload bytes.*/\1/p' <<<"$accuracy_line")
socket=$(sed -nE 's/.* ([0-9]+) socket bytes in ([0-9]+) datagrams.*/\1/p' <<<"$accuracy_line")
[ -n "$payload" ] && [ -n "$socket" ] || fail "no ingress counters in '$accuracy_line'"
[ "$payload" -gt 0 ] && [ "$socket" -gt "$payload" ] || fail "socket ingress $socket not above payload ingress $payload"

for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
for i in 0 1 2; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $?"
  grep -qE 'stopped after [0-9]+ steps: [1-9][0-9]* updates accepted' "$work/w$i.log" || fail "worker $i got no update accepted"
  # Pulls after the first are model deltas (the default), each checked against the digest
  # of the server's parameters; a mismatch would be logged.
  grep -qE 'pulls \([1-9][0-9]* as deltas\)' "$work/w$i.log" || fail "worker $i pulled no model delta"
  ! grep -qE 'did not reproduce|undecodable model delta|model delta from version' "$work/w$i.log" || fail "worker $i got an unusable model delta"
done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
grep -q 'checkpoint written to .*; bye' "$work/server.log" || fail "the server did not write its final checkpoint"
echo "three workers trained the MLP past $floor test accuracy; socket ingress $socket B vs payload $payload B"
