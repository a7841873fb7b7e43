#!/usr/bin/env bash
# DP-FedAvg in the simulator (issue 39; docs/privacy.md): full MNIST split over K devices
# (100, 1,000, 10,000), a share q of them per round, the mlp model, each selected device 1
# local epoch of batch 10 (at most 60 steps) from the round's model, deltas clipped to norm 1,
# with no noise and with noise multipliers z; the final test accuracy and ε at δ = 1e-5 after
# the rounds. Prints a markdown table and writes it with the commands to OUT/dp-rounds.md.
# --clips lists the clipping of each run: a number is a fixed clip norm, aN adaptive clipping
# from N towards the median norm (--dp-adaptive-clip-quantile 0.5, the other settings their
# defaults; runs with noise only, as the server allows it with dp-fedavg only).
# --survivors lists who adds the noise of each noised run: 0 the server (central), c > 0 the
# devices, each its share z·S/√c, quantized to the ring as under --secure-aggregation with
# --min-clients c (the simulator's --dp-noise-survivors; with adaptive clipping the count is
# the devices' too).
#
# usage: experiments/dp-rounds.sh [--build DIR] [--out DIR] [--rounds N] [--noise "0.5 1"] [--fleets "100:0.1 1000:0.1 10000:0.03"] [--clips "1"] [--survivors "0"]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=dp-rounds rounds=100 noise="0.5 1" fleets="100:0.1 1000:0.1 10000:0.03" clips=1 survivors=0
die() { echo "dp-rounds.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --noise) noise=${2:?}; shift ;;
    --fleets) fleets=${2:?}; shift ;;
    --clips) clips=${2:?}; shift ;;
    --survivors) survivors=${2:?}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
sim="$build/programs/edgetrain-sim"
[ -x "$sim" ] || die "no $sim: build the host tree first (./build.sh build host)"
command -v jq >/dev/null || die "jq is needed (apt-get install jq)"
mkdir -p "$out"
base=(--mode rounds --data mnist --model mlp --rounds "$rounds" --compressor none --round-policy wait-all
      --local-epochs 1 --quiet)
rows="| devices K | per round q (m = qK) | noise z | clip norm (first → last) | ε at δ = 1e-5 | final accuracy | best accuracy |
|---|---|---|---|---|---|---|"
for fleet in $fleets; do
  k=${fleet%%:*} q=${fleet#*:}
  for z in 0 $noise; do
   for clip in $clips; do
   for c in $survivors; do
    [ "$c" = 0 ] || [ "$z" != 0 ] || continue
    args=("${base[@]}" --workers "$k" --client-fraction "$q")
    if [ "${clip#a}" != "$clip" ]; then
      [ "$z" != 0 ] || continue
      args+=(--round-clip-norm "${clip#a}" --dp-adaptive-clip-quantile 0.5)
    else
      args+=(--round-clip-norm "$clip")
    fi
    [ "$z" = 0 ] || args+=(--aggregation dp-fedavg --dp-noise-multiplier "$z")
    [ "$c" = 0 ] || args+=(--dp-noise-survivors "$c")
    dir="$out/k$k-q$q-z$z"
    [ "$clip" = 1 ] || dir="$dir-c$clip"
    [ "$c" = 0 ] || dir="$dir-d$c"
    echo "dp-rounds: K=$k q=$q z=$z clip $clip" >&2
    [ -f "$dir/summary.json" ] || "$sim" "${args[@]}" --out "$dir" >/dev/null 2>"$dir.log" ||
      die "a run failed: $sim ${args[*]} (see $dir.log)"
    read -r final best epsilon last_clip < <(jq -r '.runs[0] | "\(.final_accuracy) \(.best_accuracy) \(.dp_epsilon_by_round[-1] // "∞") \(.clip_norm_by_round[-1] // "-")"' "$dir/summary.json")
    clip_text=$clip
    [ "$last_clip" = - ] || clip_text="adaptive: ${clip#a} → $(awk -v c="$last_clip" 'BEGIN { printf "%.3g", c }')"
    m=$(awk -v k="$k" -v q="$q" 'BEGIN { printf "%d", k * q + 0.5 }')
    noise_text=$z epsilon_text=$epsilon
    [ "$z" != 0 ] || noise_text="– (clipped only)"
    [ "$c" = 0 ] || noise_text="$z (distributed, c = $c)"
    [ "$epsilon" = "∞" ] || epsilon_text=$(awk -v e="$epsilon" 'BEGIN { printf "%.3g", e }')
    rows+="
| $k | $q ($m) | $noise_text | $clip_text | $epsilon_text | $(awk -v a="$final" 'BEGIN { printf "%.2f%%", 100 * a }') | $(awk -v a="$best" 'BEGIN { printf "%.2f%%", 100 * a }') |"
   done
   done
  done
done
{
  echo "Commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown) (the runs: see each directory's summary.json): $sim ${base[*]} --workers K --client-fraction q --round-clip-norm S [--dp-adaptive-clip-quantile 0.5] [--aggregation dp-fedavg --dp-noise-multiplier z [--dp-noise-survivors c]]"
  echo
  echo "$rows"
} >"$out/dp-rounds.md"
cat "$out/dp-rounds.md"
