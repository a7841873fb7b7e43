#!/usr/bin/env bash
# Federated rounds against a device with a valid identity that posts poisoned deltas
# (issue 37 part 1). On the code before the fix, a delta of ±1e30 was acknowledged and then
# stalled every close (refused by the parameter bound, retried forever) and one of ±3.4e38
# overflowed when scaled and ended the server, on every restart too, since both were in the
# round log. Now: each is refused with 4.22 before it is logged, the honest worker's rounds
# keep closing, the server's stats count the refusals, and a restart starts cleanly. The
# server runs the robust options too (--aggregation median, --round-clip-norm 50): a delta
# of ±100, within the bound, is taken (2.04), clipped and counted, and the rounds go on.
# usage: rounds_bad_delta.sh SERVER WORKER ROUND_DELTA_CLIENT
server="$1"; worker="$2"; client="$3"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for name in honest evil; do add_device "$server" "$work/keys.toml" "$name" "$work/$name.toml"; done
server_args=(--state-dir "$work/state" --keystore "$work/keys.toml" --model mlp --lr 0.05 --mode rounds
             --round-policy drop-stragglers --round-deadline 2 --local-steps 5
             --aggregation median --round-clip-norm 50)
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
start_worker "$work/honest.log" "$work/honest.stats.json" "$worker" --config "$work/honest.toml" --mode rounds \
  --compressor none --server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --quiet --duration 60
worker_pid=$last_pid
wait_for_json "$server_stats" rounds.rounds_closed -ge 1 30 "$server_pid" || fail "no round closed"

"$client" "$server_port" "$work/keys.toml" evil mlp 422 1e30 -3.4e38 1e30 ||
  fail "a poisoned delta was not refused with 4.22"
kill -0 "$server_pid" 2>/dev/null || fail "the server died"
[ "$(json_get "$server_stats" rounds.round_deltas_refused_values)" -ge 3 ] ||
  wait_for_json "$server_stats" rounds.round_deltas_refused_values -ge 3 5 "$server_pid" ||
  fail "the refusals are not counted in the stats file"
[ "$(json_get "$server_stats" rounds.round_aggregation)" = median ] || fail "the server does not say it takes the median"
"$client" "$server_port" "$work/keys.toml" evil mlp 204 100 || fail "a delta of ±100 (within the bound) was not taken"
wait_for_json "$server_stats" rounds.round_deltas_clipped -ge 1 10 "$server_pid" ||
  fail "the ±100 delta was not clipped: $(jq -c .rounds "$server_stats")"
closed=$(json_get "$server_stats" rounds.rounds_closed)
wait_for_json "$server_stats" rounds.rounds_closed -ge $((closed + 2)) 30 "$server_pid" ||
  fail "rounds stopped closing after the poisoned deltas"
[ "$(jq '.devices_refused.evil.refused["out of bounds"]' "$server_stats")" -ge 3 ] ||
  fail "the device's refusals are not in devices_refused: $(jq -c .devices_refused "$server_stats")"

kill -TERM "$worker_pid" "$server_pid"
wait_for_exit "$worker_pid" 30 || true
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
start_server "$server" "$work/server-2.log" --port 0 "${server_args[@]}"
# Only the honest device's delta of the open round, if any, comes back from rounds.wal.
[ "$(json_get "$server_stats" rounds.round_deltas_received)" -le 1 ] || fail "a refused delta came back after the restart"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the restarted server exited with status $?"
echo "PASS: 3 poisoned deltas refused with 4.22, one of ±100 clipped, rounds went on ($(json_get "$server_stats" rounds.rounds_closed) closed in all), the restart was clean"
