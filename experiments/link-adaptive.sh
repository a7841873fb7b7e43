#!/usr/bin/env bash
# Compression that follows the link (issue 38 part 2): an edgetrain-server and N workers on
# loopback, each behind its own link of one edgetrain-link-impairer, the uplinks spread 10x
# (log-spaced from UPLINK_KBPS to 10x it; downlinks DOWNLINK_FACTOR times their uplink,
# as broadband and LTE are asymmetric). One run per fixed AdaComp c (RATES) and one per
# send share (SHARES: --send-share F, c chosen per update within [MIN_RATE, MAX_RATE]).
# Prints the table: time to each of TARGETS (from the server's metrics.csv, first
# evaluation = 0), the server's best and final accuracy, updates, the bytes that crossed the
# links (the impairer's counters, up + down) and each worker's last c.
# Not the emulator (no namespaces, no CPU quotas): four processes and one impairer, which
# keeps it light on a shared machine; run it under nice.
#
# usage: experiments/link-adaptive.sh BUILD_DIR OUT_DIR [SECONDS [WORKERS]]
#   settings through the environment: MODEL (mlp), DATA (mnist-small), BATCH (10),
#   SLOWDOWN (100), UPLINK_KBPS (32: the slowest uplink), DOWNLINK_FACTOR (10),
#   RATES ("0.001 0.003 0.01 0.03"), SHARES ("0.5"), MIN_RATE (0.0005), MAX_RATE (0.1),
#   TARGETS ("0.85 0.9"), REQUEST_TIMEOUT (20); SUMMARIZE_ONLY=1 prints the table of
#   OUT_DIR again
set -euo pipefail
build="$1"; out="$2"; seconds="${3:-90}"; workers="${4:-4}"
model="${MODEL:-mlp}"; data="${DATA:-mnist-small}"; batch="${BATCH:-10}"; slowdown="${SLOWDOWN:-100}"
uplink="${UPLINK_KBPS:-32}"; downlink_factor="${DOWNLINK_FACTOR:-10}"
rates="${RATES:-0.001 0.003 0.01 0.03}"; shares="${SHARES:-0.5}"
min_rate="${MIN_RATE:-0.0005}"; max_rate="${MAX_RATE:-0.1}"; targets="${TARGETS:-0.85 0.9}"
request_timeout="${REQUEST_TIMEOUT:-20}"
source "$(dirname "$0")/../common/processes.sh"
trap 'stop_started_programs 2' EXIT
server="$build/programs/edgetrain-server"; worker="$build/programs/edgetrain-worker"
impairer="$build/programs/edgetrain-link-impairer"
mkdir -p "$out"

# Worker i's uplink: UPLINK_KBPS · 10^(i/(N−1)), so the fastest is 10x the slowest.
uplink_of() { awk -v u="$uplink" -v i="$1" -v n="$workers" 'BEGIN { printf "%.1f", u * 10 ^ (n > 1 ? i / (n - 1) : 0) }'; }

run() {  # run NAME WORKER_FLAGS...
  local name="$1"; shift
  local dir="$out/$name" i up
  rm -rf "$dir"; mkdir -p "$dir"
  for i in $(seq 0 $((workers - 1))); do add_device "$server" "$dir/keys.toml" "w$i" "$dir/w$i.toml"; done
  start_server "$server" "$dir/server.log" --port 0 --state-dir "$dir/state" --keystore "$dir/keys.toml" \
    --model "$model" --eval-data "$data" --eval-interval 2
  : >"$dir/links.toml"
  for i in $(seq 0 $((workers - 1))); do
    up=$(uplink_of "$i")
    printf '[[link]]\nname = "w%d"\nlisten = "127.0.0.1:0"\nupstream = "127.0.0.1:%d"\nbandwidth_kbps = %s\ndownlink_kbps = %s\n' \
      "$i" "$server_port" "$up" "$(awk -v u="$up" -v f="$downlink_factor" 'BEGIN { print u * f }')" >>"$dir/links.toml"
  done
  start_program "$dir/impairer.log" "$impairer" --links "$dir/links.toml" --port-file "$dir/links.json" \
    --stats "$dir/links.csv" --stats-interval 1
  for _ in $(seq 100); do [ -s "$dir/links.json" ] && break; sleep 0.1; done
  for i in $(seq 0 $((workers - 1))); do
    start_worker "$dir/w$i.log" "$dir/w$i.json" "$worker" --config "$dir/w$i.toml" \
      --server "coaps://$(json_get "$dir/links.json" "links.w$i")" --model "$model" --data "$data" \
      --worker-id "$i" --workers "$workers" --batch "$batch" --slowdown "$slowdown" \
      --request-timeout "$request_timeout" --give-up-after 0 --duration "$seconds" --quiet "$@"
  done
  sleep "$seconds"
  sleep 3  # the workers' --duration ends them; then the last stats
  stop_started_programs 5
}

if [ -z "${SUMMARIZE_ONLY:-}" ]; then
  for c in $rates; do run "c=$c" --rate "$c"; done
  for f in $shares; do
    run "share=$f" --send-share "$f" --rate 0.01 --min-compression-rate "$min_rate" --max-compression-rate "$max_rate"
  done
fi

python3 - "$out" "$workers" "$targets" $(for c in $rates; do echo "c=$c"; done) $(for f in $shares; do echo "share=$f"; done) <<'PY'
import csv, json, sys
out, workers, targets, names = sys.argv[1], int(sys.argv[2]), [float(t) for t in sys.argv[3].split()], sys.argv[4:]
head = ("| run | " + " | ".join(f"time to {t:.0%}" for t in targets)
        + " | best / final test acc | updates | bytes at the links, up + down | payloads sent + pulled | last c per worker (slowest uplink first) |")
print(head)
print("|" + "---|" * (head.count("|") - 1))
for name in names:
    rows = list(csv.DictReader(open(f"{out}/{name}/state/metrics.csv")))
    t0 = float(rows[0]["unix_time"])
    cells = []
    for t in targets:
        hit = next((r for r in rows if float(r["test_accuracy"]) >= t), None)
        cells.append(f"{float(hit['unix_time']) - t0:.0f} s" if hit else "not reached")
    best = max(float(r["test_accuracy"]) for r in rows)
    links = list(csv.DictReader(open(f"{out}/{name}/links.csv")))
    up = sum(int(l["to_server_bytes_in"]) for l in links)
    down = sum(int(l["to_worker_bytes_in"]) for l in links)
    stats = [json.load(open(f"{out}/{name}/w{i}.json")) for i in range(workers)]
    sent = sum(s["bytes_sent"] for s in stats); pulled = sum(s["bytes_received"] for s in stats)
    rates = " ".join(f"{s.get('compression_rate', 0):.3g}" for s in stats)
    print(f"| {name} | " + " | ".join(cells) + f" | {best:.2%} / {float(rows[-1]['test_accuracy']):.2%} | {rows[-1]['version']}"
          + f" | {up / 1e6:.1f} + {down / 1e6:.1f} MB | {sent / 1e6:.1f} + {pulled / 1e6:.1f} MB | {rates} |")
PY
