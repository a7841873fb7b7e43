#!/usr/bin/env bash
# Damage in the middle of the WAL is not a torn tail (issue 18): a worker trains, the server
# is killed (SIGKILL) with acknowledged updates after its last checkpoint, and one byte of
# the first WAL record after that checkpoint is flipped. Checks: the restarted server
# refuses to start (non-zero exit, no port), names the record's byte offset, and leaves
# wal.log byte for byte as it was; `repair-wal` lists the damage (exit 3) and changes
# nothing; `repair-wal --skip-damaged` (exit 0) keeps the damaged file as wal.log.damaged;
# the server then resumes at least at the highest acknowledged version (above the damaged
# record's), replaying every record after the checkpoint.
# usage: server_wal_damage.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

add_device "$server" "$work/keys.toml" w0 "$work/w0.toml"
# D = 8: the WAL after a checkpoint starts with only 8 records of history.
server_args=(--state-dir "$work/state" --keystore "$work/keys.toml" --model mlp --checkpoint-every 100 --max-staleness 8)
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
start_worker "$work/w0.log" "$work/w0.stats.json" "$worker" --config "$work/w0.toml" \
  --server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --quiet --duration 60
worker_pid=$last_pid
# Kill when the last acknowledged version is 10..80 past a checkpoint (every 100): then the
# WAL holds acknowledged records after the first one past the checkpoint.
deadline=$((SECONDS + 40))
until acked=$(highest_acknowledged "$work/w0.stats.json") && [ "$acked" -gt 100 ] &&
    [ $((acked % 100)) -ge 10 ] && [ $((acked % 100)) -le 80 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "no update acknowledged 10..80 past a checkpoint above version 100 within 40 s"
  sleep 0.1
done
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
kill -TERM "$worker_pid"
wait_for_exit "$worker_pid" 30 || fail "the worker exited with status $?"
acked=$(highest_acknowledged "$work/w0.stats.json")

# The checkpoint's version (its safetensors metadata), then the WAL record right after it:
# header 32 bytes; each record u32 body length, u32 CRC, body (u64 version first). One od
# per record (u32 length, CRC, version low and high words), until that version.
wal="$work/state/wal.log"
checkpoint=$(grep -aoE '"edgetrain\.version" *: *"[0-9]+"' "$work/state/checkpoint.safetensors" | head -n1 | tr -dc '0-9')
[ "$acked" -ge $((checkpoint + 2)) ] ||
  fail "no acknowledged update after the first one after the checkpoint at $checkpoint (acked $acked)"
size=$(stat -c %s "$wal") offset=32 damaged_offset=
while [ "$offset" -lt "$size" ] && [ -z "$damaged_offset" ]; do
  read -r length _ version high < <(od -An -tu4 -j "$offset" -N16 "$wal")
  [ "$high" -eq 0 ] && [ "$version" -eq $((checkpoint + 1)) ] && damaged_offset=$offset
  offset=$((offset + 8 + length))
done
[ -n "$damaged_offset" ] || fail "no WAL record for version $((checkpoint + 1))"
flip_at=$((damaged_offset + 8 + 20))
value=$(od -An -tu1 -j "$flip_at" -N1 "$wal" | tr -d ' ')
printf "$(printf '\\%03o' $(( value ^ 64 )))" | dd of="$wal" bs=1 seek="$flip_at" conv=notrunc status=none
cp "$wal" "$work/wal.damaged-copy"
echo "acknowledged up to $acked; flipped a byte of the record of version $((checkpoint + 1)) at byte $damaged_offset" \
  "(checkpoint $checkpoint)"

rm -f "$work/server-2.port"
if timeout 30 "$server" --listen 127.0.0.1 --port 0 --port-file "$work/server-2.port" "${server_args[@]}" \
    >"$work/server-2.log" 2>&1; then
  fail "the server started past a damaged WAL record"
fi
[ ! -e "$work/server-2.port" ] || fail "the server bound its port with a damaged WAL"
grep -qF "record at byte $damaged_offset" "$work/server-2.log" || fail "the refusal does not name the damaged record"
cmp -s "$wal" "$work/wal.damaged-copy" || fail "the refused recovery changed wal.log"

status=0
"$server" repair-wal --state-dir "$work/state" >"$work/repair-list.txt" 2>&1 || status=$?
[ "$status" -eq 3 ] || fail "repair-wal without a choice exited with $status, not 3 (damage found)"
cmp -s "$wal" "$work/wal.damaged-copy" || fail "repair-wal without a choice changed wal.log"
"$server" repair-wal --state-dir "$work/state" --skip-damaged >"$work/repair.txt" 2>&1 ||
  fail "repair-wal --skip-damaged exited with $?"
cmp -s "$work/state/wal.log.damaged" "$work/wal.damaged-copy" || fail "the damaged file was not kept as wal.log.damaged"
"$server" repair-wal --state-dir "$work/state" >/dev/null 2>&1 || fail "repair-wal still finds damage after the repair"

start_server "$server" "$work/server-3.log" --port 0 "${server_args[@]}"
recovered=$(json_get "$server_stats" recovery.version)
[ "$recovered" -ge "$acked" ] || fail "recovered version $recovered, but $acked were acknowledged"
[ "$(json_get "$server_stats" recovery.replayed_updates)" -eq $((recovered - checkpoint)) ] ||
  fail "not every record after the checkpoint was replayed: $(json_get "$server_stats" recovery | tr '\n' ' ')"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
echo "a damaged WAL record: refused with every file untouched; after repair-wal --skip-damaged resumed at $recovered"
