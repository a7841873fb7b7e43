#!/usr/bin/env bash
# A sharded server (server/README.md, "Sharded server"): three edgetrain-server --shard I/3
# processes on loopback, each with its own state directory, and two workers with --shards.
# Shard 1 is killed with SIGKILL mid-run and restarted on its state directory while the
# workers keep going. Checks: no acknowledged update is lost on any shard (each shard's
# recovered and final version is at least the highest version it acknowledged, which the
# workers' --stats-file records per shard as shard_versions), the workers get updates
# accepted by the restarted shard, a shard started with another --shard on a state
# directory is refused, and the checkpoints of the three shards put together cover the whole
# model with finite parameters. Before that: --shards settings the worker refuses.
# usage: shard_crash_recovery.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done

# The worker's --shards settings that cannot work: exit status 2 (bad settings) and why.
worker_refuses() {  # PATTERN ARGS...
  local pattern="$1" out status=0; shift
  out=$("$worker" --config "$work/w0.toml" --model mlp --data mnist-small "$@" 2>&1) || status=$?
  [ "$status" -eq 2 ] && grep -qF -- "$pattern" <<<"$out" || fail "worker $*: status $status, not 2 with '$pattern': $out"
}
worker_refuses "give either --server or --shards, not both" --server coaps://127.0.0.1:5684 --shards coaps://127.0.0.1:5684
worker_refuses "an empty URI (shard 1)" --shards coaps://127.0.0.1:5684,,coaps://127.0.0.1:5685
worker_refuses "--shards works with --mode async only, not rounds" --shards coaps://127.0.0.1:5684 --mode rounds
worker_refuses "mixes coaps:// and coap:// URIs" --shards coaps://127.0.0.1:5684,coap://127.0.0.1:5685
shard_args() { echo --state-dir "$work/state-$1" --keystore "$work/keys.toml" --model mlp --checkpoint-every 1000 --shard "$1/3"; }
ports=() pids=() stats=()
for s in 0 1 2; do
  # shellcheck disable=SC2046
  start_server "$server" "$work/shard-$s-1.log" --port 0 $(shard_args "$s")
  ports+=("$server_port") pids+=("$server_pid") stats+=("$server_stats")
done
uris="coaps://127.0.0.1:${ports[0]},coaps://127.0.0.1:${ports[1]},coaps://127.0.0.1:${ports[2]}"

worker_pids=()
worker_stats=("$work/w0.stats.json" "$work/w1.stats.json")
for i in 0 1; do
  # The configuration's server line is overridden by --shards.
  start_worker "$work/w$i.log" "${worker_stats[$i]}" "$worker" --config "$work/w$i.toml" \
    --shards "$uris" --model mlp --data mnist-small --worker-id "$i" --workers 2 --quiet --duration 60
  worker_pids+=("$last_pid")
done

# acked_by_shard S: the highest version shard S acknowledged to any worker (0 before any).
acked_by_shard() {
  local v highest=0 f
  for f in "${worker_stats[@]}"; do
    v=$(json_get "$f" "shard_versions.$1" 2>/dev/null) || continue
    [ "${v:-0}" -gt "$highest" ] && highest=$v
  done
  echo "$highest"
}
wait_for_shard_acks_above() {  # SHARD VERSION SECONDS
  local deadline=$((SECONDS + $3))
  until [ "$(acked_by_shard "$1")" -gt "$2" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "shard $1 acknowledged nothing above version $2 within $3 s"
    sleep 0.2
  done
}

wait_for_shard_acks_above 1 60 30
kill -KILL "${pids[1]}"
wait "${pids[1]}" 2>/dev/null || true
sleep 1  # a worker rewrites its stats within 0.2 s of an acknowledgement
acked_before_crash=$(acked_by_shard 1)
echo "killed shard 1 (SIGKILL); the highest version it acknowledged: $acked_before_crash"

# Another shard count on its state directory is refused before anything changes.
# shellcheck disable=SC2046
if timeout 30 "$server" --listen 127.0.0.1 --port 0 $(shard_args 1 | sed 's|1/3|1/2|') >"$work/wrong-shard.log" 2>&1; then
  fail "a shard started with --shard 1/2 on a state directory of shard 1/3"
fi
grep -q "holds a run of another model" "$work/wrong-shard.log" || fail "the refusal does not say why: $(cat "$work/wrong-shard.log")"

# shellcheck disable=SC2046
start_server "$server" "$work/shard-1-2.log" --port "${ports[1]}" $(shard_args 1)
pids[1]=$server_pid stats[1]=$server_stats
recovered=$(json_get "${stats[1]}" recovery.version)
echo "shard 1 recovered at version $recovered ($(json_get "${stats[1]}" recovery.replayed_updates) updates replayed)"
[ "$(json_get "${stats[1]}" recovery.fresh)" = false ] || fail "shard 1 started fresh instead of recovering"
# No checkpoint since version 0 (--checkpoint-every 1000): everything came back from its WAL.
[ "$(json_get "${stats[1]}" recovery.replayed_updates)" -eq "$recovered" ] && [ "$recovered" -gt 0 ] ||
  fail "shard 1 should have replayed its $recovered updates from the WAL: $(json_get "${stats[1]}" recovery | tr '\n' ' ')"
[ "$recovered" -ge "$acked_before_crash" ] ||
  fail "shard 1 recovered at $recovered, behind the version $acked_before_crash it acknowledged: updates were lost"
if grep -qiE 'error' "$work/shard-1-2.log"; then fail "errors in the log of the recovered shard"; fi
wait_for_shard_acks_above 1 "$recovered" 30
echo "the same workers got updates accepted by the restarted shard (version > $recovered)"

for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
for i in 0 1; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $?"
  [ "$(json_get "${worker_stats[$i]}" state)" = stopped ] || fail "worker $i did not write its final stats"
  [ "$(json_get "${worker_stats[$i]}" delta_mismatches)" -eq 0 ] ||
    fail "worker $i got a model that did not reproduce the shards' digests"
done
for s in 0 1 2; do
  acked=$(acked_by_shard "$s")
  kill -TERM "${pids[$s]}"
  wait_for_exit "${pids[$s]}" 30 || fail "shard $s exited with status $?"
  final=$(json_get "${stats[$s]}" version)
  echo "shard $s: final version $final, highest acknowledged $acked"
  [ "$final" -ge "$acked" ] || fail "shard $s ended at $final, behind the version $acked it acknowledged"
done

# The three final checkpoints together: every tensor of the model covered once, in order,
# every parameter finite.
python3 - "$work"/state-{0,1,2}/checkpoint.safetensors <<'PY' || fail "the shards' checkpoints do not assemble into a finite model"
import json, math, re, struct, sys
covered = {}
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    tensors = sorted((v["data_offsets"][0], k, v) for k, v in header.items() if k != "__metadata__")
    for _, name, info in tensors:
        m = re.fullmatch(r"(.+)\[(\d+):(\d+)\]", name)
        assert m, f"{path}: tensor {name} is not a piece"
        start, end = int(m.group(2)), int(m.group(3))
        assert covered.get(m.group(1), 0) == start, f"{name} does not continue where the last shard ended"
        covered[m.group(1)] = end
        a, b = info["data_offsets"]
        values = struct.unpack(f"<{(b - a) // 4}f", data[8 + n + a:8 + n + b])
        assert len(values) == end - start and all(math.isfinite(v) for v in values), f"{name}: not finite"
print("assembled", sum(covered.values()), "finite parameters from", len(covered), "tensors")
PY
echo "no acknowledged update lost on any shard across a SIGKILL restart"
