#!/usr/bin/env bash
# Both directions of a device's traffic, in the simulator (issue 38's first goal; docs/results.md
# "Both directions"): MNIST, paper CNN, 10 workers, batch 10, lr 0.1, D = 256, a pull before
# every step (the setting of docs/results.md's methods table). Per seed, three runs:
#   asgd      dense updates and dense pulls (the baseline: --compressor none, the default pull)
#   cheap     AdaComp c = 0.01 with sign + scale values (the best option of the methods table)
#             and the cheap pull (--cheap "F:M[+entry][+fp16|+fp16inc]": --pull-fraction F
#             --pull-min-entries M, --entry-staleness with "+entry", --pull-values fp16 with
#             "+fp16", --pull-values fp16-increment with "+fp16inc"; server/replica_pull.h)
#   exact     the same AdaComp with exact pulls, the model delta since the worker's copy
#             (--delta-pulls)
# Each run stops at the target (--target, default 0.979: ASGD's mean best in this setting less
# 0.3 points, docs/results.md) or after --updates. Prints a markdown table per seed and run:
# upload (the encoded updates) and download (the pulls, every worker's first dense one
# included) to the first evaluation at the target, their total, and ASGD's total over it;
# then the means over the seeds (of each seed's ratio).
# --first-pull seeded gives the cheap and exact runs --first-pull seeded: every worker starts
# holding the seeded model (version 0) and its first pull is a delta from it (ASGD, the
# baseline, keeps its dense pulls).
# Resumable: a run whose sim.csv exists is not run again; --report-only runs nothing;
# --runs "asgd cheap" runs only those (the report still shows every run there is).
# --sim-args "..." adds these simulator flags to every run (e.g. a learning-rate schedule:
# "--lr-decay-at 3000,4500 --lr-decay-factor 0.5"); --tag T names the runs' directories
# NAME-T-sS instead of NAME-sS, so runs with other flags can share --out. --asgd-from DIR
# takes ASGD's runs for the ratios from DIR/asgd-sS (e.g. the constant-lr baseline) instead
# of this tag's own asgd runs (--report-only with and without it shows both comparisons).
# usage: experiments/both-directions.sh [--build DIR] [--out DIR] [--seeds "1 2 3"] [--updates N]
#                                       [--target 0.979] [--cheap "0.004:4096+entry+fp16"] [--jobs J]
#                                       [--runs "asgd cheap exact"] [--first-pull dense|seeded] [--report-only]
#                                       [--sim-args "FLAGS"] [--tag T] [--asgd-from DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=both-directions seeds="1 2 3" updates=6000 target=0.979
cheap="0.004:4096+entry" jobs=1 report_only=0 runs="asgd cheap exact" first_pull=dense
sim_args="" tag="" asgd_from=""
die() { echo "both-directions.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --seeds) seeds=${2:?}; shift ;;
    --updates) updates=${2:?}; shift ;;
    --target) target=${2:?}; shift ;;
    --cheap) cheap=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --runs) runs=${2:?}; shift ;;
    --first-pull) first_pull=${2:?}; shift ;;
    --report-only) report_only=1 ;;
    --sim-args) sim_args=${2?}; shift ;;
    --tag) tag=${2:?}; shift ;;
    --asgd-from) asgd_from=${2:?}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
[[ "$updates" =~ ^[1-9][0-9]*$ ]] || die "--updates must be a positive whole number, got '$updates'"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive whole number, got '$jobs'"
[[ "$target" =~ ^0?\.[0-9]+$ ]] || die "--target must be an accuracy in (0, 1), got '$target'"
[[ -z "$tag" || "$tag" =~ ^[A-Za-z0-9._]+$ ]] || die "--tag takes letters, digits, '.' and '_', got '$tag'"
[ -z "$asgd_from" ] || [ -d "$asgd_from" ] || die "--asgd-from: no directory '$asgd_from'"
read -r -a extra_args <<<"$sim_args"
run_dir() { echo "$1/$2${tag:+-$tag}-s$3"; }  # OUT NAME SEED
for r in $runs; do [[ "$r" =~ ^(asgd|cheap|exact)$ ]] || die "--runs takes asgd, cheap and exact, got '$r'"; done
entry_flag="" fp16_flag=""
spec=$cheap
[[ "$first_pull" =~ ^(dense|seeded)$ ]] || die "--first-pull takes dense or seeded, got '$first_pull'"
if [[ "$spec" == *+fp16 ]]; then spec=${spec%+fp16} fp16_flag=" --pull-values fp16"; fi
if [[ "$spec" == *+fp16inc ]]; then spec=${spec%+fp16inc} fp16_flag=" --pull-values fp16-increment"; fi
if [[ "$spec" == *+entry ]]; then spec=${spec%+entry} entry_flag=" --entry-staleness"; fi
[[ "$spec" =~ ^([0-9.]+):([1-9][0-9]*)$ ]] || die "--cheap must be F:M, then +entry and +fp16 or +fp16inc if wanted (in that order), got '$cheap'"
fraction=${BASH_REMATCH[1]} min_entries=${BASH_REMATCH[2]}
sim="$build/programs/edgetrain-sim"
[ "$report_only" = 1 ] || [ -x "$sim" ] || die "no $sim: build the host tree first (./build.sh build host -- edgetrain-sim)"
mkdir -p "$out"
base=(--data mnist --model paper-cnn --workers 10 --batch 10 --lr 0.1 --max-staleness 256
      --updates "$updates" --eval-every 250 --stop-at-accuracy "$target" --quiet)
adacomp="--compressor adacomp --rate 0.01 --sign-scale --first-pull $first_pull"
settings=("asgd|--compressor none"
          "cheap|$adacomp --pull-fraction $fraction --pull-min-entries $min_entries$entry_flag$fp16_flag"
          "exact|$adacomp --delta-pulls")

echo "Commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown): $sim ${base[*]}${sim_args:+ $sim_args} --seed S, and per run:" >&2
for s in "${settings[@]}"; do echo "  ${s%%|*}: ${s#*|}" >&2; done
running=0
for seed in $seeds; do
  for s in "${settings[@]}"; do
    name=${s%%|*} dir=$(run_dir "$out" "${s%%|*}" "$seed")
    [ -f "$dir/sim.csv" ] || [ "$report_only" = 1 ] && continue
    [[ " $runs " == *" $name "* ]] || continue
    read -r -a extra <<<"${s#*|}"
    echo "both-directions: $name, seed $seed" >&2
    ( "$sim" "${base[@]}" "${extra_args[@]}" "${extra[@]}" --seed "$seed" --out "$dir" >"$dir.log" 2>&1 ||
        echo "both-directions.sh: a run failed: $sim ${base[*]} ${extra_args[*]} ${extra[*]} --seed $seed (see $dir.log)" >&2 ) &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  done
done
wait
# sim.csv: method,updates,virtual_time,ingress_bytes,pull_bytes,test_accuracy,test_loss, read
# from the end of the row (the method's label may hold commas, in quotes).
to_target() {  # DIR -> "best updates upload download" at the first evaluation at the target, or "best never"
  awk -F, -v t="$target" 'NR > 1 { a = $(NF - 1); if (a > best) best = a
             if (!hit && a >= t) { hit = 1; u = $(NF - 5); up = $(NF - 3); down = $(NF - 2) } }
           END { if (hit) printf "%.4f %d %.0f %.0f\n", best, u, up, down; else printf "%.4f never\n", best }' "$1/sim.csv"
}
echo "ASGD / this: against ${asgd_from:-$out}/asgd${asgd_from:+}${asgd_from:-${tag:+-$tag}}-sS" >&2
echo "| run | seed | best acc % | updates to target | upload to target | download to target | both to target | ASGD / this (both) | ASGD / this (upload) |"
echo "|---|---|---|---|---|---|---|---|---|"
ratios=""
for s in "${settings[@]}"; do
  name=${s%%|*}
  for seed in $seeds; do
    dir=$(run_dir "$out" "$name" "$seed")
    [ -f "$dir/sim.csv" ] || { echo "| $name | $seed | (no run: $dir) | | | | | | |"; continue; }
    read -r best u up down < <(to_target "$dir")
    if [ "$u" = never ]; then
      awk -v n="$name" -v s="$seed" -v b="$best" 'BEGIN { printf "| %s | %s | %.2f | never | | | | | |\n", n, s, 100 * b }'
      continue
    fi
    ratio="" up_ratio=""
    baseline=$(run_dir "$out" asgd "$seed")
    [ -z "$asgd_from" ] || baseline="$asgd_from/asgd-s$seed"
    if [ -f "$baseline/sim.csv" ]; then
      read -r _ au aup adown < <(to_target "$baseline")
      if [ "$au" != never ]; then
        ratio=$(awk -v a=$((aup + adown)) -v b=$((up + down)) 'BEGIN { printf "%.1f", a / b }')
        up_ratio=$(awk -v a="$aup" -v b="$up" 'BEGIN { printf "%.1f", a / b }')
        ratios+="$name $seed $ratio $up_ratio $((up + down))"$'\n'
      fi
    fi
    awk -v n="$name" -v s="$seed" -v b="$best" -v u="$u" -v up="$up" -v down="$down" -v r="$ratio" -v ur="$up_ratio" 'BEGIN {
      printf "| %s | %s | %.2f | %d | %.1f MB | %.1f MB | %.1f MB | %s | %s |\n", n, s, 100 * b, u, up / 1e6, down / 1e6, (up + down) / 1e6, r == "" ? "–" : r "x", ur == "" ? "–" : ur "x" }'
  done
done
echo
echo "| run | seeds at the target | mean both to target | mean ASGD / this (both), per seed | mean ASGD / this (upload) |"
echo "|---|---|---|---|---|"
for s in "${settings[@]}"; do
  name=${s%%|*}
  printf '%s' "$ratios" | awk -v n="$name" '$1 == n { r += $3; ur += $4; b += $5; k++; seeds = seeds (k > 1 ? "," : "") $2 }
    END { if (k) printf "| %s | %s | %.1f MB | %.1fx | %.1fx |\n", n, seeds, b / k / 1e6, r / k, ur / k }'
done
