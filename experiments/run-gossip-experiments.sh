#!/usr/bin/env bash
# The first gossip experiment (issue 15 part 7; sim/README.md "Gossip"): the paper CNN on
# full MNIST, 16 peers in four speed classes (relative CPU budgets 0.12, 0.08, 0.05, 0.03,
# peer i in class i mod 4), on a ring and on a random 4-regular graph: vanilla D-PSGD,
# AD-PSGD, D-PSGD with workload balancing, with balancing and accuracy-aware training,
# compressed D-PSGD (publish fraction 0.01), and D-PSGD dense and compressed with training
# while waiting (--wait-steps 16). Every run has the same virtual time budget, so
# runs that waste less time at barriers do more iterations in it. Runs that finished
# (summary.md present) are skipped, so an interrupted regeneration resumes; the table of
# all runs goes to OUT/gossip-results.md (time and bytes per peer to the target accuracy of
# the mean peer, final mean / spread / consensus accuracy).
#
# usage: experiments/run-gossip-experiments.sh [--build DIR] [--out DIR] [--jobs N] [--budget T] [--target A]
#                                      [--data NAME] [--peers N] [--quick] [--list]
#   --build DIR   host build tree with programs/edgetrain-sim (default build/host)
#   --out DIR     where the runs go (default gossip-results)
#   --jobs N      runs side by side (default 1: the runs are timed by a virtual clock, but
#                 the machine is often shared)
#   --budget T    virtual time budget per run, in mean step times of the fastest class (default 2000)
#   --target A    accuracy for the time and bytes columns (default 0.97)
#   --data NAME   mnist (default) or fashion-mnist (then choose --target, e.g. 0.85)
#   --peers N     peers (default 16; with four speed classes, a multiple of 4)
#   --quick       mlp on mnist-small, 8 peers, budget 200 (a smoke test of the script)
#   --list        print the commands, run nothing
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=gossip-results jobs=1 budget=2000 target=0.97 quick=0 list=0 data=mnist peers=16
die() { echo "run-gossip-experiments.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --budget) budget=${2:?}; shift ;;
    --target) target=${2:?}; shift ;;
    --data) data=${2:?}; shift ;;
    --peers) peers=${2:?}; shift ;;
    --quick) quick=1 ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive number"
sim="$build/programs/edgetrain-sim"
[ -x "$sim" ] || [ "$list" = 1 ] || die "build the host tree first: $sim is missing"

if [ "$quick" = 1 ]; then
  base=(--mode gossip --data mnist-small --model mlp --workers 8 --eval-every 25 --eval-examples 500)
  budget=200 target=0.85
else
  base=(--mode gossip --data "$data" --model paper-cnn --workers "$peers" --eval-every 25 --eval-examples 1000)
fi
# Ours: batch 10 and lr 0.1 (the AdaComp paper's worker), balancing to 2 step times per
# iteration (the fastest class then trains batches of 20, the slowest of 5), plateau patience 3
# validations every 25 iterations, at most 2 lr halvings.
base+=(--batch 10 --lr 0.1 --speed-classes 0.12,0.08,0.05,0.03 --seed 1 --iterations 1000000
       --time-budget "$budget" --target-accuracy "$target" --quiet)
balance=(--balance-target 2)
aware=(--plateau-patience 3 --validate-every 25)
# Training while waiting: up to 16 more local steps per iteration at the barrier.
wait=(--wait-steps 16)

runs=()
for topology in ring random-regular; do
  t=(--topology "$topology")
  runs+=("$topology-dpsgd|${t[*]} --gossip d-psgd"
         "$topology-adpsgd|${t[*]} --gossip ad-psgd"
         "$topology-balance|${t[*]} --gossip d-psgd ${balance[*]}"
         "$topology-balance-aware|${t[*]} --gossip d-psgd ${balance[*]} ${aware[*]}"
         "$topology-compressed|${t[*]} --gossip d-psgd --publish-fraction 0.01"
         "$topology-wait|${t[*]} --gossip d-psgd ${wait[*]}"
         "$topology-compressed-wait|${t[*]} --gossip d-psgd --publish-fraction 0.01 ${wait[*]}")
done

run_one() {
  local name="$1" settings="$2"
  [ -s "$out/$name/summary.md" ] && return 0
  mkdir -p "$out/$name"
  # shellcheck disable=SC2086  # the settings are words
  if "$sim" "${base[@]}" $settings --out "$out/$name" >"$out/$name/run.log" 2>&1; then
    echo "done: $name"
  else
    echo "FAILED: $name (see $out/$name/run.log)" >&2
    return 1
  fi
}

for entry in "${runs[@]}"; do
  if [ "$list" = 1 ]; then echo "${entry%%|*}: $sim ${base[*]} ${entry#*|}"; fi
done
[ "$list" = 1 ] && exit 0
mkdir -p "$out"
git -C "$repo" rev-parse --short HEAD >"$out/commit" 2>/dev/null || true
failed=0
for entry in "${runs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
  run_one "${entry%%|*}" "${entry#*|}" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done

python3 - "$out" "$target" "${runs[@]}" >"$out/gossip-results.md" <<'PY'
import csv, os, sys
out, target, entries = sys.argv[1], float(sys.argv[2]), sys.argv[3:]

def size(b):
    for unit in ["B", "kB", "MB", "GB"]:
        if b < 1000:
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.2f} {unit}"
        b /= 1000
    return f"{b:.2f} TB"

def percent(row, key):
    return f"{float(row[key]) * 100:.2f}%"

def first(rows, key):
    return next((r for r in rows if float(r[key]) >= target), None)

print(f"target accuracy (mean peer): {target * 100:.1f}%; time in mean step times of the fastest class (virtual)\n")
print("| run | iterations | virtual time | mean acc | peers min-max | consensus acc | time to target | "
      "consensus time to target | bytes/peer to target | bytes/peer | local steps |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for entry in entries:
    name = entry.split("|")[0]
    path = os.path.join(out, name, "sim.csv")
    if not os.path.exists(path):
        print(f"| {name} | not run | | | | | | | | | |")
        continue
    rows = list(csv.DictReader(open(path)))
    last, reached, consensus = rows[-1], first(rows, "mean_accuracy"), first(rows, "consensus_accuracy")
    cells = [name, f"{float(last['mean_iterations']):.0f}", f"{float(last['virtual_time']):.0f}",
             percent(last, "mean_accuracy"),
             f"{float(last['min_accuracy']) * 100:.2f}-{float(last['max_accuracy']) * 100:.2f}%",
             percent(last, "consensus_accuracy"),
             f"{float(reached['virtual_time']):.0f}" if reached else "never",
             f"{float(consensus['virtual_time']):.0f}" if consensus else "never",
             size(float(reached["bytes_per_peer"])) if reached else "never",
             size(float(last["bytes_per_peer"])), last["local_steps"]]
    print("| " + " | ".join(cells) + " |")
PY
# Plots: per topology, the mean peer's test accuracy against virtual time and against the
# bytes a peer sent, one line per variant (edgetrain-emulation-report plot draws them).
report="$build/programs/edgetrain-emulation-report"
mkdir -p "$out/figures"
for topology in ring random-regular; do
  for axis in time bytes; do
    csv="$out/figures/gossip-$topology-accuracy-vs-$axis.csv"
    echo "series,x,y" >"$csv"
    for variant in dpsgd adpsgd balance balance-aware compressed; do
      [ -s "$out/$topology-$variant/sim.csv" ] || continue
      # sim.csv: method,virtual_time,mean_iterations,bytes_per_peer,mean_accuracy,...
      awk -F, -v name="$variant" -v axis="$axis" 'NR > 1 {
          n = split($0, f, ",")  # the method is quoted and may hold commas: count from the end
          x = (axis == "time") ? f[n - 9] : f[n - 7]; if (x > 0) print name "," x "," f[n - 6] }' \
        "$out/$topology-$variant/sim.csv" >>"$csv"
    done
    if [ "$axis" = time ]; then
      x_label="virtual time (mean step times of the fastest class)"; log=()
    else
      x_label="bytes a peer sent (mean over the peers)"; log=(--log-x)
    fi
    [ ! -x "$report" ] || "$report" plot "$csv" --out "${csv%.csv}.svg" ${log[@]+"${log[@]}"} --y-min 0.8 \
      --reference-y "$target" --x-label "$x_label" --y-label "mean peer test accuracy" \
      --title "$peers peers, $topology, four speed classes, paper CNN, $data"
  done
done
cat "$out/gossip-results.md"
exit "$failed"
