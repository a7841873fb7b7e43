#!/usr/bin/env bash
# Robust rounds (issue 37): federated rounds with one malicious worker of 8 in the simulator,
# the plain mean (masked; on dense deltas it is FedAvg's weighted mean) against the robust
# rules (coordinate-wise trimmed mean, β = 0.2, and median) and per-device norm clipping,
# i.i.d. and label-skewed shards, over three seeds. The attacker trains as the others and
# sends its delta times −4 (scale:-4, a sign flip within every bound), times 10 (scale:10, a
# boosted delta) or with an output bias of 1e30 (bias:1e30, refused by the server's bound).
# Prints a markdown table (final test accuracy, mean ± sd over the seeds; deltas refused and
# clipped per run) and writes it with the commands to OUT/robust-rounds.md. About 3 minutes
# on a 2-core machine for the default mlp; --model paper-cnn takes about 15 times longer.
#
# usage: experiments/robust-rounds.sh [--build DIR] [--out DIR] [--model M] [--rounds N] [--seeds "1 2 3"]
#                                     [--clip TAU] [--attacks "none scale:-4 ..."] [--shards "iid label-skew"]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=robust-rounds model=mlp rounds=40 seeds="1 2 3" clip=1 shards="iid label-skew"
attacks=("none" "scale:-4" "scale:10" "bias:1e30")
die() { echo "robust-rounds.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --model) model=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --seeds) seeds=${2:?}; shift ;;
    --clip) clip=${2:?}; shift ;;
    --attacks) read -r -a attacks <<<"${2:?}"; shift ;;
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
base=(--mode rounds --data mnist-small --model "$model" --workers 8 --rounds "$rounds" --compressor none
      --round-policy wait-all --quiet)
defences=("masked" "trimmed-mean" "median" "masked clip")
table="$out/robust-rounds.md"
{
  echo "| shards | attack (worker 0 of 8) | defence | final accuracy (mean ± sd) | refused / clipped per run |"
  echo "|---|---|---|---|---|"
} >"$table.rows"
set -- $shards
total=$(( $# * ${#attacks[@]} * ${#defences[@]} )) done_count=0
for skew in $shards; do
  case "$skew" in iid|label-skew) ;; *) die "--shards: iid or label-skew, not '$skew'" ;; esac
  for attack in "${attacks[@]}"; do
    for defence in "${defences[@]}"; do
      done_count=$((done_count + 1))
      accuracies=() counts=""
      for seed in $seeds; do
        args=("${base[@]}" --seed "$seed")
        [ "$skew" = iid ] || args+=(--label-skew)
        [ "$attack" = none ] || args+=(--malicious-peers 1 --attack "$attack")
        case "$defence" in
          "masked clip") args+=(--aggregation masked --round-clip-norm "$clip") ;;
          *) args+=(--aggregation "$defence") ;;
        esac
        dir="$out/$skew-${attack//:/_}-${defence// /_}-seed$seed"
        [ -f "$dir/summary.json" ] || "$sim" "${args[@]}" --out "$dir" >/dev/null 2>"$dir.log" ||
          die "a run failed: $sim ${args[*]} (see $dir.log)"
        accuracies+=("$(jq '.runs[0].final_accuracy' "$dir/summary.json")")
        counts+="$(jq -r '.runs[0] | "\(.round_deltas_refused)/\(.round_deltas_clipped)"' "$dir/summary.json") "
      done
      stats=$(printf '%s\n' "${accuracies[@]}" | awk '{s+=$1; q+=$1*$1; n++} END {m=s/n; v=(n>1)?(q-n*m*m)/(n-1):0; if (v<0) v=0; printf "%.2f%% ± %.2f", 100*m, 100*sqrt(v)}')
      label=$defence; [ "$defence" != "masked clip" ] || label="masked + clip $clip"
      [ "$defence" != masked ] || label="masked (FedAvg)"
      echo "| $skew | $attack | $label | $stats | ${counts% } |" >>"$table.rows"
      printf '\r[%d/%d] %s %s %s: %s   ' "$done_count" "$total" "$skew" "$attack" "$defence" "$stats" >&2
    done
  done
done
echo >&2
{
  echo "Commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown); $sim ${base[*]} --seed S"
  echo "[--label-skew] [--malicious-peers 1 --attack A] --aggregation R [--round-clip-norm $clip], seeds $seeds."
  echo
  cat "$table.rows"
} >"$table"
rm -f "$table.rows"
cat "$table"
