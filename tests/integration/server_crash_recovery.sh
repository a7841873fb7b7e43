#!/usr/bin/env bash
# The server is killed with SIGKILL mid-run, restarted on the same state directory, then
# stopped with SIGTERM and restarted again, while the same two worker processes keep going.
# Checks: no acknowledged update is lost (the recovered version is at least every version a
# worker got in a 2.04, and each worker's acknowledged versions keep increasing over the
# whole run), recovery is clean (the restarted server's --stats-file: recovery from a
# checkpoint, replayed the WAL, no error in its log), and the workers reconnect and get
# updates accepted after each restart. Versions come from the workers' --stats-file. Then a
# flipped byte in the checkpoint: the server resumes at the same version from the previous
# checkpoint; in both checkpoints: refused.
# usage: server_crash_recovery.sh SERVER WORKER [SERVER FLAGS...] (e.g. --loop-threads 2:
# the same checks with two event loops; which loop each worker's session lands on is the
# kernel's hash of its address and port; with --entry-staleness also that σ per entry was
# used and that its WAL is refused without the flag)
server="$1"; worker="$2"; shift 2
extra_server_flags=("$@")
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
# Checkpoints every 40 updates: the kill lands after a few, so recovery loads a checkpoint
# and replays the WAL records after it.
server_args=(--state-dir "$work/state" --keystore "$work/keys.toml" --model mlp --checkpoint-every 40
             ${extra_server_flags[@]+"${extra_server_flags[@]}"})
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
if [[ " ${extra_server_flags[*]-} " == *" --loop-threads 2 "* ]]; then
  grep -q "), 2 event-loop threads," "$work/server-1.log" || fail "the server does not say it runs 2 event loops"
fi
port=$server_port

worker_pids=()
worker_stats=("$work/w0.stats.json" "$work/w1.stats.json")
for i in 0 1; do
  start_worker "$work/w$i.log" "${worker_stats[$i]}" "$worker" --config "$work/w$i.toml" \
    --server "coaps://127.0.0.1:$port" --model mlp --data mnist-small --worker-id "$i" --workers 2 --quiet --duration 80
  worker_pids+=("$last_pid")
done

max_acked() { highest_acknowledged "${worker_stats[@]}"; }
# wait_for_acks_above VERSION SECONDS: until some worker got an acknowledgement above VERSION.
wait_for_acks_above() {
  local deadline=$((SECONDS + $2))
  until [ "$(max_acked)" -gt "$1" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no update acknowledged above version $1 within $2 s"
    sleep 0.2
  done
}
# settle_worker_stats: once the server is dead no 2.04 can arrive, and a worker rewrites its
# stats file within 0.2 s of its last acknowledgement: after a second every acknowledgement
# received before the server went away is in the files.
settle_worker_stats() { sleep 1; }

wait_for_acks_above 100 40
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
settle_worker_stats
acked_before_crash=$(max_acked)
echo "killed the server (SIGKILL); highest acknowledged version: $acked_before_crash"

start_server "$server" "$work/server-2.log" --port "$port" "${server_args[@]}"
recovery() { json_get "$server_stats" "recovery.$1"; }
recovered=$(recovery version)
echo "after SIGKILL: recovered version $recovered (checkpoint at version $(recovery checkpoint_version)," \
  "$(recovery replayed_updates) updates replayed, $(recovery dropped_wal_bytes) WAL bytes dropped)"
[ "$recovered" -ge "$acked_before_crash" ] ||
  fail "recovered version $recovered is behind the acknowledged version $acked_before_crash: updates were lost"
[ "$(recovery fresh)" = false ] && [ "$(recovery checkpoint_version)" -gt 0 ] && [ "$(recovery replayed_updates)" -ge 0 ] ||
  fail "expected recovery from a checkpoint after version 0: $(json_get "$server_stats" recovery | tr '\n' ' ')"
[ "$(recovery checkpoint_version)" -eq $((recovered - $(recovery replayed_updates))) ] ||
  fail "the checkpoint and the replayed updates do not add up to the recovered version"
if grep -qiE 'error' "$work/server-2.log"; then fail "errors in the log of the recovered server"; fi
wait_for_acks_above "$recovered" 40
echo "the same workers got updates accepted after the restart (version > $recovered)"

# A clean stop: the final checkpoint holds everything, nothing is left to replay.
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $? on SIGTERM"
[ "$(json_get "$server_stats" state)" = stopped ] || fail "no final stats (written after the final checkpoint)"
stopped_at=$(json_get "$server_stats" version)
settle_worker_stats
acked_before_stop=$(max_acked)
start_server "$server" "$work/server-3.log" --port "$port" "${server_args[@]}"
[ "$(recovery checkpoint_version)" -eq "$stopped_at" ] && [ "$(recovery replayed_updates)" -eq 0 ] &&
  [ "$(recovery version)" -eq "$stopped_at" ] ||
  fail "after SIGTERM the server should resume at its checkpoint $stopped_at with nothing to replay: $(json_get "$server_stats" recovery | tr '\n' ' ')"
[ "$stopped_at" -ge "$acked_before_stop" ] ||
  fail "the checkpoint at $stopped_at is behind the acknowledged version $acked_before_stop"
wait_for_acks_above "$stopped_at" 40
echo "after SIGTERM: resumed at checkpoint $stopped_at; the workers got updates accepted again"

for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
for i in 0 1; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $?"
  stats="${worker_stats[$i]}"
  [ "$(json_get "$stats" state)" = stopped ] || fail "worker $i did not write its final stats"
  # A server that lost acknowledged updates would hand out a version again.
  problem=$(acknowledged_versions "$stats" | strictly_increasing) ||
    fail "worker $i saw an acknowledged version repeat or go back: $problem"
  [ "$(acknowledged_versions "$stats" | wc -l)" -eq "$(json_get "$stats" updates_accepted)" ] ||
    fail "worker $i: its acknowledged versions do not match its count of accepted updates"
  # Sparse pulls (the default) across both restarts: every model delta reproduced the
  # digest of the restarted server's parameters (the change record survived the replay).
  [ "$(json_get "$stats" delta_pulls)" -gt 0 ] || fail "worker $i pulled no model delta"
  [ "$(json_get "$stats" delta_mismatches)" -eq 0 ] ||
    fail "worker $i got a model delta that did not give the server's parameters"
done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
echo "no acknowledged update lost across SIGKILL and SIGTERM restarts"

# σ per entry (--pull-fraction F --entry-staleness among the flags): the updates used the
# records of the workers' copies, and the WAL, whose header says so, is refused by a server
# started without the flag (replay would give other parameters).
if [[ " ${extra_server_flags[*]-} " == *" --entry-staleness "* ]]; then
  [ "$(json_get "$server_stats" cheap_pull.entry_sigma_updates)" -gt 0 ] ||
    fail "no update of the last server was given σ per entry: $(json_get "$server_stats" cheap_pull | tr '\n' ' ')"
  without=()
  for flag in "${server_args[@]}"; do [ "$flag" = --entry-staleness ] || without+=("$flag"); done
  if timeout 30 "$server" --listen 127.0.0.1 --port 0 "${without[@]}" >"$work/server-without.log" 2>&1; then
    fail "a server without --entry-staleness started on a WAL written with it"
  fi
  grep -qF -- "--entry-staleness" "$work/server-without.log" ||
    fail "the refusal does not name --entry-staleness: $(tail -n 3 "$work/server-without.log")"
  echo "σ per entry: $(json_get "$server_stats" cheap_pull.entry_sigma_updates) updates of the last server;" \
    "without --entry-staleness the state is refused"
fi

# Damaged checkpoints (issue 18). flip_byte FILE BYTES_FROM_END: one bit of that byte.
flip_byte() {
  local offset=$(( $(stat -c %s "$1") - $2 ))
  local value; value=$(od -An -tu1 -j "$offset" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $(( value ^ 64 )))" | dd of="$1" bs=1 seek="$offset" conv=notrunc status=none
}
[ "$(json_get "$server_stats" state)" = stopped ] || fail "no final stats of the third server"
final_at=$(json_get "$server_stats" version)
# A flipped data byte: detected, and the server resumes at the same version from the
# previous checkpoint and the WAL (its stats file's recovery object says which).
flip_byte "$work/state/checkpoint.safetensors" 1000
start_server "$server" "$work/server-4.log" --port "$port" "${server_args[@]}"
grep -qF "$work/state/checkpoint.safetensors is damaged" "$work/server-4.log" ||
  fail "the damaged checkpoint was not reported to the operator"
[ "$(recovery used_previous_checkpoint)" = true ] || fail "recovery did not use the previous checkpoint"
[ "$(recovery version)" = "$final_at" ] ||
  fail "the server did not resume at $final_at from the previous checkpoint: $(json_get "$server_stats" recovery | tr '\n' ' ')"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
# Both checkpoints damaged: refused (non-zero exit), naming the file, and no port is ever
# reported.
flip_byte "$work/state/checkpoint.safetensors" 1000
flip_byte "$work/state/checkpoint.prev.safetensors" 1000
rm -f "$work/server-5.port"
if timeout 30 "$server" --listen 127.0.0.1 --port 0 --port-file "$work/server-5.port" "${server_args[@]}" \
    >"$work/server-5.log" 2>&1; then
  fail "the server started from damaged checkpoints"
fi
grep -qF "$work/state/checkpoint.safetensors is damaged" "$work/server-5.log" || fail "the refusal does not name the file"
[ ! -e "$work/server-5.port" ] || fail "the server bound its port with damaged checkpoints"
echo "a damaged checkpoint: resumed at $final_at from the previous one; both damaged: refused"
