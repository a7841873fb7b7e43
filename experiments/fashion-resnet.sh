#!/usr/bin/env bash
# Issue 35's Fashion-MNIST goal in the simulator (docs/results.md, "Fashion-MNIST with a
# residual network"): a built-in residual network (resnet-8 by default), 10 asynchronous
# workers, batch 10, dense ASGD (--compressor none) and AdaComp c = 0.01, the same seeds,
# every evaluation on the 10,000 test images. One edgetrain-sim process per (method, seed),
# --jobs at a time under nice 10. Prints a markdown table per run (best, final, mean of the
# last three evaluations, the update of the best, the rise over the last two evaluations: is
# the curve still climbing), the means, and the payload ratio: ASGD's ingress until it first
# reaches the target divided by AdaComp's, seed by seed, where the target is ASGD's mean best
# accuracy less 0.3 points (as docs/results.md's tables count it).
# Ours, from short trials (docs/results.md says which): lr 0.1 (the server's, with the
# staleness rule), D = 256 (--max-staleness, as docs/results.md's matrix), 6,000 updates
# (one epoch: 6,000 updates of batch 10 are one pass over Fashion-MNIST's 60,000 images;
# what fitted in ~40 minutes of the shared 2-core machine, six runs at once).
# Resumable: a run whose sim.csv exists is not run again (a longer --updates needs a new --out);
# --report-only runs nothing and prints the tables of the runs there are.
# An evaluation on the 10,000 test images costs as much as ~200 training steps (2 s against
# 11 ms a step on this machine): keep --eval-every at 1000 or more. Each run's progress line
# (the last evaluation's accuracy every 100 updates) is in OUT/METHOD-sS.log.
# usage: experiments/fashion-resnet.sh [--build DIR] [--out DIR] [--seeds "1 2 3"] [--updates N]
#                                      [--eval-every N] [--lr LR] [--max-staleness D] [--model NAME]
#                                      [--jobs J] [--report-only]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=fashion-resnet seeds="1 2 3" updates=6000 eval_every=1000 lr=0.1
staleness=256 model=resnet-8 jobs=6 report_only=0
die() { echo "fashion-resnet.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --seeds) seeds=${2:?}; shift ;;
    --updates) updates=${2:?}; shift ;;
    --eval-every) eval_every=${2:?}; shift ;;
    --lr) lr=${2:?}; shift ;;
    --max-staleness) staleness=${2:?}; shift ;;
    --model) model=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --report-only) report_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
for n in updates eval_every staleness jobs; do
  [[ "${!n}" =~ ^[1-9][0-9]*$ ]] || die "--${n//_/-} must be a positive whole number, got '${!n}'"
done
[[ "$lr" =~ ^[0-9]*\.?[0-9]+$ ]] || die "--lr must be a positive number, got '$lr'"
[ -n "$seeds" ] || die "--seeds is empty"
sim="$build/programs/edgetrain-sim"
[ "$report_only" = 1 ] || [ -x "$sim" ] || die "no $sim: build the host tree first (./build.sh build host -- edgetrain-sim)"
mkdir -p "$out"
base=(--data fashion-mnist --model "$model" --workers 10 --batch 10 --lr "$lr" --max-staleness "$staleness"
      --updates "$updates" --eval-every "$eval_every" --eval-examples 0)
methods=("asgd|--compressor none" "adacomp|--compressor adacomp --rate 0.01")

echo "Commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown): nice -n 10 $sim ${base[*]} --seed S --out $out/METHOD-sS, and per method:" >&2
for m in "${methods[@]}"; do echo "  ${m%%|*}: ${m#*|}" >&2; done
start=$SECONDS running=0 total=0 done_count=0
for seed in $seeds; do for m in "${methods[@]}"; do
  [ -f "$out/${m%%|*}-s$seed/sim.csv" ] || total=$((total + 1))
done; done
[ "$report_only" = 1 ] && total=0
for seed in $seeds; do
  for m in "${methods[@]}"; do
    name=${m%%|*} dir="$out/${m%%|*}-s$seed"
    [ -f "$dir/sim.csv" ] || [ "$report_only" = 1 ] && continue
    read -r -a extra <<<"${m#*|}"
    echo "fashion-resnet: start $name seed $seed ($(( SECONDS - start )) s)" >&2
    ( t0=$SECONDS
      if nice -n 10 "$sim" "${base[@]}" "${extra[@]}" --seed "$seed" --out "$dir" >"$dir.log" 2>&1; then
        best=$(awk -F, 'NR > 1 && $(NF - 1) > b { b = $(NF - 1) } END { printf "%.2f", 100 * b }' "$dir/sim.csv")
        echo "fashion-resnet: done $name seed $seed in $(( SECONDS - t0 )) s, best $best %" >&2
      else
        echo "fashion-resnet.sh: a run failed: $sim ${base[*]} ${extra[*]} --seed $seed (see $dir.log)" >&2
      fi ) &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      wait -n || true; running=$((running - 1)); done_count=$((done_count + 1))
      echo "fashion-resnet: $done_count of $total runs finished ($(( SECONDS - start )) s)" >&2
    fi
  done
done
wait

# sim.csv: method,updates,virtual_time,ingress_bytes,pull_bytes,test_accuracy,test_loss; one
# row per evaluation (update 0 included). Counted from the end of the row: the method's label
# may hold commas (in quotes).
figures() {  # DIR -> "best final last3 best_at rise updates bytes_per_update"
  awk -F, 'NR > 1 { a = $(NF - 1); u = $(NF - 5); if (a > best) { best = a; at = u }
                    acc[n++] = a; last_u = u; bytes = $(NF - 3) }
           END { m = n < 3 ? n : 3; for (i = n - m; i < n; i++) s += acc[i]
                 rise = n >= 3 ? acc[n - 1] - acc[n - 3] : 0
                 printf "%.6f %.6f %.6f %d %.6f %d %.0f\n", best, acc[n - 1], s / m, at, rise, last_u, bytes / (last_u ? last_u : 1) }' "$1/sim.csv"
}
reach() {  # DIR TARGET -> "updates ingress_bytes" of the first evaluation at or above TARGET, or "never never"
  awk -F, -v t="$2" 'NR > 1 && $(NF - 1) >= t { printf "%d %.0f\n", $(NF - 5), $(NF - 3); found = 1; exit }
                     END { if (!found) print "never never" }' "$1/sim.csv"
}
asgd_bests=()
for seed in $seeds; do
  [ -f "$out/asgd-s$seed/sim.csv" ] && asgd_bests+=("$(figures "$out/asgd-s$seed" | cut -d' ' -f1)")
done
target=""
[ "${#asgd_bests[@]}" -gt 0 ] &&
  target=$(printf '%s\n' "${asgd_bests[@]}" | awk '{ s += $1; n++ } END { printf "%.6f", s / n - 0.003 }')
echo "Fashion-MNIST, $model, 10 workers, batch 10, lr $lr, D = $staleness, $updates updates per run ($(awk -v u="$updates" 'BEGIN { printf "%.2f", u / 6000 }') epochs), every evaluation on the 10,000 test images${target:+; target $(awk -v t="$target" 'BEGIN { printf "%.2f", 100 * t }') % (the mean of ASGD best accuracies less 0.3 points)}."
echo
echo "| method | seed | best acc % | at update | final acc % | mean of the last 3 evaluations % | last 2 evaluations' rise (points) | bytes / update | updates to target | ingress to target |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for m in "${methods[@]}"; do
  name=${m%%|*}
  for seed in $seeds; do
    dir="$out/$name-s$seed"
    [ -f "$dir/sim.csv" ] || { echo "| $name | $seed | (no run: $dir) | | | | | | | |"; continue; }
    read -r best final last3 at rise _ per_update < <(figures "$dir")
    read -r to_updates to_bytes < <([ -n "$target" ] && reach "$dir" "$target" || echo "never never")
    awk -v n="$name" -v s="$seed" -v b="$best" -v f="$final" -v l="$last3" -v at="$at" -v r="$rise" \
        -v p="$per_update" -v tu="$to_updates" -v tb="$to_bytes" 'BEGIN {
      printf "| %s | %s | %.2f | %d | %.2f | %.2f | %+.2f | %.1f kB | %s | %s |\n", n, s, 100 * b, at, 100 * f, 100 * l,
        100 * r, p / 1000, tu, tb == "never" ? "never" : sprintf("%.1f MB", tb / 1e6) }'
  done
done
echo
echo "| method | seeds | mean best acc % | mean final acc % | mean of the last 3 evaluations % | payload ratio ASGD / this to the target, per seed | mean ratio |"
echo "|---|---|---|---|---|---|---|"
for m in "${methods[@]}"; do
  name=${m%%|*}
  for seed in $seeds; do
    [ -f "$out/$name-s$seed/sim.csv" ] || continue
    read -r best final last3 _ < <(figures "$out/$name-s$seed")
    ratio=-
    if [ -n "$target" ] && [ -f "$out/asgd-s$seed/sim.csv" ]; then
      read -r _ mine < <(reach "$out/$name-s$seed" "$target")
      read -r _ asgd < <(reach "$out/asgd-s$seed" "$target")
      if [ "$mine" = never ]; then ratio=never
      elif [ "$asgd" != never ]; then ratio=$(awk -v a="$asgd" -v b="$mine" 'BEGIN { printf "%.1f", a / b }')
      fi
    fi
    echo "$best $final $last3 $seed $ratio"
  done | awk -v n="$name" '{ b += $1; f += $2; l += $3; k++; seeds = seeds (k > 1 ? "," : "") $4
                             ratios = ratios (k > 1 ? ", " : "") $5; if ($5 ~ /^[0-9.]+$/) { r += $5; rk++ } }
    END { if (k) printf "| %s | %s | %.2f | %.2f | %.2f | %s | %s |\n", n, seeds, 100 * b / k, 100 * f / k, 100 * l / k,
                        ratios, rk ? sprintf("%.1fx (%d of %d seeds)", r / rk, rk, k) : "–" }'
done
