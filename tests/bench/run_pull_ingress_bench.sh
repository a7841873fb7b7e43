#!/usr/bin/env bash
# Socket ingress per update with dense and with sparse model pulls (issue 5): two short runs
# of a real edgetrain-server on 127.0.0.1 and 3 edgetrain-worker processes (paper CNN,
# AdaComp c = 0.01, MNIST, pulling before every step): one with --dense-pull, one with the
# default (GET /model?since=V). Prints, from the server's final --stats-file (version,
# ingress counters), the socket bytes and datagrams per applied update, and from the
# workers' final --stats-file the pulls and bytes pulled. Builds nothing: assumes
# build/host. Prints figures; not a test.
#
# Settings (environment): EDGETRAIN_BUILD (build/host), BENCH_SECONDS (60 per run),
# BENCH_WORKERS (3), BENCH_MODEL (paper-cnn). Every program is stopped by the script.
set -euo pipefail

cd "$(dirname "$0")/../.."
source common/processes.sh
build=${EDGETRAIN_BUILD:-build/host}
seconds=${BENCH_SECONDS:-60}
workers=${BENCH_WORKERS:-3}
model=${BENCH_MODEL:-paper-cnn}
server=$build/server/edgetrain-server
worker=$build/runtime/edgetrain-worker
for program in "$server" "$worker"; do
  [[ -x $program ]] || { echo "missing $program: build the host preset first" >&2; exit 1; }
done
[[ -e ${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist-full/train-images-idx3-ubyte ||
   -e ${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist-full/train-images-idx3-ubyte.gz ]] ||
  { echo "MNIST is missing (./build.sh setup)" >&2; exit 1; }

work=$(mktemp -d "$PWD/$build/pull-ingress-bench.XXXXXX")
trap 'stop_started_programs 5; rm -rf "$work"' EXIT

for i in $(seq 0 $((workers - 1))); do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done

run() {  # run NAME [WORKER FLAGS...]
  local name=$1; shift
  local dir="$work/$name"
  mkdir -p "$dir"
  start_server "$server" "$dir/server.log" --port 0 --state-dir "$dir/state" --keystore "$work/keys.toml" \
    --model "$model" --eval-data none
  local worker_pids=()
  for i in $(seq 0 $((workers - 1))); do
    start_worker "$dir/w$i.log" "$dir/w$i.stats.json" "$worker" --config "$work/w$i.toml" \
      --server "coaps://127.0.0.1:$server_port" --model "$model" --data mnist \
      --worker-id "$i" --workers "$workers" --duration "$seconds" --quiet "$@"
    worker_pids+=("$last_pid")
  done
  for pid in "${worker_pids[@]}"; do wait "$pid" || true; done
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  local version payload socket datagrams pulled=0 pull_count=0
  version=$(json_get "$server_stats" version)
  payload=$(json_get "$server_stats" ingress_payload_bytes)
  socket=$(json_get "$server_stats" ingress_socket_bytes)
  # Datagrams: only from a server whose stats file counts them ("n/a" otherwise).
  datagrams=$(json_get "$server_stats" ingress_socket_datagrams || echo n/a)
  for i in $(seq 0 $((workers - 1))); do
    pull_count=$((pull_count + $(json_get "$dir/w$i.stats.json" pulls)))
    pulled=$((pulled + $(json_get "$dir/w$i.stats.json" bytes_received)))
  done
  echo "$name: $version updates in ${seconds} s; server ingress $payload payload B, $socket socket B in $datagrams datagrams;" \
       "$pull_count pulls, $pulled B pulled"
  awk -v n="$name" -v u="$version" -v p="$payload" -v s="$socket" -v d="$datagrams" -v pc="$pull_count" -v pb="$pulled" \
    'BEGIN { printf "summary %s updates=%d socket_bytes_per_update=%.0f datagrams_per_update=%s payload_bytes_per_update=%.0f bytes_per_pull=%.0f\n", n, u, s / u, (d == "n/a" ? d : sprintf("%.1f", d / u)), p / u, pb / pc }'
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
    "$(grep -o 'datagrams_per_update=[0-9.na/]*' <<<"$line" | cut -d= -f2)" \
    "$(grep -o 'payload_bytes_per_update=[0-9.]*' <<<"$line" | cut -d= -f2)" \
    "$(grep -o 'bytes_per_pull=[0-9.]*' <<<"$line" | cut -d= -f2)"
done
