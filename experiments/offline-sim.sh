#!/usr/bin/env bash
# Devices reachable half of the time, in the simulator (issue 38 part 1's goal; the emulator's
# figures: experiments/offline-emulated.sh, docs/emulation-results.md): MNIST, paper CNN, 10
# workers, batch 10, lr 0.1, AdaComp c = 0.01, max staleness 20000 (an offline update is old),
# every worker's link down for half of every --period step times from step time 10 on (phases
# spread over the fleet: sim/README.md, "Devices reachable part of the time"). Per seed one run
# per variant, each stopping at --target:
#   idle             workers idle while their link is down (the paper's worker);
#   offline          they train offline (--offline-steps 100000: the windows bound them) and
#                    send the sum as one update at c x steps up to 0.25, which the server
#                    credits (--offline-step-credit 1000);
#   offline-average  the same with the server's --offline-average;
#   always-up        no outage (what the outages cost).
# Prints a markdown table: virtual time to the target (in mean step times), updates applied,
# offline updates applied / refused, bytes up, and the ratio idle / this per seed, then the
# means. Resumable: a run whose summary.json exists is not run again; --report-only prints
# the table of what is there. About 2-4 minutes of one core per run.
# usage: experiments/offline-sim.sh [--build DIR] [--out DIR] [--seeds "1 2 3"]
#                                   [--variants "idle offline-average"] [--target 0.97]
#                                   [--period 200] [--jobs J] [--report-only]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=offline-sim seeds="1 2 3" variants="idle offline offline-average"
target=0.97 period=200 jobs=1 report_only=0
die() { echo "offline-sim.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --seeds) seeds=${2:?}; shift ;;
    --variants) variants=${2:?}; shift ;;
    --target) target=${2:?}; shift ;;
    --period) period=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --report-only) report_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive whole number, got '$jobs'"
[[ "$target" =~ ^0?\.[0-9]+$ ]] || die "--target is an accuracy in (0, 1), got '$target'"
[[ "$period" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--period is a time in step times, got '$period'"
for v in $variants; do
  case "$v" in idle|offline|offline-average|always-up) ;;
    *) die "unknown variant '$v' (idle, offline, offline-average, always-up)" ;; esac
done
sim="$build/programs/edgetrain-sim"
[ "$report_only" = 1 ] || [ -x "$sim" ] || die "no $sim: build the host tree first (./build.sh build host -- edgetrain-sim)"
mkdir -p "$out"
base=(--data mnist --model paper-cnn --workers 10 --batch 10 --lr 0.1 --compressor adacomp --rate 0.01
      --max-staleness 20000 --updates 20000 --eval-every 100 --stop-at-accuracy "$target"
      --target-accuracy "$target" --quiet)
outage=(--reachable 0.5 --outage-period "$period" --outage-start 10)
offline=(--offline-steps 100000 --offline-max-rate 0.25 --offline-step-credit 1000)
args_of() {
  case "$1" in
    idle) echo "${outage[*]}" ;;
    offline) echo "${outage[*]} ${offline[*]}" ;;
    offline-average) echo "${outage[*]} ${offline[*]} --offline-average" ;;
    always-up) echo "" ;;
  esac
}
echo "Commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown): $sim ${base[*]} --seed S, and per variant:" >&2
for v in $variants; do echo "  $v: $(args_of "$v")" >&2; done
running=0
for seed in $seeds; do
  for v in $variants; do
    dir="$out/$v-s$seed"
    [ -f "$dir/summary.json" ] || [ "$report_only" = 1 ] && continue
    read -r -a extra <<<"$(args_of "$v")"
    echo "offline-sim: $v, seed $seed" >&2
    ( nice -n 10 "$sim" "${base[@]}" ${extra[@]+"${extra[@]}"} --seed "$seed" --out "$dir" >"$dir.log" 2>&1 ||
        echo "offline-sim.sh: a run failed: $sim ${base[*]} ${extra[*]} --seed $seed (see $dir.log)" >&2 ) &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  done
done
wait
/usr/bin/env python3 - "$out" "$target" "$seeds" "$variants" <<'EOF'
import json, os, sys
out, target, seeds, variants = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
def run(v, s):
    try:
        with open(os.path.join(out, f"{v}-s{s}", "summary.json")) as f:
            return json.load(f)["runs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
print(f"| variant | seed | best acc % | time to {target:.1%} | updates | offline updates applied / refused | offline steps | kept updates | up | idle / this |")
print("|---|---|---|---|---|---|---|---|---|---|")
ratios = {v: [] for v in variants}
for s in seeds:
    idle = run("idle", s)
    for v in variants:
        r = run(v, s)
        if r is None:
            print(f"| {v} | {s} | (no run: {out}/{v}-s{s}) | | | | | | | |")
            continue
        t = r.get("time_to_target")
        ratio = ""
        if t and idle and idle.get("time_to_target"):
            ratios[v].append(idle["time_to_target"] / t)
            ratio = f"{ratios[v][-1]:.2f}x"
        print(f"| {v} | {s} | {100 * r['best_accuracy']:.2f} | {'never' if t is None else f'{t:.0f}'} | "
              f"{r['updates_applied']} | {r['offline_updates_applied']} / {r['offline_updates_refused']} | "
              f"{r['offline_steps']} | {r['kept_updates']} | {r['ingress_bytes'] / 1e6:.1f} MB | {ratio} |")
print()
for v in variants:
    if ratios[v]:
        print(f"{v}: idle / this, time to {target:.1%}, mean over {len(ratios[v])} seed(s): "
              f"{sum(ratios[v]) / len(ratios[v]):.2f}x (per seed {', '.join(f'{x:.2f}x' for x in ratios[v])})")
EOF
