#!/usr/bin/env bash
# The server is killed with SIGKILL mid-run, restarted on the same state directory, then
# stopped with SIGTERM and restarted again, while the same two worker processes keep going.
# Checks: no acknowledged update is lost (the recovered version is at least every version a
# worker got in a 2.04, and each worker's acknowledged versions keep increasing over the
# whole run), recovery is clean (its log line, no error), and the workers reconnect and get
# updates accepted after each restart. Then a flipped byte in the checkpoint: the server
# resumes at the same version from the previous checkpoint; in both checkpoints: refused.
# usage: server_crash_recovery.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for i in 0 1; do add_device "$work/keys.toml" "w$i"; done
# Checkpoints every 40 updates: the kill lands after a few, so recovery loads a checkpoint
# and replays the WAL records after it.
server_args=(--state-dir "$work/state" --keystore "$work/keys.toml" --model mlp --checkpoint-every 40)
start_server "$work/server-1.log" --port 0 "${server_args[@]}"
port=$server_port

worker_pids=()
for i in 0 1; do
  start_program "$work/w$i.log" "$worker" --config "$work/w$i.toml" --server "coaps://127.0.0.1:$port" \
    --model mlp --worker-id "$i" --workers 2 --log-acks --quiet --duration 80
  worker_pids+=("$last_pid")
done

max_acked() { cat "$work/w0.log" "$work/w1.log" | sed -nE 's/.*acknowledged: server version ([0-9]+).*/\1/p' | sort -n | tail -n1; }
# wait_for_acks_above VERSION SECONDS: until some worker logs an acknowledgement above VERSION.
wait_for_acks_above() {
  local deadline=$((SECONDS + $2))
  until [ "$(max_acked)" -gt "$1" ] 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no update acknowledged above version $1 within $2 s"
    sleep 0.1
  done
}
# wait_until_workers_notice LOG_LINE_COUNT_BEFORE...: each worker has logged a failed
# request since, so every acknowledgement it received before the server went away is in
# its log.
wait_until_workers_notice() {
  local i
  for i in 0 1; do
    local deadline=$((SECONDS + 30))
    until tail -n "+$(( ${lines_before[$i]} + 1 ))" "$work/w$i.log" | grep -qE '(push|pull) failed'; do
      [ "$SECONDS" -lt "$deadline" ] || fail "worker $i did not notice the server was gone"
      sleep 0.1
    done
  done
}

wait_for_acks_above 100 40
lines_before=("$(wc -l <"$work/w0.log")" "$(wc -l <"$work/w1.log")")
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
wait_until_workers_notice
acked_before_crash=$(max_acked)
echo "killed the server (SIGKILL); highest acknowledged version: $acked_before_crash"

start_server "$work/server-2.log" --port "$port" "${server_args[@]}"
recovered_line=$(grep -E 'recovered from .*; version [0-9]+' "$work/server-2.log") || fail "no recovery line"
recovered=$(sed -nE 's/.*; version ([0-9]+)$/\1/p' <<<"$recovered_line")
echo "after SIGKILL: $recovered_line"
[ "$recovered" -ge "$acked_before_crash" ] ||
  fail "recovered version $recovered is behind the acknowledged version $acked_before_crash: updates were lost"
grep -qE 'checkpoint at version [1-9][0-9]*, [0-9]+ updates replayed' <<<"$recovered_line" ||
  fail "expected recovery from a checkpoint after version 0: $recovered_line"
if grep -qiE 'error' "$work/server-2.log"; then fail "errors in the log of the recovered server"; fi
wait_for_acks_above "$recovered" 40
echo "the same workers got updates accepted after the restart (version > $recovered)"

# A clean stop: the final checkpoint holds everything, nothing is left to replay.
lines_before=("$(wc -l <"$work/w0.log")" "$(wc -l <"$work/w1.log")")
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $? on SIGTERM"
stopped_at=$(sed -nE 's/.*writing a checkpoint at version ([0-9]+).*/\1/p' "$work/server-2.log")
[ -n "$stopped_at" ] || fail "no final checkpoint line"
wait_until_workers_notice
acked_before_stop=$(max_acked)
start_server "$work/server-3.log" --port "$port" "${server_args[@]}"
grep -qE "recovered from .*: checkpoint at version $stopped_at, 0 updates replayed from the WAL; version $stopped_at\$" \
  "$work/server-3.log" || fail "after SIGTERM the server should resume at its checkpoint $stopped_at with nothing to replay"
[ "$stopped_at" -ge "$acked_before_stop" ] ||
  fail "the checkpoint at $stopped_at is behind the acknowledged version $acked_before_stop"
wait_for_acks_above "$stopped_at" 40
echo "after SIGTERM: resumed at checkpoint $stopped_at; the workers got updates accepted again"

for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
for i in 0 1; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $?"
  # A server that lost acknowledged updates would hand out a version again.
  acked_versions "$work/w$i.log" | awk -v w="$i" 'NR > 1 && $1 <= prev { print "worker " w ": version " $1 " acknowledged after " prev; bad = 1 } { prev = $1 } END { exit bad }' ||
    fail "worker $i saw an acknowledged version repeat or go back"
  # Sparse pulls (the default) across both restarts: every model delta reproduced the
  # digest of the restarted server's parameters (the change record survived the replay).
  grep -qE 'pulls \([1-9][0-9]* as deltas\)' "$work/w$i.log" || fail "worker $i pulled no model delta"
  ! grep -qE 'did not reproduce|undecodable model delta|model delta from version' "$work/w$i.log" ||
    fail "worker $i got a model delta that did not give the server's parameters"
done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
echo "no acknowledged update lost across SIGKILL and SIGTERM restarts"

# Damaged checkpoints (issue 18). flip_byte FILE BYTES_FROM_END: one bit of that byte.
flip_byte() {
  local offset=$(( $(stat -c %s "$1") - $2 ))
  local value; value=$(od -An -tu1 -j "$offset" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $(( value ^ 64 )))" | dd of="$1" bs=1 seek="$offset" conv=notrunc status=none
}
final_at=$(sed -nE 's/.*writing a checkpoint at version ([0-9]+).*/\1/p' "$work/server-3.log")
[ -n "$final_at" ] || fail "no final checkpoint line of the third server"
# A flipped data byte: detected, and the server resumes at the same version from the
# previous checkpoint and the WAL.
flip_byte "$work/state/checkpoint.safetensors" 1000
start_server "$work/server-4.log" --port "$port" "${server_args[@]}"
grep -qF "$work/state/checkpoint.safetensors is damaged: checksum mismatch" "$work/server-4.log" ||
  fail "the damaged checkpoint was not reported"
grep -qE "recovered from .*: previous checkpoint at version [0-9]+, [0-9]+ updates replayed from the WAL; version $final_at\$" \
  "$work/server-4.log" || fail "the server did not resume at $final_at from the previous checkpoint"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
# Both checkpoints damaged: refused, naming the file, and nothing is served.
flip_byte "$work/state/checkpoint.safetensors" 1000
flip_byte "$work/state/checkpoint.prev.safetensors" 1000
if timeout 30 "$server" --listen 127.0.0.1 --port 0 "${server_args[@]}" >"$work/server-5.log" 2>&1; then
  fail "the server started from damaged checkpoints"
fi
grep -qF "$work/state/checkpoint.safetensors is damaged" "$work/server-5.log" || fail "the refusal does not name the file"
! grep -qE 'listening on' "$work/server-5.log" || fail "the server listened with damaged checkpoints"
echo "a damaged checkpoint: resumed at $final_at from the previous one; both damaged: refused"
