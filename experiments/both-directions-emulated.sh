#!/usr/bin/env bash
# Issue 38's first goal at the socket: a device's traffic both ways to ASGD's target, in the
# emulator (the simulator's figures: docs/results.md "Both directions"). Per seed, one
# edgetrain-emulate run per variant: the real edgetrain-server and WORKERS edgetrain-worker
# processes in network namespaces, each behind its link of edgetrain-link-impairer (no
# impairment, no CPU quota: a bytes goal), paper CNN, full MNIST (the server evaluates on the
# 10,000 test images every EVAL_INTERVAL s), batch 10, server lr 0.1, max staleness 256, a
# pull before every step; each run stops at TARGET (or after DURATION s). Variants:
#   asgd          dense updates and dense pulls: --compressor none --dense-pull
#                 --seeded-first-pull=false (the paper's ASGD, byte for byte);
#   cheap         AdaComp c = 0.01, sign + scale values, the server's cheap pull
#                 (--pull-fraction/--pull-min-entries of CHEAP, default 0.004:4096) and the
#                 seeded first pull (a delta from the model built from --seed, version 0);
#   cheap-dense-first   the same with a dense first pull (--seeded-first-pull=false);
#   exact         AdaComp c = 0.01, sign + scale, exact model deltas, the seeded first pull;
#   cheap-entry   cheap, and the server's σ per entry (--entry-staleness: each entry's σ
#                 counted from the version the worker's copy holds it since);
#   cheap-entry-fp16inc   cheap-entry, and the cheap pull's values as fp16 increments, the
#                 server's and the workers' --pull-values fp16-increment.
# The variants of a seed run side by side (PARALLEL=1), so they share the machine's load
# alike. Bytes are the impairer's counts (links.csv: up = what the workers sent,
# to_server_bytes_in; down = what reached them, to_worker_bytes_out): DTLS records, CoAP
# headers, retransmissions and handshakes included. They are read when the run stops, one
# evaluation at most after the crossing (at most EVAL_INTERVAL s of traffic more than "to
# target"; the same for every variant). Prints one markdown row per run and the ratios
# ASGD / this of its seed, with every run's command in OUT_DIR/commands.txt.
#
# usage: experiments/both-directions-emulated.sh OUT_DIR [SEED...]     (default seeds: 1)
#   environment: VARIANTS ("asgd cheap"), WORKERS (10), TARGET (0.979), DURATION (1800 s),
#   EVAL_INTERVAL (5 s), CHEAP (0.004:4096), MAX_STALENESS (256), REQUEST_TIMEOUT (30 s),
#   PARALLEL (1), BUILD_DIR (build/host), LR_DECAY_AT ("": a constant lr; e.g. 3000,4500:
#   every variant's server multiplies its lr by LR_DECAY_FACTOR, 0.5, from those versions on,
#   --lr-decay-at); SUMMARIZE_ONLY=1 prints OUT_DIR's table again.
#   Needs root (namespaces), and ./build.sh build host -- edgetrain-server edgetrain-worker
#   edgetrain-link-impairer edgetrain-emulation-report edgetrain-fleet-eval.
set -euo pipefail
out="${1:?usage: experiments/both-directions-emulated.sh OUT_DIR [SEED...]}"; shift
seeds=("$@"); [ "${#seeds[@]}" -gt 0 ] || seeds=(1)
repo=$(cd "$(dirname "$0")/.." && pwd)
variants=(${VARIANTS:-asgd cheap}); workers="${WORKERS:-10}"; target="${TARGET:-0.979}"
duration="${DURATION:-1800}"; eval_interval="${EVAL_INTERVAL:-5}"; cheap="${CHEAP:-0.004:4096}"
max_staleness="${MAX_STALENESS:-256}"; request_timeout="${REQUEST_TIMEOUT:-30}"
parallel="${PARALLEL:-1}"; build_dir="${BUILD_DIR:-$repo/build/host}"
lr_decay_at="${LR_DECAY_AT:-}"; lr_decay_factor="${LR_DECAY_FACTOR:-0.5}"
die() { echo "both-directions-emulated.sh: $*" >&2; exit 2; }
[[ "$cheap" =~ ^[0-9.]+:[1-9][0-9]*$ ]] || die "CHEAP is FRACTION:MIN_ENTRIES (e.g. 0.004:4096), got '$cheap'"
for v in "${variants[@]}"; do
  case "$v" in asgd|cheap|cheap-dense-first|exact|cheap-entry|cheap-entry-fp16inc) ;;
    *) die "unknown variant '$v' (asgd, cheap, cheap-dense-first, exact, cheap-entry, cheap-entry-fp16inc)" ;; esac
done
mkdir -p "$out"

run() {  # run SEED VARIANT
  local seed="$1" variant="$2"
  local args=(--workers "$workers" --model paper-cnn --data mnist --seed "$seed" --batch 10 --lr 0.1
              --pull-every 1 --max-staleness "$max_staleness" --target-accuracy "$target"
              --duration "$duration" --eval-interval "$eval_interval"
              --request-timeout "$request_timeout" --build-dir "$build_dir" --quiet
              --out "$out/seed$seed/$variant" --label "$variant")
  [ -z "$lr_decay_at" ] || args+=(--lr-decay-at "$lr_decay_at" --lr-decay-factor "$lr_decay_factor")
  case "$variant" in
    asgd) args+=(--compressor none --dense-pull --seeded-first-pull=false) ;;
    cheap) args+=(--rate 0.01 --sign-scale --pull-fraction "${cheap%%:*}" --pull-min-entries "${cheap#*:}") ;;
    cheap-dense-first) args+=(--rate 0.01 --sign-scale --pull-fraction "${cheap%%:*}"
                              --pull-min-entries "${cheap#*:}" --seeded-first-pull=false) ;;
    exact) args+=(--rate 0.01 --sign-scale) ;;
    cheap-entry) args+=(--rate 0.01 --sign-scale --pull-fraction "${cheap%%:*}" --pull-min-entries "${cheap#*:}"
                        --entry-staleness) ;;
    cheap-entry-fp16inc) args+=(--rate 0.01 --sign-scale --pull-fraction "${cheap%%:*}"
                                --pull-min-entries "${cheap#*:}" --entry-staleness --pull-values fp16-increment) ;;
  esac
  echo "nice -n 10 emulation/edgetrain-emulate ${args[*]}" >>"$out/commands.txt"
  nice -n 10 "$repo/emulation/edgetrain-emulate" "${args[@]}" >"$out/seed$seed/$variant.log" 2>&1 ||
    echo "both-directions-emulated.sh: seed $seed $variant exited $? (see $out/seed$seed/$variant.log)" >&2
}

if [ "${SUMMARIZE_ONLY:-0}" != 1 ]; then
  echo "# $(date -u +%FT%TZ) commit $(git -C "$repo" rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/commands.txt"
  for seed in "${seeds[@]}"; do
    mkdir -p "$out/seed$seed"
    pids=()
    for variant in "${variants[@]}"; do
      if [ "$parallel" = 1 ]; then run "$seed" "$variant" & pids+=($!); else run "$seed" "$variant"; fi
    done
    for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid"; done
  done
  echo "# done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/commands.txt"
fi

/usr/bin/python3 - "$out" "$target" "${seeds[@]}" <<'PY'
import csv, glob, json, os, sys
out, target, seeds = sys.argv[1], float(sys.argv[2]), sys.argv[3:]

def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))

def run_row(directory):
    timeline = rows(os.path.join(directory, "timeline.csv"))
    reached = next((r for r in timeline if float(r["test_accuracy"] or 0) >= target), None)
    links = rows(os.path.join(directory, "links.csv"))
    total = lambda column: sum(float(r.get(column) or 0) for r in links)
    firsts = []  # each worker's first incarnation: its first pull's kind and bytes
    for path in sorted(glob.glob(os.path.join(directory, "logs", "worker-*.0.stats.json"))):
        try:
            s = json.load(open(path))
        except (OSError, ValueError):
            continue
        firsts.append((s.get("first_pull", "?"), s.get("first_pull_bytes", 0),
                       s.get("seeded_first_pull_fallbacks", 0)))
    kinds = sorted({k for k, _, _ in firsts})
    first_bytes = sum(b for _, b, _ in firsts)
    return {
        "time": float(reached["elapsed_s"]) if reached else None,
        "version": int(reached["version"]) if reached else None,
        "best": max((float(r["test_accuracy"] or 0) for r in timeline), default=0),
        "up": total("to_server_bytes_in"), "down": total("to_worker_bytes_out"),
        "first": f"{'/'.join(kinds) or '?'} {first_bytes / 1e6:.2f} MB"
                 + (f", {sum(f for _, _, f in firsts)} fell back" if any(f for _, _, f in firsts) else ""),
    }

print(f"| seed | run | best test acc | time to {target:.1%} | updates to it | up | down | up + down "
      "| ASGD / this: up, down, both | first pulls (all workers) |")
print("|---|---|---|---|---|---|---|---|---|---|")
ratios = {}
for seed in seeds:
    base = os.path.join(out, f"seed{seed}")
    if not os.path.isdir(base):
        continue
    names = sorted((d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))),
                   key=lambda v: (v != "asgd", v))
    results = {v: run_row(os.path.join(base, v)) for v in names}
    asgd = results.get("asgd")
    for v, r in results.items():
        reached = r["time"] is not None
        ratio = "—"
        if asgd and asgd["time"] is not None and reached:
            both = (asgd["up"] + asgd["down"]) / (r["up"] + r["down"])
            ratio = f"{asgd['up'] / r['up']:.1f}x, {asgd['down'] / r['down']:.1f}x, **{both:.1f}x**"
            ratios.setdefault(v, []).append(both)
        print(f"| {seed} | {v} | {r['best']:.2%} | "
              + (f"{r['time']:.0f} s | {r['version']}" if reached else "not reached | —")
              + f" | {r['up'] / 1e6:.1f} MB | {r['down'] / 1e6:.1f} MB | {(r['up'] + r['down']) / 1e6:.1f} MB"
              + f" | {ratio} | {r['first']} |")
for v, values in ratios.items():
    print(f"\n{v}: ASGD / this, both directions, mean over {len(values)} seed(s): "
          f"{sum(values) / len(values):.1f}x (per seed {', '.join(f'{x:.1f}x' for x in values)})")
PY
