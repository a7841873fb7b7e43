#!/usr/bin/env bash
# Records the updates real workers send, for `edgetrain-loadgen load --replay` (issue 17): the
# synthetic load posts top-k of random gradients, whose sizes are a real update's but whose
# index patterns are not. Starts an edgetrain-server on 127.0.0.1 (a fresh state directory in
# a temporary directory, --eval-data none) and N edgetrain-worker processes that train the
# model on MNIST over DTLS-PSK for a bounded time, then copies the server's write-ahead log
# (its header and every update it acknowledged, the codec bytes as the workers sent them;
# server/write_ahead_log.h) to OUT and stops everything.
#
#   tests/bench/record_updates.sh [--seconds S] [--workers N] [--data NAME] [--model M] OUT [-- WORKER FLAGS...]
#
#   --seconds S   how long each worker trains (default 60; its start-up comes on top)
#   --workers N   worker processes (default 3, at most 16)
#   --data NAME   data set of the workers: mnist (default; $EDGETRAIN_DEPS/mnist-full, default
#                 /var/cache/edgetrain), mnist-small, or a directory (edgetrain-worker --data)
#   --model M     model of the server and the workers (default paper-cnn); replay it with the
#                 load generator's --model set to the same
#   OUT           the WAL file written (replaced if it exists)
#   -- FLAGS      more edgetrain-worker flags, e.g. -- --sign-scale --error-feedback
#
# Then: BENCH_REPLAY=OUT tests/bench/run_server_bench.sh, or
#   edgetrain-loadgen load --replay OUT --port P --keystore K ...
# Builds nothing: EDGETRAIN_BUILD (default build/host) holds edgetrain-server and
# edgetrain-worker. Every program is stopped by the script. Exit status: 0 recorded, 1 a
# program failed or nothing was recorded (the logs are printed), 2 bad usage.
set -euo pipefail
fail_prefix="record_updates.sh: "
usage() { sed -n '2,26s/^# \{0,1\}//p' "$0"; }
bad_usage() { echo "record_updates.sh: $*" >&2; echo "(tests/bench/record_updates.sh --help)" >&2; exit 2; }

seconds=60 workers=3 data=mnist model=paper-cnn out="" worker_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="${2:-}"; shift 2 || bad_usage "--seconds needs a value" ;;
    --workers) workers="${2:-}"; shift 2 || bad_usage "--workers needs a value" ;;
    --data) data="${2:-}"; shift 2 || bad_usage "--data needs a value" ;;
    --model) model="${2:-}"; shift 2 || bad_usage "--model needs a value" ;;
    -h|--help) usage; exit 0 ;;
    --) shift; worker_flags=("$@"); break ;;
    -*) bad_usage "unknown option '$1'" ;;
    *) [ -z "$out" ] || bad_usage "one output file, not '$out' and '$1'"; out="$1"; shift ;;
  esac
done
[ -n "$out" ] || bad_usage "no output file given (OUT)"
[[ "$seconds" =~ ^[0-9]+$ ]] && [ "$seconds" -ge 1 ] || bad_usage "--seconds must be a whole number of seconds >= 1"
[[ "$workers" =~ ^[0-9]+$ ]] && [ "$workers" -ge 1 ] && [ "$workers" -le 16 ] || bad_usage "--workers must be 1..16"
out_dir=$(dirname -- "$out")
[ -d "$out_dir" ] && [ -w "$out_dir" ] || bad_usage "cannot write into $out_dir (the directory of OUT)"
out=$(realpath -- "$out_dir")/$(basename -- "$out")
deps=${EDGETRAIN_DEPS:-/var/cache/edgetrain}
case "$data" in
  mnist) data_dir=$deps/mnist-full ;;
  mnist-small) data_dir=$deps/mnist-small ;;
  fashion-mnist) data_dir=/usr/share/datasets/fashion-mnist ;;
  *) data=$(realpath -- "$data") data_dir=$data ;;
esac
ls "$data_dir"/train-images-idx3-ubyte* >/dev/null 2>&1 ||
  { echo "record_updates.sh: no training images in $data_dir (--data $data; ./build.sh setup fetches MNIST)" >&2; exit 1; }

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source common/processes.sh
build=${EDGETRAIN_BUILD:-build/host}
server=$build/programs/edgetrain-server
worker=$build/programs/edgetrain-worker
for program in "$server" "$worker"; do
  [[ -x $program ]] || { echo "record_updates.sh: missing $program: build the host preset first" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/edgetrain-record.XXXXXX")
trap 'stop_started_programs 5; rm -rf "$work"' EXIT

for i in $(seq 0 $((workers - 1))); do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
# --checkpoint-every 0: no checkpoint before the stop, so wal.log holds every update of the
# run (a checkpoint rewrites it with only the last D records; server/README.md). D as
# run_pull_ingress_bench.sh: 4 per worker, at least the default 64, so that little is refused.
max_staleness=$((workers * 4 > 64 ? workers * 4 : 64))
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model "$model" --eval-data none --max-staleness "$max_staleness" --checkpoint-every 0
echo "server on 127.0.0.1:$server_port; $workers workers train $model on $data for $seconds s"
worker_pids=()
for i in $(seq 0 $((workers - 1))); do
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "$worker" --config "$work/w$i.toml" \
    --server "coaps://127.0.0.1:$server_port" --model "$model" --data "$data" --worker-id "$i" --workers "$workers" \
    --duration "$seconds" --quiet ${worker_flags[@]+"${worker_flags[@]}"}
  worker_pids+=("$last_pid")
done
# Each worker stops itself after --duration; a minute on top for loading the data and the
# first model pull on a busy machine.
for pid in "${worker_pids[@]}"; do
  wait_for_exit "$pid" $((seconds + 60)) || fail "a worker exited with status $? (the logs follow)"
done

# The workers are gone, so nothing appends to the log any more; copied before the server
# stops, because its final checkpoint rewrites wal.log (the full log then lives on as
# wal.prev.log, an internal detail this script need not depend on).
cp -- "$work/state/wal.log" "$work/recorded.wal"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 60 || fail "the server exited with status $? when stopped"
version=$(json_get "$server_stats" version) || fail "no final stats from the server"
[ "$version" -gt 0 ] || fail "the server accepted no update in $seconds s: nothing to record"
mv -f -- "$work/recorded.wal" "$out"
steps=0
for i in $(seq 0 $((workers - 1))); do steps=$((steps + $(json_get "$work/w$i.stats.json" steps || echo 0))); done
echo "recorded $version updates ($workers workers, $steps steps) in $out ($(stat -c %s "$out") bytes)"
echo "replay: BENCH_REPLAY=$out tests/bench/run_server_bench.sh"
