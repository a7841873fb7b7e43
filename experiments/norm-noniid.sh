#!/usr/bin/env bash
# Normalization on non-i.i.d. shards (issue 35): federated rounds (FedAvg, dense deltas) in
# the simulator on label-skewed shards (each worker mostly 2 classes), one small conv net
# three ways: no normalization, group norm (the choice Hsieh et al., ICML 2020, recommend
# for non-i.i.d. data) and batch norm (running statistics recomputed by the evaluator,
# model/README.md "Normalization state"). Prints a markdown table (final and best test
# accuracy, mean ± sd over the seeds) and writes it with the commands to OUT/norm-noniid.md.
#
# usage: experiments/norm-noniid.sh [--build DIR] [--out DIR] [--data D] [--rounds N]
#                                   [--seeds "1 2 3"] [--shards "label-skew iid"]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=norm-noniid data=mnist rounds=30 seeds="1 2 3" shards="label-skew"
die() { echo "norm-noniid.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --data) data=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --seeds) seeds=${2:?}; shift ;;
    --shards) shards=${2:?}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
sim="$build/programs/edgetrain-sim"
[ -x "$sim" ] || die "no $sim: build the host tree first (./build.sh build host)"
command -v jq >/dev/null || die "jq is needed (apt-get install jq)"
mkdir -p "$out"
# The same conv net; only the layer after each conv differs.
declare -A models=(
  [none]="input 28x28x1; conv 16 3x3 same relu; maxpool 2; conv 32 3x3 same relu; maxpool 2; fc 10"
  [groupnorm]="input 28x28x1; conv 16 3x3 same; groupnorm 4 relu; maxpool 2; conv 32 3x3 same; groupnorm 8 relu; maxpool 2; fc 10"
  [batchnorm]="input 28x28x1; conv 16 3x3 same; batchnorm relu; maxpool 2; conv 32 3x3 same; batchnorm relu; maxpool 2; fc 10"
)
base=(--mode rounds --data "$data" --workers 10 --rounds "$rounds" --local-steps 20 --batch 10
      --compressor none --round-policy wait-all --eval-examples 2000 --quiet)
table="$out/norm-noniid.md"
{
  echo "| shards | normalization | final accuracy % (mean ± sd) | best % | seeds |"
  echo "|---|---|---|---|---|"
} >"$table.rows"
commands=()
for shard in $shards; do
  skew=()
  [ "$shard" = label-skew ] && skew=(--label-skew)
  for norm in none groupnorm batchnorm; do
    finals=() bests=()
    for seed in $seeds; do
      run="$out/$shard-$norm-$seed"
      cmd=("$sim" "${base[@]}" "${skew[@]}" --model "${models[$norm]}" --seed "$seed" --out "$run")
      commands+=("$(printf '%q ' "${cmd[@]}")")
      "${cmd[@]}" >"$run.log" 2>&1 || die "run failed: see $run.log"
      finals+=("$(jq '.runs[0].final_accuracy' "$run/summary.json")")
      bests+=("$(jq '.runs[0].best_accuracy' "$run/summary.json")")
    done
    stats=$(printf '%s\n' "${finals[@]}" | awk '{s+=$1; q+=$1*$1; n++} END {m=s/n; v=(n>1)?(q-n*m*m)/(n-1):0; if (v<0) v=0; printf "%.1f ± %.1f", 100*m, 100*sqrt(v)}')
    best=$(printf '%s\n' "${bests[@]}" | awk '{s+=$1; n++} END {printf "%.1f", 100*s/n}')
    echo "| $shard | $norm | $stats | $best | $seeds |" >>"$table.rows"
  done
done
{
  echo "# Normalization on non-i.i.d. shards"
  echo
  echo "Commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown); $rounds rounds of FedAvg (dense deltas, wait-all),"
  echo "10 workers, 20 local steps of batch 10, test accuracy on 2,000 test examples."
  echo
  cat "$table.rows"
  echo
  echo "Commands:"
  echo
  echo '```sh'
  printf '%s\n' "${commands[@]}"
  echo '```'
} >"$table"
rm -f "$table.rows"
cat "$table"
