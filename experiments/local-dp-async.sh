#!/usr/bin/env bash
# Local differential privacy on asynchronous updates, in the simulator (issue 39 part 3;
# docs/privacy.md "Asynchronous AdaComp and gossip"): 10 workers, mnist-small, mlp, 3,000
# updates, dense ASGD and AdaComp c = 0.01, each step's gradient clipped to norm C and
# noised with z·C before compression (edgetrain-sim --local-dp-clip C
# --local-dp-noise-multiplier z); the final accuracy and each device's example-level ε at
# δ = 1e-5. Prints a markdown table (about 10 minutes on a shared 2-core machine).
# usage: experiments/local-dp-async.sh [--build DIR] [--out DIR] [--clips "1 0.1"] [--noise "0.3 1 3"]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=local-dp-async clips="1 0.1" noise="0.3 1 3"
die() { echo "local-dp-async.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --clips) clips=${2:?}; shift ;;
    --noise) noise=${2:?}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
sim="$build/programs/edgetrain-sim"
[ -x "$sim" ] || die "no $sim: build the host tree first (./build.sh build host)"
command -v jq >/dev/null || die "jq is needed (apt-get install jq)"
mkdir -p "$out"
base=(--data mnist-small --model mlp --workers 10 --updates 3000 --quiet)
echo "Commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown): $sim ${base[*]} [--local-dp-clip C [--local-dp-noise-multiplier z]]"
echo
echo "| local privacy | run | final accuracy | ε per device at δ = 1e-5 |"
echo "|---|---|---|---|"
run() {  # NAME DIR ARGS...
  local name=$1 dir=$2; shift 2
  echo "local-dp-async: $name" >&2
  [ -f "$dir/summary.json" ] || "$sim" "${base[@]}" "$@" --out "$dir" >/dev/null 2>"$dir.log" ||
    die "a run failed: $sim ${base[*]} $* (see $dir.log)"
  jq -r --arg n "$name" '.runs[] | "| \($n) | \(.label) | \(.final_accuracy * 10000 | round / 100)% | \(if (.local_dp_epsilon // 0) > 0 then (.local_dp_epsilon * 100 | round / 100 | tostring) else "∞" end) |"' "$dir/summary.json"
}
run "none" "$out/none"
for c in $clips; do
  run "clip $c, no noise" "$out/c$c" --local-dp-clip "$c"
  for z in $noise; do run "clip $c, z = $z" "$out/c$c-z$z" --local-dp-clip "$c" --local-dp-noise-multiplier "$z"; done
done
