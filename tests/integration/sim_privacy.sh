#!/usr/bin/env bash
# The simulator's client-level differential privacy (issue 39; sim/README.md): with
# --dp-target-epsilon the run stops before the round that would pass it, as the server does
# (z = 1, q = 0.1: epsilon 4.97 after 32 rounds, above 5 after 33, server/dp_accountant.h); with
# --dp-adaptive-clip-quantile the clip norm moves from --round-clip-norm towards the quantile
# (every delta of 3 local steps is far above 0.01, so it grows each round), both recorded in
# summary.json. --dp-noise-survivors (distributed noise) counts epsilon as central noise does;
# --dp-noise skellam (discrete) with the Skellam accountant.
# usage: sim_privacy.sh EDGETRAIN_SIM
sim="$1"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
data="$(basename "$mnist_dir")"
run="$sim --mode rounds --data $data --model mlp --workers 100 --client-fraction 0.1 --compressor none
  --round-policy wait-all --local-steps 3 --eval-every 10 --aggregation dp-fedavg --quiet"

$run --rounds 100 --round-clip-norm 1 --dp-noise-multiplier 1 --dp-target-epsilon 5 \
  --out "$work/target" >"$work/target.log" 2>&1 || fail "edgetrain-sim: $(tail -3 "$work/target.log")"
summary="$work/target/summary.json"
[ "$(jq '.runs[0].privacy_exhausted' "$summary")" = true ] || fail "the run did not stop at the target"
[ "$(jq '.runs[0].dp_epsilon_by_round | length' "$summary")" = 32 ] ||
  fail "$(jq '.runs[0].dp_epsilon_by_round | length' "$summary") rounds closed, 32 expected"
python3 -c 'import sys; e = float(sys.argv[1]); sys.exit(not 4.9 < e <= 5)' \
  "$(jq '.runs[0].dp_epsilon_by_round[-1]' "$summary")" || fail "epsilon $(jq '.runs[0].dp_epsilon_by_round[-1]' "$summary")"
echo "ok: stopped after 32 rounds at epsilon $(jq '.runs[0].dp_epsilon_by_round[-1]' "$summary") (target 5)"

$run --rounds 20 --round-clip-norm 0.01 --dp-noise-multiplier 0.5 --dp-adaptive-clip-quantile 0.5 \
  --out "$work/adaptive" >"$work/adaptive.log" 2>&1 || fail "edgetrain-sim: $(tail -3 "$work/adaptive.log")"
summary="$work/adaptive/summary.json"
first=$(jq '.runs[0].clip_norm_by_round[0]' "$summary")
last=$(jq '.runs[0].clip_norm_by_round[-1]' "$summary")
[ "$(jq '.runs[0].clip_norm_by_round | length' "$summary")" = 20 ] || fail "no clip norm per round"
python3 -c 'import sys; sys.exit(not (float(sys.argv[1]) == 0.01 and float(sys.argv[2]) > 0.05))' "$first" "$last" ||
  fail "the clip norm went from $first to $last"
echo "ok: the adaptive clip norm went from $first to $last in 20 rounds"
# The same under distributed noise (each worker's count share in the masked vector, as under
# the server's --secure-aggregation): the clip norm grows alike, epsilon is the central one's.
$run --rounds 20 --round-clip-norm 0.01 --dp-noise-multiplier 0.5 --dp-adaptive-clip-quantile 0.5 \
  --dp-noise-survivors 10 --out "$work/adaptive-distributed" >"$work/adaptive-distributed.log" 2>&1 ||
  fail "edgetrain-sim: $(tail -3 "$work/adaptive-distributed.log")"
last_distributed=$(jq '.runs[0].clip_norm_by_round[-1]' "$work/adaptive-distributed/summary.json")
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0.05)' "$last_distributed" ||
  fail "the distributed run's clip norm went to $last_distributed"
[ "$(jq -c '.runs[0].dp_epsilon_by_round' "$summary")" = \
  "$(jq -c '.runs[0].dp_epsilon_by_round' "$work/adaptive-distributed/summary.json")" ] || fail "epsilon differs"
echo "ok: with distributed noise the adaptive clip norm went from $first to $last_distributed"

status=0
$run --rounds 5 --round-clip-norm 1 --dp-noise-multiplier 2 --dp-adaptive-clip-quantile 0.5 \
  --out "$work/refused" >"$work/refused.log" 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "z/2" "$work/refused.log" ||
  fail "too little count noise was not refused (status $status): $(tail -2 "$work/refused.log")"
echo "ok: too little count noise refused"

# Distributed noise (secure aggregation's rule, --dp-noise-survivors): the same rounds and the
# same epsilon as central noise (the accountant counts z either way), a model that differs
# (the devices' shares are other draws), and refused without dp-fedavg.
for noise in central distributed; do
  extra=()
  [ "$noise" = central ] || extra=(--dp-noise-survivors 10)
  $run --rounds 5 --round-clip-norm 1 --dp-noise-multiplier 1 "${extra[@]}" --save-model "$work/$noise.ckpt" \
    --out "$work/$noise" >"$work/$noise.log" 2>&1 || fail "edgetrain-sim ($noise): $(tail -3 "$work/$noise.log")"
done
[ "$(jq -c '.runs[0].dp_epsilon_by_round' "$work/central/summary.json")" = \
  "$(jq -c '.runs[0].dp_epsilon_by_round' "$work/distributed/summary.json")" ] ||
  fail "epsilon differs: $(jq -c '.runs[0].dp_epsilon_by_round' "$work/distributed/summary.json")"
jq -e '.runs[0].label | test("distributed over 10")' "$work/distributed/summary.json" >/dev/null ||
  fail "the distributed run's label does not say so"
! cmp -s "$work/central.ckpt" "$work/distributed.ckpt" || fail "distributed noise left the model of central noise"
status=0
"$sim" --mode rounds --data "$data" --model mlp --workers 10 --rounds 2 --round-clip-norm 1 --dp-noise-survivors 10 --quiet --out "$work/d" >"$work/d.log" 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "dp-noise-survivors" "$work/d.log" || fail "--dp-noise-survivors without dp-fedavg was taken"
echo "ok: distributed noise: epsilon $(jq '.runs[0].dp_epsilon_by_round[-1]' "$work/distributed/summary.json") as central"

# Discrete noise (--dp-noise skellam, privacy/skellam.h): the same rounds; epsilon from the
# Skellam accountant (its bound through Zhu and Wang's subsampling bound), above the exact
# sampled Gaussian's but within 40% of it at this scale; refused without --dp-noise-survivors.
$run --rounds 5 --round-clip-norm 1 --dp-noise-multiplier 1 --dp-noise-survivors 10 --dp-noise skellam \
  --save-model "$work/skellam.ckpt" --out "$work/skellam" >"$work/skellam.log" 2>&1 ||
  fail "edgetrain-sim (skellam): $(tail -3 "$work/skellam.log")"
gaussian=$(jq '.runs[0].dp_epsilon_by_round[-1]' "$work/distributed/summary.json")
skellam=$(jq '.runs[0].dp_epsilon_by_round[-1]' "$work/skellam/summary.json")
[ "$(jq '.runs[0].dp_epsilon_by_round | length' "$work/skellam/summary.json")" = 5 ] || fail "not 5 rounds of skellam"
python3 -c 'import sys; g, s = map(float, sys.argv[1:]); sys.exit(not g < s < 1.4 * g)' "$gaussian" "$skellam" ||
  fail "skellam epsilon $skellam against the Gaussian's $gaussian"
jq -e '.runs[0].label | test("skellam")' "$work/skellam/summary.json" >/dev/null || fail "the skellam run's label does not say so"
! cmp -s "$work/distributed.ckpt" "$work/skellam.ckpt" || fail "skellam noise left the model of Gaussian noise"
status=0
$run --rounds 2 --round-clip-norm 1 --dp-noise-multiplier 1 --dp-noise skellam --out "$work/s" >"$work/s.log" 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "needs --dp-noise-survivors" "$work/s.log" || fail "--dp-noise skellam without survivors was taken"
echo "ok: skellam noise: epsilon $skellam (Gaussian $gaussian)"

# Local DP on asynchronous updates (issue 39 part 3, a measurement): the device's epsilon is
# reported, and the accountant's (q = 10/4000, z/2 = 0.5, about 100 steps: a few units).
"$sim" --data "$data" --model mlp --workers 2 --updates 200 --eval-every 100 --quiet --compressor none \
  --local-dp-clip 1 --local-dp-noise-multiplier 1 --out "$work/local" >"$work/local.log" 2>&1 ||
  fail "edgetrain-sim: $(tail -3 "$work/local.log")"
epsilon=$(jq '.runs[0].local_dp_epsilon' "$work/local/summary.json")
python3 -c 'import sys; e = float(sys.argv[1]); sys.exit(not 0 < e < 100)' "$epsilon" || fail "local epsilon $epsilon"
status=0
$run --rounds 2 --round-clip-norm 1 --dp-noise-multiplier 1 --local-dp-clip 1 --out "$work/r" >"$work/r.log" 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "for --mode async" "$work/r.log" || fail "--local-dp-clip was taken in rounds mode"
echo "PASS: local epsilon $epsilon"
