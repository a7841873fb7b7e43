#!/usr/bin/env bash
# edgetrain's main job on one machine: an edgetrain-server and four workers — three host
# builds and one aarch64 build under qemu-aarch64 — train the paper CNN on MNIST over
# CoAP/DTLS-PSK on loopback for a bounded time, with a live progress line, a summary and a
# plot of test accuracy against the bytes the server ingested.
#
#   demo/run-demo.sh [--duration SECONDS] [--out DIR]     (defaults: 150 s, demo-results/)
#
# Needs build/host and build/aarch64 (./build.sh demo builds both first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail_prefix="run-demo.sh: "
source common/processes.sh

duration="${EDGETRAIN_DEMO_SECONDS:-150}"
out="demo-results"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,9s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "run-demo.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ "$duration" =~ ^[0-9]+$ ]] && [ "$duration" -ge 10 ] || { echo "run-demo.sh: --duration must be a number of seconds >= 10" >&2; exit 2; }

deps="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
server_bin=build/host/programs/edgetrain-server
worker_bin=build/host/programs/edgetrain-worker
cross_worker_bin=build/aarch64/programs/edgetrain-worker
for f in "$server_bin" "$worker_bin" "$cross_worker_bin"; do
  [ -x "$f" ] || { echo "run-demo.sh: $f is not built (run ./build.sh demo)" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out"
pids=()
trap stop_started_programs EXIT

workers=4
for i in $(seq 1 $workers); do add_device "$server_bin" "$out/keys.toml" "worker-$i" "$out/worker-$i.toml"; done

# D = 512 instead of the default 64: the host workers apply ~70 updates/s between two steps of
# the aarch64 worker under QEMU (~1.5 s each), so with D = 64 every one of its updates would be
# refused as too stale; σ scales them down instead, as the paper intends for slow devices.
# The server writes its port to server.port once bound and its counters to server.stats.json.
start_server "$server_bin" "$out/server.log" --state-dir "$out/state" --keystore "$out/keys.toml" --port 0 \
  --model paper-cnn --eval-data mnist --eval-interval 10 --max-staleness 512
port=$server_port
echo "server: coaps://127.0.0.1:$port (log: $out/server.log)"

common=(--server "coaps://127.0.0.1:$port" --workers $workers --duration "$duration" --model paper-cnn --data mnist)
for i in 1 2 3; do
  start_worker "$out/worker-$i.log" "$out/worker-$i.stats.json" "$worker_bin" --config "$out/worker-$i.toml" \
    --worker-id $((i - 1)) "${common[@]}"
  pids+=("$last_pid")
  echo "worker $i: x86_64 (log: $out/worker-$i.log)"
done
start_worker "$out/worker-4.log" "$out/worker-4.stats.json" qemu-aarch64 -L "$deps/sysroot-aarch64" "$cross_worker_bin" \
  --config "$out/worker-4.toml" --worker-id 3 "${common[@]}"
pids+=("$last_pid")
echo "worker 4: aarch64 under qemu-aarch64 (log: $out/worker-4.log)"
echo "training for $duration s ..."

# The latest row of the server's metrics.csv (one per evaluation) as one short line.
summarize() {
  awk -F, 'NR > 1 { row = $0; v = $2; payload = $4; socket = $5; dense = $6; acc = $7 } END {
    if (row == "") exit 1
    printf "version %s  test accuracy %.2f%%  update payload %.2f MB (dense: %.0fx as much)  socket ingress %.1f MB",
           v, acc * 100, payload / 1e6, (payload > 0 ? dense / payload : 0), socket / 1e6
  }' "$out/state/metrics.csv" 2>/dev/null
}
# One worker's final counters (its --stats-file) as one short line.
worker_summary() {
  local stats="$1"
  [ "$(json_get "$stats" state)" = stopped ] || { echo "no final stats"; return; }
  echo "$(json_get "$stats" steps) steps, $(json_get "$stats" updates_accepted) updates accepted," \
    "$(json_get "$stats" updates_refused) refused as stale, $(json_get "$stats" bytes_sent) bytes sent," \
    "$(json_get "$stats" retries) retries; $(json_get "$stats" pulls) pulls ($(json_get "$stats" delta_pulls) as deltas)," \
    "$(json_get "$stats" bytes_received) bytes pulled;" \
    "$(traffic_line "$(json_get "$stats" bytes_sent)" "$(json_get "$stats" bytes_received)")"
}
# A device owner pays for both directions (issue 38): upload, download and their total.
traffic_line() {  # SENT_BYTES RECEIVED_BYTES
  awk -v up="$1" -v down="$2" 'BEGIN {
    printf "upload %.1f MB + download %.1f MB = %.1f MB", up / 1e6, down / 1e6, (up + down) / 1e6 }'
}

started=$SECONDS
last_print=-100
while :; do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ $alive -eq 0 ] && break
  status=$(summarize || true)
  line=$(printf '[%3d s] %d workers  %s' $((SECONDS - started)) $alive "${status:-waiting for the first evaluation}")
  if [ -t 1 ]; then
    printf '\r%-150s' "$line"
  elif [ $((SECONDS - last_print)) -ge 15 ]; then
    echo "$line"
    last_print=$SECONDS
  fi
  sleep 1
done
if [ -t 1 ]; then echo; fi
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
pids=()
# One more evaluation of the final model, then a clean stop (checkpoint, plot).
sleep 11
kill -TERM "$server_pid"
wait "$server_pid" || { echo "run-demo.sh: the server exited with an error" >&2; failed=$((failed + 1)); }

echo
echo "== summary =="
final=$(summarize || true)
echo "final: ${final:-no evaluation was logged}"
fleet_sent=0 fleet_received=0
for i in $(seq 1 $workers); do
  echo "worker $i: $(worker_summary "$out/worker-$i.stats.json")"
  if [ "$(json_get "$out/worker-$i.stats.json" state)" = stopped ]; then
    fleet_sent=$((fleet_sent + $(json_get "$out/worker-$i.stats.json" bytes_sent)))
    fleet_received=$((fleet_received + $(json_get "$out/worker-$i.stats.json" bytes_received)))
  fi
done
echo "all workers: $(traffic_line $fleet_sent $fleet_received)"
echo "server log: $out/server.log; metrics: $out/state/metrics.csv; plot: $out/state/accuracy-vs-ingress.svg"
[ $failed -eq 0 ] || { echo "run-demo.sh: $failed process(es) failed" >&2; exit 1; }
