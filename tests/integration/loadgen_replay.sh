#!/usr/bin/env bash
# `edgetrain-loadgen load --replay` end to end (issue 17): tests/bench/record_updates.sh
# records the WAL of a short run of a real server and two real workers (paper CNN,
# mnist-small); the load generator posts those updates to a fresh server, once as recorded
# and once re-encoded as sign + scale, then synthetic sign + scale updates, and every post
# must be applied (its summary line: none refused or unanswered; the server's stats file:
# the version reached equals the posts acknowledged). Then the recorded updates through a
# sharded server (two `--shard I/2` processes, `load --shard-ports`): every update cut into
# the shards' parts as the worker cuts it, none refused, and each shard's version equals the
# updates sent (every update makes a version on every shard). Before that, the inputs it
# must refuse with exit status 2 and a message: a missing file, an empty one, a log without
# updates, a log damaged in the middle, a log of another model, --rate with --replay, and
# for a sharded server --port with --shard-ports or a --shard-pids list of another length.
# usage: loadgen_replay.sh BUILD_DIR (a tree with the server, the worker and the load generator)
build="$1"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
server=$build/programs/edgetrain-server
loadgen=$build/tests/edgetrain-loadgen
record=$(dirname "$0")/../bench/record_updates.sh

# expect_refused LABEL PATTERN LOADGEN-LOAD-ARGS...: exit status 2 and PATTERN in the message.
# No server listens on the port: the log must be refused before any network work.
expect_refused() {
  local label="$1" pattern="$2" status=0 out; shift 2
  out=$("$loadgen" load --port 9 --keystore "$work/no-keys.toml" "$@" 2>&1) || status=$?
  [ "$status" -eq 2 ] || fail "$label: exit status $status, not 2: $out"
  grep -q -- "$pattern" <<<"$out" || fail "$label: the message does not say '$pattern': $out"
  echo "ok: $label refused (2): $out"
}
expect_refused "a missing log" "no such file" --replay "$work/missing.wal"
: >"$work/empty.wal"
expect_refused "an empty file" "empty" --replay "$work/empty.wal"
expect_refused "--rate with --replay" "drop one" --replay "$work/missing.wal" --rate 0.02
expect_refused "--port with --shard-ports" "drop one" --shard-ports 9 10
status=0
out=$("$loadgen" load --shard-ports 9 10 --shard-pids 1 --keystore "$work/no-keys.toml" 2>&1) || status=$?
[ "$status" -eq 2 ] && grep -q "one per shard" <<<"$out" || fail "--shard-pids of another length: exit status $status: $out"
echo "ok: --shard-pids of another length refused (2): $out"

EDGETRAIN_BUILD="$build" bash "$record" --seconds 6 --workers 2 --data mnist-small "$work/recorded.wal" \
  >"$work/record.log" 2>&1 || { cat "$work/record.log"; fail "record_updates.sh failed"; }
grep '^recorded' "$work/record.log"

head -c 32 "$work/recorded.wal" >"$work/header-only.wal"
expect_refused "a log without updates" "no updates" --replay "$work/header-only.wal"
# A flipped byte in the first record's body (after its 8 bytes of length and CRC): its CRC
# fails and intact records follow, which the WAL reader reports as damage in the middle.
cp "$work/recorded.wal" "$work/damaged.wal"
byte=$(od -An -tu1 -j 60 -N 1 "$work/damaged.wal" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 0xff)))" | dd of="$work/damaged.wal" bs=1 seek=60 conv=notrunc status=none
expect_refused "a damaged log" "damaged" --replay "$work/damaged.wal"
expect_refused "a log of another model" "another model" --replay "$work/recorded.wal" --model mlp

"$loadgen" keystore --out "$work/keys.toml" --devices 4 >/dev/null
# load_run LABEL SOURCE ARGS...: a fresh server (the load devices' sequence numbers start at
# 1 in every run), a few posts from SOURCE (replay or synthetic); sets $summary.
load_run() {
  local label="$1" source="$2"; shift 2
  rm -rf "$work/state"
  start_server "$server" "$work/server-$label.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
    --model paper-cnn --eval-data none
  timeout 60 "$loadgen" load --port "$server_port" --keystore "$work/keys.toml" --devices 4 --posts-in-flight 4 \
    --max-posts 24 --seconds 15 "$@" >"$work/load-$label.out" 2>&1 || { cat "$work/load-$label.out"; fail "$label: the load generator failed"; }
  summary=$(grep '^summary load' "$work/load-$label.out") || { cat "$work/load-$label.out"; fail "$label: no summary line"; }
  echo "$label: $summary"
  [ "$(field source)" = "$source" ] || fail "$label: source is not $source"
  [ "$source" != replay ] || [ "$(field records)" -gt 0 ] || fail "$label: no records"
  [ "$(field applied)" -gt 0 ] || fail "$label: nothing applied"
  [ "$(field refused)" -eq 0 ] && [ "$(field unanswered)" -eq 0 ] || fail "$label: posts refused or unanswered"
  wait_for_json "$server_stats" version = "$(field applied)" 10 "$server_pid" ||
    fail "$label: the server's version is $(json_get "$server_stats" version), not the $(field applied) posts acknowledged"
  kill -TERM "$server_pid"
  wait_for_exit "$server_pid" 30 || fail "$label: the server exited with status $?"
}
field() { grep -o " $1=[^ ]*" <<<"$summary" | head -1 | cut -d= -f2; }

load_run as-recorded replay --replay "$work/recorded.wal"
[ "$(field values)" = fp32 ] || fail "the workers sent fp32 values, the replay posted $(field values)"
recorded_bytes=$(field update_bytes)
load_run sign-scale replay --replay "$work/recorded.wal" --sign-scale
[ "$(field values)" = sign-scale ] || fail "--sign-scale posted $(field values) values"
# Indices stay, each 4-byte value becomes a bit: well under half the bytes.
[ "$(field update_bytes)" -lt $((recorded_bytes / 2)) ] ||
  fail "sign + scale updates of $(field update_bytes) B against $recorded_bytes B as recorded"
echo "ok: replayed updates applied, as recorded ($recorded_bytes B) and as sign + scale ($(field update_bytes) B)"
load_run synthetic-sign-scale synthetic --sign-scale
[ "$(field values)" = sign-scale ] || fail "synthetic --sign-scale posted $(field values) values"
echo "ok: synthetic sign + scale updates ($(field update_bytes) B) applied"

# The recorded updates through a sharded server: two shard processes of paper-cnn, a session
# per device and shard, each update cut by the worker's ShardedUpdateSplitter.
shard_pids=() shard_ports=() shard_stats=()
for i in 0 1; do
  rm -rf "$work/shard-state-$i"
  start_server "$server" "$work/shard-$i.log" --port 0 --state-dir "$work/shard-state-$i" --keystore "$work/keys.toml" \
    --model paper-cnn --eval-data none --shard "$i/2"
  shard_pids+=("$server_pid") shard_ports+=("$server_port") shard_stats+=("$server_stats")
done
timeout 60 "$loadgen" load --shard-ports "${shard_ports[@]}" --shard-pids "${shard_pids[@]}" --keystore "$work/keys.toml" \
  --devices 4 --posts-in-flight 4 --max-posts 24 --seconds 15 --replay "$work/recorded.wal" >"$work/load-sharded.out" 2>&1 ||
  { cat "$work/load-sharded.out"; fail "sharded: the load generator failed"; }
summary=$(grep '^summary load' "$work/load-sharded.out") || { cat "$work/load-sharded.out"; fail "sharded: no summary line"; }
echo "sharded: $summary"
[ "$(field shards)" -eq 2 ] && [ "$(field established)" -eq 8 ] || fail "sharded: not 2 shards with 4 devices' 8 sessions"
[ "$(field applied)" -gt 0 ] && [ "$(field refused)" -eq 0 ] && [ "$(field unanswered)" -eq 0 ] ||
  fail "sharded: nothing applied, or updates refused or unanswered"
[ "$(field sent)" -eq "$(field applied)" ] || fail "sharded: $(field sent) updates sent, $(field applied) acknowledged"
[ "$(field shard_acknowledged)" = "$(field sent)/$(field sent)" ] || fail "sharded: parts acknowledged $(field shard_acknowledged)"
for i in 0 1; do
  wait_for_json "${shard_stats[$i]}" version = "$(field sent)" 10 "${shard_pids[$i]}" ||
    fail "sharded: shard $i's version is $(json_get "${shard_stats[$i]}" version), not the $(field sent) updates sent"
  kill -TERM "${shard_pids[$i]}"
  wait_for_exit "${shard_pids[$i]}" 30 || fail "sharded: shard $i exited with status $?"
done
echo "ok: a sharded server of 2 shards made one version per update sent on each shard ($(field sent))"
