#!/usr/bin/env bash
# The simulator cannot drift silently (issue 13): a short fixed-seed run must give exactly
# the figures recorded in sim_determinism.expected.csv.
#   1. With the reference kernels (plain loops: the same bits on every x86-64 machine),
#      sim.csv equals the recorded file byte for byte.
#   2. With XNNPACK (whose micro-kernels depend on the CPU, so no recorded file), two runs
#      with the same seed give the same sim.csv, for the MLP and for the paper CNN.
# Usage: sim_determinism.sh EDGETRAIN_SIM RECORDED_CSV
# EDGETRAIN_RECORD=1 rewrites RECORDED_CSV instead of comparing: only for a change that
# is meant to change the figures, and the commit says why.
set -euo pipefail
sim="$1" recorded="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

# Every setting that shapes the run is written out, so that a changed default shows up as
# a deliberate edit here rather than as drift.
run() { # OUT_DIR EXTRA_FLAGS...
  local out="$1"; shift
  "$sim" --data mnist-small --workers 4 --batch 10 --lr 0.1 --rate 0.01 --max-staleness 64 --staleness sigma \
    --speed-spread 0.5 --compressor both --seed 11 --eval-every 100 --eval-examples 500 --quiet --out "$out" "$@" \
    >"$out.log" 2>&1 || fail "edgetrain-sim $* failed: $(tail -n 5 "$out.log")"
}

run "$work/reference" --model mlp --updates 300 --kernels reference
if [ "${EDGETRAIN_RECORD:-}" = 1 ]; then
  cp "$work/reference/sim.csv" "$recorded"
  echo "recorded $recorded"
  exit 0
fi
diff -u "$recorded" "$work/reference/sim.csv" ||
  fail "the fixed-seed reference run no longer gives its recorded figures (above: - recorded, + now). If the change is meant, re-record with EDGETRAIN_RECORD=1 and say why in the commit"

for model in mlp paper-cnn; do
  run "$work/$model-1" --model "$model" --updates 120 --kernels xnnpack
  run "$work/$model-2" --model "$model" --updates 120 --kernels xnnpack
  diff -u "$work/$model-1/sim.csv" "$work/$model-2/sim.csv" ||
    fail "two XNNPACK runs of $model with the same seed differ"
  [ "$(wc -l <"$work/$model-1/sim.csv")" -gt 2 ] || fail "the $model run wrote no curve"
done
echo "PASS: recorded figures reproduced; XNNPACK runs repeat exactly"
