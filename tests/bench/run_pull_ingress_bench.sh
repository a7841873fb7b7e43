#!/usr/bin/env bash
# Socket ingress per update with dense and with sparse model pulls (issue 5): two short runs
# of a real edgetrain-server on 127.0.0.1 and 3 edgetrain-worker processes (paper CNN,
# AdaComp c = 0.01, MNIST, pulling before every step): one with --dense-pull, one with the
# default (GET /model?since=V). Prints, from the server's stop line ("ingress ... payload
# bytes, ... socket bytes in ... datagrams") and version, the socket bytes and datagrams per
# applied update, and from the workers' stop lines the pulls and bytes pulled. Builds
# nothing: assumes build/host. Prints figures; not a test.
#
# Settings (environment): EDGETRAIN_BUILD (build/host), BENCH_SECONDS (60 per run),
# BENCH_WORKERS (3), BENCH_MODEL (paper-cnn). Every program is stopped by the script.
set -euo pipefail

cd "$(dirname "$0")/../.."
build=${EDGETRAIN_BUILD:-build/host}
seconds=${BENCH_SECONDS:-60}
workers=${BENCH_WORKERS:-3}
model=${BENCH_MODEL:-paper-cnn}
server=$build/server/edgetrain-server
worker=$build/runtime/edgetrain-worker
for program in "$server" "$worker"; do
  [[ -x $program ]] || { echo "missing $program: build the host preset first" >&2; exit 1; }
done
[[ -e ${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist/train-images-idx3-ubyte ||
   -e ${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist/train-images-idx3-ubyte.gz ]] ||
  { echo "MNIST is missing (./build.sh setup)" >&2; exit 1; }

work=$(mktemp -d "$PWD/$build/pull-ingress-bench.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for i in $(seq 0 $((workers - 1))); do
  "$server" add-device "w$i" --keystore "$work/keys.toml" --server-uri coaps://127.0.0.1:0 > "$work/w$i.toml" 2>/dev/null
done

field() { grep -o "$1" <<<"$2" | head -1 | grep -o '[0-9]*' | head -1; }
run() {  # run NAME [WORKER FLAGS...]
  local name=$1; shift
  local dir="$work/$name"
  mkdir -p "$dir"
  "$server" --listen 127.0.0.1 --port 0 --state-dir "$dir/state" --keystore "$work/keys.toml" --model "$model" \
    --eval-data none 2> "$dir/server.log" &
  local server_pid=$!
  pids+=("$server_pid")
  local port=""
  for _ in $(seq 100); do
    port=$(grep -so 'listening on 127.0.0.1:[0-9]*' "$dir/server.log" | sed 's/.*://' || true)
    [[ -n $port ]] && break
    sleep 0.1
  done
  [[ -n $port ]] || { cat "$dir/server.log" >&2; echo "the server did not start" >&2; exit 1; }
  local worker_pids=()
  for i in $(seq 0 $((workers - 1))); do
    "$worker" --config "$work/w$i.toml" --server "coaps://127.0.0.1:$port" --model "$model" --data mnist \
      --worker-id "$i" --workers "$workers" --duration "$seconds" --quiet "$@" 2> "$dir/w$i.log" &
    worker_pids+=($!)
    pids+=($!)
  done
  for pid in "${worker_pids[@]}"; do wait "$pid" || true; done
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  local stop version payload socket datagrams pulls pulled=0 pull_count=0
  stop=$(grep 'stopping:' "$dir/server.log" | tail -1)
  version=$(grep -o 'checkpoint at version [0-9]*' <<<"$stop" | grep -o '[0-9]*$')
  payload=$(grep -o 'ingress [0-9]* payload bytes' <<<"$stop" | grep -o '[0-9]*')
  socket=$(grep -o '[0-9]* socket bytes' <<<"$stop" | grep -o '[0-9]*')
  datagrams=$(grep -o 'in [0-9]* datagrams' <<<"$stop" | grep -o '[0-9]*')
  for i in $(seq 0 $((workers - 1))); do
    line=$(grep 'stopped after' "$dir/w$i.log" | tail -1)
    pull_count=$((pull_count + $(grep -o '[0-9]* pulls' <<<"$line" | grep -o '[0-9]*')))
    pulled=$((pulled + $(grep -o '[0-9]* bytes pulled' <<<"$line" | grep -o '[0-9]*')))
  done
  echo "$name: $version updates in ${seconds} s; server ingress $payload payload B, $socket socket B in $datagrams datagrams;" \
       "$pull_count pulls, $pulled B pulled"
  awk -v n="$name" -v u="$version" -v p="$payload" -v s="$socket" -v d="$datagrams" -v pc="$pull_count" -v pb="$pulled" \
    'BEGIN { printf "summary %s updates=%d socket_bytes_per_update=%.0f datagrams_per_update=%.1f payload_bytes_per_update=%.0f bytes_per_pull=%.0f\n", n, u, s / u, d / u, p / u, pb / pc }'
}

echo "$workers workers, model $model, $seconds s per run, $(nproc) cores"
run dense --dense-pull | tee "$work/dense.txt"
run sparse | tee "$work/sparse.txt"

echo
echo "| pulls | updates | socket bytes / update | datagrams / update | payload bytes / update | bytes / pull |"
echo "|---|---|---|---|---|---|"
for name in dense sparse; do
  line=$(grep '^summary' "$work/$name.txt")
  printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$(grep -o 'updates=[0-9]*' <<<"$line" | cut -d= -f2)" \
    "$(grep -o 'socket_bytes_per_update=[0-9.]*' <<<"$line" | cut -d= -f2)" \
    "$(grep -o 'datagrams_per_update=[0-9.]*' <<<"$line" | cut -d= -f2)" \
    "$(grep -o 'payload_bytes_per_update=[0-9.]*' <<<"$line" | cut -d= -f2)" \
    "$(grep -o 'bytes_per_pull=[0-9.]*' <<<"$line" | cut -d= -f2)"
done
