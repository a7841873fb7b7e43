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
server_bin=build/host/server/edgetrain-server
worker_bin=build/host/runtime/edgetrain-worker
cross_worker_bin=build/aarch64/runtime/edgetrain-worker
for f in "$server_bin" "$worker_bin" "$cross_worker_bin"; do
  [ -x "$f" ] || { echo "run-demo.sh: $f is not built (run ./build.sh demo)" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out"
pids=()
server_pid=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
}
trap cleanup EXIT

workers=4
for i in $(seq 1 $workers); do
  "$server_bin" add-device "worker-$i" --keystore "$out/keys.toml" --server-uri coaps://127.0.0.1:5684 \
    > "$out/worker-$i.toml" 2>> "$out/setup.log"
done

# D = 512 instead of the default 64: the host workers apply ~70 updates/s between two steps of
# the aarch64 worker under QEMU (~1.5 s each), so with D = 64 every one of its updates would be
# refused as too stale; σ scales them down instead, as the paper intends for slow devices.
"$server_bin" --state-dir "$out/state" --keystore "$out/keys.toml" --listen 127.0.0.1 --port 0 \
  --model paper-cnn --eval-data mnist --eval-interval 10 --max-staleness 512 > "$out/server.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out/server.log" | head -n1)
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$out/server.log" >&2; echo "run-demo.sh: the server did not start" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "run-demo.sh: the server did not report its port" >&2; exit 1; }
echo "server: coaps://127.0.0.1:$port (log: $out/server.log)"

common=(--server "coaps://127.0.0.1:$port" --workers $workers --duration "$duration" --model paper-cnn --data mnist)
for i in 1 2 3; do
  "$worker_bin" --config "$out/worker-$i.toml" --worker-id $((i - 1)) "${common[@]}" > "$out/worker-$i.log" 2>&1 &
  pids+=($!)
  echo "worker $i: x86_64 (log: $out/worker-$i.log)"
done
qemu-aarch64 -L "$deps/sysroot-aarch64" "$cross_worker_bin" --config "$out/worker-4.toml" --worker-id 3 "${common[@]}" \
  > "$out/worker-4.log" 2>&1 &
pids+=($!)
echo "worker 4: aarch64 under qemu-aarch64 (log: $out/worker-4.log)"
echo "training for $duration s ..."

# "test accuracy 0.9145, loss 0.279 at version 346 (1.4 s); ingress 7460000 payload bytes, 30100000 socket
# bytes in 90000 datagrams; dense updates would be 583.6 MB: 78x the payload" -> one short line.
summarize() {
  awk '{
    for (i = 1; i <= NF; i++) {
      if ($i == "accuracy") acc = $(i + 1) * 100
      if ($i == "version") version = $(i + 1)
      if ($i == "payload" && $(i + 1) ~ /^bytes/) payload = $(i - 1)
      if ($i == "socket") socket = $(i - 1)
      if ($i ~ /x$/ && $(i + 1) == "the") ratio = $i
    }
    printf "version %s  test accuracy %.2f%%  update payload %.2f MB (dense: %s as much)  socket ingress %.1f MB",
           version, acc, payload / 1e6, ratio, socket / 1e6
  }'
}

started=$SECONDS
last_print=-100
while :; do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ $alive -eq 0 ] && break
  status=$(grep 'test accuracy' "$out/server.log" | tail -n1 | summarize || true)
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
server_pid=""

echo
echo "== summary =="
final=$(grep 'test accuracy' "$out/server.log" | tail -n1 | summarize || true)
echo "final: ${final:-no evaluation was logged}"
for i in $(seq 1 $workers); do
  echo "worker $i: $(grep 'stopped after' "$out/worker-$i.log" | sed 's/.*stopped after/stopped after/' || true)"
done
echo "server log: $out/server.log; metrics: $out/state/metrics.csv; plot: $out/state/accuracy-vs-ingress.svg"
[ $failed -eq 0 ] || { echo "run-demo.sh: $failed process(es) failed" >&2; exit 1; }
