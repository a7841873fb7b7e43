#!/usr/bin/env bash
# Devices reachable half of the time, in the emulator (issue 38 part 1's goal): for each
# seed, one edgetrain-emulate run whose workers idle while their link is down (the paper's)
# and one whose workers train offline and whose server credits an offline update's local
# steps (--offline-step-credit), both with the impairer's down windows (--reachable,
# --outage-period) and a CPU quota per worker with --cpu-priority (so offline steps cannot
# take CPU from online workers: without the priority, on a machine loaded by other work, a
# run's workers share one default weight and did, 1,258 updates against 2,039 in 120 s). The two runs of a seed run at the same time by default (PARALLEL=1), so that
# they share the machine's load alike. Each stops at TARGET or after DURATION seconds.
# Prints one markdown row per run: time to TARGET, the ratio idle / offline of its seed,
# bytes at the links both ways, offline updates accepted / refused, acknowledged updates
# lost (the emulator's checks), with the command of each run in OUT_DIR/commands.txt.
#
# usage: experiments/offline-emulated.sh OUT_DIR [SEED...]      (default seeds: 1 2 3)
#   settings through the environment: WORKERS (10), MODEL (paper-cnn), DATA (mnist),
#   CPU (0.04: each worker's quota, a share of one core), REACHABLE (0.5), PERIOD (120 s),
#   START (20 s: every link up before), TARGET (0.95), DURATION (900 s), CREDIT (1000),
#   MAX_STALENESS (20000), OFFLINE_STEPS (100000: the windows bound them), OFFLINE_MAX_RATE
#   (0.25: the offline update at c x s up to this), EVAL_INTERVAL (5), REQUEST_TIMEOUT (3),
#   VARIANTS ("idle offline"; also "offline-credit-only": the credit without the wider c,
#   "offline-paper-sigma": offline training as it was, neither; "offline-average": "offline"
#   with the server's --offline-average), PARALLEL (1),
#   OFFLINE_TRY_TIMEOUT (0; above 0 every offline variant's tries are probes bounded by it,
#   taking at most OFFLINE_TRY_SHARE, 0.2, of the time offline: --offline-try-timeout),
#   LONGEST_REQUEST (0: every variant's workers with --longest-request, 0 = off),
#   BUILD_DIR (build/host);
#   SUMMARIZE_ONLY=1 prints the table of OUT_DIR again.
set -euo pipefail
out="$1"; shift
seeds=("$@"); [ "${#seeds[@]}" -gt 0 ] || seeds=(1 2 3)
repo=$(cd "$(dirname "$0")/.." && pwd)
workers="${WORKERS:-10}"; model="${MODEL:-paper-cnn}"; data="${DATA:-mnist}"; cpu="${CPU:-0.04}"
reachable="${REACHABLE:-0.5}"; period="${PERIOD:-120}"; start="${START:-20}"
target="${TARGET:-0.95}"; duration="${DURATION:-900}"; credit="${CREDIT:-1000}"
max_staleness="${MAX_STALENESS:-20000}"; offline_steps="${OFFLINE_STEPS:-100000}"
offline_max_rate="${OFFLINE_MAX_RATE:-0.25}"
eval_interval="${EVAL_INTERVAL:-5}"; request_timeout="${REQUEST_TIMEOUT:-3}"
offline_try_timeout="${OFFLINE_TRY_TIMEOUT:-0}"; offline_try_share="${OFFLINE_TRY_SHARE:-0.2}"
longest_request="${LONGEST_REQUEST:-0}"
variants=(${VARIANTS:-idle offline}); parallel="${PARALLEL:-1}"
build_dir="${BUILD_DIR:-$repo/build/host}"
mkdir -p "$out"

run() {  # run SEED VARIANT
  local seed="$1" variant="$2"
  local args=(--workers "$workers" --model "$model" --data "$data" --seed "$seed"
              --cpu-classes "equal=$cpu" --cpu-priority --reachable "$reachable" --outage-period "$period"
              --outage-start "$start" --target-accuracy "$target" --duration "$duration"
              --eval-interval "$eval_interval" --request-timeout "$request_timeout"
              --max-staleness "$max_staleness" --build-dir "$build_dir" --quiet
              --out "$out/seed$seed/$variant" --label "$variant")
  [ "$longest_request" = 0 ] || args+=(--longest-request "$longest_request")
  case "$variant" in
    idle) ;;
    offline) args+=(--offline-steps "$offline_steps" --offline-step-credit "$credit" --offline-max-rate "$offline_max_rate") ;;
    offline-average) args+=(--offline-steps "$offline_steps" --offline-step-credit "$credit" --offline-max-rate "$offline_max_rate" --offline-average) ;;
    offline-credit-only) args+=(--offline-steps "$offline_steps" --offline-step-credit "$credit") ;;
    offline-paper-sigma) args+=(--offline-steps "$offline_steps") ;;
    *) echo "offline-emulated.sh: unknown variant '$variant' (idle, offline, offline-average, offline-credit-only, offline-paper-sigma)" >&2; exit 2 ;;
  esac
  if [ "$variant" != idle ] && [ "$offline_try_timeout" != 0 ]; then
    args+=(--offline-try-timeout "$offline_try_timeout" --offline-try-share "$offline_try_share")
  fi
  echo "emulation/edgetrain-emulate ${args[*]}" >>"$out/commands.txt"
  "$repo/emulation/edgetrain-emulate" "${args[@]}" >"$out/seed$seed/$variant.log" 2>&1 ||
    echo "offline-emulated.sh: seed $seed $variant exited $? (see $out/seed$seed/$variant.log)" >&2
}

if [ "${SUMMARIZE_ONLY:-0}" != 1 ]; then
  echo "# $(date -u +%FT%TZ) commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)" >>"$out/commands.txt"
  for seed in "${seeds[@]}"; do
    mkdir -p "$out/seed$seed"
    pids=()
    for variant in "${variants[@]}"; do
      if [ "$parallel" = 1 ]; then run "$seed" "$variant" & pids+=($!); else run "$seed" "$variant"; fi
    done
    for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid"; done
  done
fi

/usr/bin/python3 - "$out" "$target" "${seeds[@]}" <<'PY'
import csv, json, os, sys
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
    workers = rows(os.path.join(directory, "workers.csv"))
    outcome_path = os.path.join(directory, "outcome.json")
    outcome = json.load(open(outcome_path)) if os.path.exists(outcome_path) else {}
    total = lambda table, column: sum(float(r.get(column) or 0) for r in table)
    # The time offline workers spent in tries of the server (no local step meanwhile),
    # from their stats files (each incarnation's last write).
    tries = try_seconds = 0
    logs = os.path.join(directory, "logs")
    for name in (os.listdir(logs) if os.path.isdir(logs) else []):
        if name.startswith("worker-") and name.endswith(".stats.json"):
            try:
                stats = json.load(open(os.path.join(logs, name)))
            except (OSError, ValueError):
                continue
            tries += stats.get("offline_tries", 0)
            try_seconds += stats.get("offline_try_seconds", 0)
    best = max((float(r["test_accuracy"] or 0) for r in timeline), default=0)
    return {
        "time": float(reached["elapsed_s"]) if reached else None,
        "version": timeline[-1]["version"] if timeline else "",
        "best": best,
        "up": total(links, "to_server_bytes_in"),
        "down": total(links, "to_worker_bytes_out"),
        "down_s": total(links, "down_s"),
        "offline_s": total(workers, "offline_s"),
        "offline_steps": int(total(workers, "offline_steps")),
        "accepted": int(total(workers, "offline_updates_accepted")),
        "refused": int(total(workers, "offline_updates_refused")),
        "refused_steps": int(total(workers, "offline_steps_refused")),
        "tries": tries, "try_seconds": try_seconds,
        "lost": outcome.get("lost_acknowledged_updates"),
        "stop": outcome.get("stop", "not finished"),
    }

print(f"| seed | workers | time to {target:.1%} | idle / this | best test acc | updates applied | "
      "bytes at the links, up + down | links down (s, all) | offline s (all) | offline steps | "
      "tries offline (s in them) | offline updates accepted / refused (steps) | acknowledged updates lost |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for seed in seeds:
    base = os.path.join(out, f"seed{seed}")
    if not os.path.isdir(base):
        continue
    variants = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    variants.sort(key=lambda v: (v != "idle", v))
    results = {v: run_row(os.path.join(base, v)) for v in variants}
    idle_time = results.get("idle", {}).get("time")
    for v, r in results.items():
        time = f"{r['time']:.0f} s" if r["time"] is not None else f"not reached ({r['stop']})"
        ratio = f"**{idle_time / r['time']:.2f}x**" if idle_time and r["time"] else "—"
        lost = {True: "YES", False: "none", None: "?"}[r["lost"]]
        print(f"| {seed} | {v} | {time} | {ratio} | {r['best']:.2%} | {r['version']} | "
              f"{r['up'] / 1e6:.1f} + {r['down'] / 1e6:.1f} MB | {r['down_s']:.0f} | "
              f"{r['offline_s']:.0f} | {r['offline_steps']} | {r['tries']} ({r['try_seconds']:.0f} s) | {r['accepted']} / {r['refused']} ({r['refused_steps']}) | {lost} |")
PY
