#!/usr/bin/env bash
# Socket ingress per applied update against the update payload, for each way a worker pulls
# (issues 5 and 13): short runs of a real edgetrain-server on 127.0.0.1 and BENCH_WORKERS
# edgetrain-worker processes (paper CNN, AdaComp c = 0.01, MNIST, pulling before every
# step), one run per entry of BENCH_RUNS:
#   dense      --dense-pull: the whole model before every step (the paper's worker)
#   sparse     GET /model?since=V of the exact model (the worker's default; with Q-Block,
#              RFC 9177: the delta's blocks in bursts, one request per burst, and the
#              update's blocks in bursts, one 2.31 per burst)
#   no-q-block sparse with Q-Block off on both programs (--q-block=false): one exchange per
#              block both ways (RFC 7959 Block1 and Block2), as before Q-Block
#   published  the server's published model (--publish-every/--publish-fraction from
#              BENCH_PUBLISH="EVERY:FRACTION", default 10:0.004; server/README.md)
# Prints, from the server's final --stats-file (version, ingress and egress counters), the
# socket bytes and datagrams per applied update and their ratio to the payload, what the
# server's socket sent per update, and from the workers'
# final --stats-file the pulls and bytes pulled. Builds nothing: assumes build/host.
# Prints figures; not a test.
#
# Settings (environment): EDGETRAIN_BUILD (build/host), BENCH_SECONDS (60 per run),
# BENCH_WORKERS (3), BENCH_MODEL (paper-cnn), BENCH_RUNS ("dense sparse"), BENCH_PUBLISH,
# BENCH_WORKER_FLAGS (extra worker flags, e.g. --sign-scale), BENCH_SERVER_FLAGS (extra
# server flags, e.g. --coap-max-payloads 20 with the same in BENCH_WORKER_FLAGS), BENCH_WARMUP (seconds before the
# steady-state snapshot; default a third of the run). The server's D is 4 x workers
# (at least 64). Every program is stopped by the script.
set -euo pipefail

cd "$(dirname "$0")/../.."
source common/processes.sh
build=${EDGETRAIN_BUILD:-build/host}
seconds=${BENCH_SECONDS:-60}
workers=${BENCH_WORKERS:-3}
model=${BENCH_MODEL:-paper-cnn}
runs=${BENCH_RUNS:-dense sparse}
publish=${BENCH_PUBLISH:-10:0.004}
read -r -a extra_worker_flags <<<"${BENCH_WORKER_FLAGS:-}"
extra_server_flags=${BENCH_SERVER_FLAGS:-}
max_staleness=$((workers * 4 > 64 ? workers * 4 : 64))
warmup=${BENCH_WARMUP:-$((seconds / 3))}
server=$build/programs/edgetrain-server
worker=$build/programs/edgetrain-worker
for program in "$server" "$worker"; do
  [[ -x $program ]] || { echo "missing $program: build the host preset first" >&2; exit 1; }
done
[[ -e ${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist-full/train-images-idx3-ubyte ||
   -e ${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist-full/train-images-idx3-ubyte.gz ]] ||
  { echo "MNIST is missing (./build.sh setup)" >&2; exit 1; }

work=$(mktemp -d "$PWD/$build/pull-ingress-bench.XXXXXX")
trap 'stop_started_programs 5; rm -rf "$work"' EXIT

for i in $(seq 0 $((workers - 1))); do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done

run() {  # run NAME SERVER-FLAGS [WORKER FLAGS...]
  local name=$1 server_flags=$2; shift 2
  local dir="$work/$name"
  mkdir -p "$dir"
  # shellcheck disable=SC2086 # server_flags: words on purpose
  start_server "$server" "$dir/server.log" --port 0 --state-dir "$dir/state" --keystore "$work/keys.toml" \
    --model "$model" --eval-data none --max-staleness "$max_staleness" $server_flags $extra_server_flags
  local worker_pids=()
  for i in $(seq 0 $((workers - 1))); do
    start_worker "$dir/w$i.log" "$dir/w$i.stats.json" "$worker" --config "$work/w$i.toml" \
      --server "coaps://127.0.0.1:$server_port" --model "$model" --data mnist \
      --worker-id "$i" --workers "$workers" --duration "$seconds" --quiet ${extra_worker_flags[@]+"${extra_worker_flags[@]}"} "$@"
    worker_pids+=("$last_pid")
  done
  # Steady state: the counters from a snapshot after the warm-up (every worker's first,
  # dense, pull and its handshake are behind it) to the end.
  sleep "$warmup"
  local v0 p0 s0 e0 d0
  v0=$(json_get "$server_stats" version) p0=$(json_get "$server_stats" ingress_payload_bytes)
  s0=$(json_get "$server_stats" ingress_socket_bytes) e0=$(json_get "$server_stats" egress_socket_bytes)
  d0=$(( $(json_get "$server_stats" ingress_socket_datagrams) + $(json_get "$server_stats" egress_socket_datagrams) ))
  for pid in "${worker_pids[@]}"; do wait "$pid" || true; done
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  local version payload socket egress datagrams pulled=0 pull_count=0
  version=$(json_get "$server_stats" version)
  payload=$(json_get "$server_stats" ingress_payload_bytes)
  socket=$(json_get "$server_stats" ingress_socket_bytes)
  # Datagrams: only from a server whose stats file counts them ("n/a" otherwise).
  datagrams=$(json_get "$server_stats" ingress_socket_datagrams || echo n/a)
  for i in $(seq 0 $((workers - 1))); do
    pull_count=$((pull_count + $(json_get "$dir/w$i.stats.json" pulls)))
    pulled=$((pulled + $(json_get "$dir/w$i.stats.json" bytes_received)))
  done
  egress=$(json_get "$server_stats" egress_socket_bytes)
  local both_ways
  both_ways=$(( $(json_get "$server_stats" ingress_socket_datagrams) + $(json_get "$server_stats" egress_socket_datagrams) ))
  awk -v n="$name" -v u="$((version - v0))" -v p="$((payload - p0))" -v s="$((socket - s0))" -v e="$((egress - e0))" -v d="$((both_ways - d0))" \
    'BEGIN { printf "steady %s updates=%d socket_bytes_per_update=%.0f payload_bytes_per_update=%.0f socket_over_payload=%.2f egress_bytes_per_update=%.0f in_out_datagrams_per_update=%.1f\n", n, u, s / u, p / u, s / p, e / u, d / u }'
  echo "$name: $version updates in ${seconds} s; server ingress $payload payload B, $socket socket B in $datagrams datagrams;" \
       "$pull_count pulls, $pulled B pulled"
  awk -v n="$name" -v u="$version" -v p="$payload" -v s="$socket" -v d="$datagrams" -v pc="$pull_count" -v pb="$pulled" \
    'BEGIN { printf "summary %s updates=%d socket_bytes_per_update=%.0f datagrams_per_update=%s payload_bytes_per_update=%.0f bytes_per_pull=%.0f socket_over_payload=%.2f\n", n, u, s / u, (d == "n/a" ? d : sprintf("%.1f", d / u)), p / u, pb / pc, s / p }'
}

echo "$workers workers, model $model, $seconds s per run, $(nproc) cores, D = $max_staleness"
for name in $runs; do
  case $name in
    dense) run dense "" --dense-pull ;;
    sparse) run sparse "" ;;
    no-q-block) run no-q-block "--q-block=false" --q-block=false ;;
    published) run published "--publish-every ${publish%%:*} --publish-fraction ${publish#*:}" ;;
    *) echo "unknown run '$name' in BENCH_RUNS (dense, sparse, no-q-block, published)" >&2; exit 1 ;;
  esac | tee "$work/$name.txt"
done

echo
echo "| pulls | updates | socket bytes / update | datagrams / update | payload bytes / update | bytes / pull | socket / payload | steady state: updates | socket / update | socket / payload | egress / update | datagrams in + out / update |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for name in $runs; do
  line=$(grep '^summary' "$work/$name.txt")
  field() { grep -o "$1=[0-9.na/]*" <<<"$line" | cut -d= -f2; }
  label=$name
  [ "$name" = published ] && label="published ($publish)"
  row=$(printf '| %s | %s | %s | %s | %s | %s | %s |' "$label" "$(field updates)" "$(field socket_bytes_per_update)" \
    "$(field datagrams_per_update)" "$(field payload_bytes_per_update)" "$(field bytes_per_pull)" "$(field socket_over_payload)")
  line=$(grep '^steady' "$work/$name.txt")
  printf '%s %s | %s | %s | %s | %s |\n' "$row" "$(field updates)" "$(field socket_bytes_per_update)" "$(field socket_over_payload)" \
    "$(field egress_bytes_per_update)" "$(field in_out_datagrams_per_update)"
done
