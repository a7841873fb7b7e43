#!/usr/bin/env bash
# Client-level differential privacy on real processes (issue 39): edgetrain-server --mode
# rounds --aggregation dp-fedavg with two workers over DTLS. Every round, all devices take
# part (q = 1) and the noise multiplier is 2, so ε at δ = 1e-5 is 2.17, 3.19, 4.01, 4.75 after
# 1 to 4 rounds (server/dp_accountant.h). With --dp-target-epsilon 4.4 the server closes
# three rounds, refuses the fourth, and ends the run by itself: exit status 0, the stats
# file's stop.condition "privacy", dp_budget_exhausted true, epsilon 4.01. Adaptive clipping
# is on (its count noise 10, so z_Δ = 2.01 and ε stays the accountant's for z = 2): the clip
# norm moves from 1 and round_clip.json in the state directory holds round 3's.
# usage: rounds_privacy.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for name in w1 w2; do add_device "$server" "$work/keys.toml" "$name" "$work/$name.toml"; done
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model mlp --lr 0.05 --mode rounds --round-policy wait-all --round-deadline 10 --local-steps 3 \
  --min-clients 2 --aggregation dp-fedavg --round-clip-norm 1 --dp-noise-multiplier 2 \
  --dp-expected-devices 2 --dp-target-epsilon 4.4 --dp-adaptive-clip-quantile 0.5 --dp-clip-count-stddev 10
workers=()
for name in w1 w2; do
  start_worker "$work/$name.log" "$work/$name.stats.json" "$worker" --config "$work/$name.toml" --mode rounds \
    --compressor none --server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --quiet \
    --duration 60 --give-up-after 5
  workers+=("$last_pid")
done
wait_for_exit "$server_pid" 60 || fail "the server did not end the run by itself (status $?)"
[ "$(json_get "$server_stats" stop.condition)" = privacy ] ||
  fail "the run stopped for: $(jq -c .stop "$server_stats")"
[ "$(json_get "$server_stats" rounds.rounds_closed)" = 3 ] ||
  fail "$(json_get "$server_stats" rounds.rounds_closed) rounds closed, 3 expected"
[ "$(json_get "$server_stats" rounds.dp_budget_exhausted)" = true ] || fail "the budget is not reported spent"
json_compare "$(json_get "$server_stats" rounds.dp_epsilon)" -gt 4.0 || fail "epsilon $(json_get "$server_stats" rounds.dp_epsilon)"
json_compare "$(json_get "$server_stats" rounds.dp_epsilon)" -lt 4.4 || fail "epsilon $(json_get "$server_stats" rounds.dp_epsilon)"
grep -q "privacy budget" "$work/server.log" || fail "the log does not say why the run ended"
clip=$(json_get "$server_stats" rounds.round_clip_norm)
[ "$(jq .round "$work/state/round_clip.json")" = 3 ] || fail "round_clip.json: $(cat "$work/state/round_clip.json")"
[ "$(jq .clip_norm "$work/state/round_clip.json")" = "$clip" ] ||
  fail "round_clip.json holds $(jq .clip_norm "$work/state/round_clip.json"), the stats file $clip"
[ "$clip" != 1 ] || fail "the adaptive clip norm did not move from 1"
for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait_for_exit "$pid" 30 || true; done
echo "PASS: 3 private rounds closed, epsilon $(json_get "$server_stats" rounds.dp_epsilon) at delta 1e-5, the fourth refused and the run ended (stop.condition privacy); adaptive clip norm now $clip"
