#!/usr/bin/env bash
# The cheap pull in the real programs (issue 38 part 3; docs/results.md "The cheap pull in
# edgetrain-server"): one edgetrain-server and WORKERS edgetrain-worker processes over DTLS
# on loopback (no namespaces, no link impairer: the bytes are the programs' own), MNIST, the
# paper CNN, a pull before every step (the worker's default), AdaComp c = 0.01, batch 10;
# one run per setting, one after the other, in one invocation: "exact" (model deltas since
# the worker's version, the default) and "F:M" for --pull-fraction F --pull-min-entries M.
# With ROUNDS=2 or more the settings run again in the same order, so each setting's runs are
# paired with the others' under the same load. Prints a markdown table per run: updates
# applied, test accuracy (best, final, time to each of TARGETS from the first evaluation),
# what the devices downloaded (model payloads, and the server's socket egress, per applied
# update) and uploaded, the server's dense and delta pulls, and its CPU: the GET /model
# handlers' thread CPU per pull (model_pull_cpu_seconds / model_pulls) and the whole
# process's CPU per applied update (/proc/PID/stat before it stops).
#
# usage: experiments/cheap-pull-real.sh BUILD_DIR OUT_DIR [SECONDS [WORKERS]]
#   environment: SETTINGS ("exact 0.004:4096 0.006:2560 0.01:2048"), ROUNDS (1), MODEL
#   (paper-cnn), DATA (mnist), EVAL_DATA (mnist: its 2,000 test images), LR (0.1),
#   MAX_STALENESS (4 × WORKERS), TARGETS ("0.90 0.95"), EVAL_INTERVAL (5 s);
#   SUMMARIZE_ONLY=1 prints the table of OUT_DIR again without running
set -euo pipefail
build="$1"; out="$2"; seconds="${3:-120}"; workers="${4:-10}"
settings="${SETTINGS:-exact 0.004:4096 0.006:2560 0.01:2048}"; rounds="${ROUNDS:-1}"
model="${MODEL:-paper-cnn}"; data="${DATA:-mnist}"; eval_data="${EVAL_DATA:-mnist}"; lr="${LR:-0.1}"
max_staleness="${MAX_STALENESS:-$((4 * workers))}"; targets="${TARGETS:-0.90 0.95}"
eval_interval="${EVAL_INTERVAL:-5}"
source "$(dirname "$0")/../common/processes.sh"
trap 'stop_started_programs 2' EXIT
server="$build/programs/edgetrain-server"; worker="$build/programs/edgetrain-worker"
die() { echo "cheap-pull-real.sh: $*" >&2; exit 2; }
for s in $settings; do
  [ "$s" = exact ] || [[ "$s" =~ ^[0-9.]+:[1-9][0-9]*$ ]] || die "a setting is 'exact' or FRACTION:MIN_ENTRIES, got '$s'"
done
mkdir -p "$out"

run() {  # run NAME SERVER_FLAGS...
  local name="$1"; shift
  local dir="$out/$name" i
  rm -rf "$dir"; mkdir -p "$dir"
  for i in $(seq 0 $((workers - 1))); do add_device "$server" "$dir/keys.toml" "w$i" "$dir/w$i.toml"; done
  start_server "$server" "$dir/server.log" --port 0 --state-dir "$dir/state" --keystore "$dir/keys.toml" \
    --model "$model" --eval-data "$eval_data" --eval-interval "$eval_interval" --lr "$lr" \
    --max-staleness "$max_staleness" "$@"
  for i in $(seq 0 $((workers - 1))); do
    start_worker "$dir/w$i.log" "$dir/w$i.json" "$worker" --config "$dir/w$i.toml" \
      --server "coaps://127.0.0.1:$server_port" --model "$model" --data "$data" \
      --worker-id "$i" --workers "$workers" --duration "$seconds" --quiet
  done
  sleep "$seconds"
  # The server's CPU (user + system, clock ticks) before anything stops.
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$server_pid/stat" >"$dir/server_cpu_seconds"
  stop_started_programs 10
  echo "$name: done ($(json_get "$dir/server.stats.json" updates_applied) updates)" >&2
}

if [ -z "${SUMMARIZE_ONLY:-}" ]; then
  echo "commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >"$out/run-info.txt"
  for r in $(seq 1 "$rounds"); do
    for s in $settings; do
      if [ "$s" = exact ]; then
        run "exact-r$r"
      else
        run "cheap-${s%%:*}-m${s#*:}-r$r" --pull-fraction "${s%%:*}" --pull-min-entries "${s#*:}"
      fi
    done
  done
  echo "load at the end $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/run-info.txt"
fi

cat "$out/run-info.txt"
/usr/bin/python3 - "$out" "$workers" $targets <<'EOF'
import csv, json, os, sys
out, workers = sys.argv[1], int(sys.argv[2]); targets = [float(t) for t in sys.argv[3:]]
runs = sorted((d for d in os.listdir(out) if os.path.isdir(f"{out}/{d}")), key=lambda d: (d.split("-r")[-1], d))
head = ("| run | updates | best acc | final acc | "
        + " | ".join(f"time to {t:.0%}" for t in targets)
        + " | download payload B / update | server egress B / update | upload payload B / update"
        + " | dense / delta pulls (repeats) | GET /model CPU µs / pull | server CPU µs / update |")
print(head)
print("|" + "---|" * (head.count("|") - 1))
for name in runs:
    d = f"{out}/{name}"
    try:
        rows = list(csv.DictReader(open(f"{d}/state/metrics.csv")))
        server = json.load(open(f"{d}/server.stats.json"))
        stats = [json.load(open(f"{d}/w{i}.json")) for i in range(workers)]
        cpu = float(open(f"{d}/server_cpu_seconds").read())
    except (OSError, ValueError) as e:
        print(f"| {name} | (incomplete: {e}) |")
        continue
    t0 = float(rows[0]["unix_time"]) if rows else 0
    cells = []
    for t in targets:
        hit = next((r for r in rows if float(r["test_accuracy"]) >= t), None)
        cells.append(f"{float(hit['unix_time']) - t0:.0f} s (v{hit['version']})" if hit else "not reached")
    updates = server["updates_applied"] or 1
    down = sum(s["bytes_received"] for s in stats); up = sum(s["bytes_sent"] for s in stats)
    cheap = server.get("cheap_pull")
    pulls = (f"{cheap['dense_pulls']} / {cheap['delta_pulls']} ({cheap['repeated_pulls']})" if cheap
             else f"{server['model_pulls'] - server['model_delta_pulls']} / {server['model_delta_pulls']}")
    per_pull = server["model_pull_cpu_seconds"] / max(1, server["model_pulls"]) * 1e6
    best = max((float(r["test_accuracy"]) for r in rows), default=0)
    final = float(rows[-1]["test_accuracy"]) if rows else 0
    print(f"| {name} | {updates} | {best:.2%} | {final:.2%} | " + " | ".join(cells)
          + f" | {down / updates:,.0f} | {server['egress_socket_bytes'] / updates:,.0f} | {up / updates:,.0f}"
          + f" | {pulls} | {per_pull:,.0f} | {cpu / updates * 1e6:,.0f} |")
EOF
