#!/usr/bin/env bash
# MD-GAN on one machine (edgetrain-server --mode gan, edgetrain-worker --mode gan): the
# server holds the generator, N workers on loopback each train a discriminator on their shard
# of MNIST and send the server their error feedback; every --swap-every iterations they swap
# discriminators peer to peer. Every identity is a certificate from one fleet CA
# (boards/fleet-certificates.sh). Runs for a bounded time with a progress line; the grid of
# generated digits (one column per class) is OUT/state/gan/samples.png, and with the paper
# CNN classifier of experiments/train-classifier.sh present its scores are OUT/state/gan/metrics.csv
# and OUT/state/gan/scores.svg.
#
#   demo/run-gan.sh [--workers N] [--duration S] [--batch B] [--k K] [--swap-every I] [--fp16]
#                   [--out DIR] [-- SERVER OPTIONS...]
#   defaults: 4 workers, 120 s, b = 32, k = 1, swaps every 200 iterations, fp32 values both
#   ways (--fp16: batches and feedback as fp16), gan-results/.
#   For example: demo/run-gan.sh --workers 3 --duration 60 -- --gan-fp16
#
# Needs build/host (./build.sh build host).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail_prefix="run-gan.sh: "
source common/processes.sh

workers=4 duration=120 batch=32 k=1 swap_every=200 out=gan-results fp16=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers="${2:?}"; shift 2 ;;
    --duration) duration="${2:?}"; shift 2 ;;
    --batch) batch="${2:?}"; shift 2 ;;
    --k) k="${2:?}"; shift 2 ;;
    --swap-every) swap_every="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --fp16) fp16=(--gan-fp16); shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "run-gan.sh: unknown argument '$1' (server options go after --)" >&2; exit 2 ;;
  esac
done
for v in workers duration batch k swap_every; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "run-gan.sh: --${v/_/-} must be a number" >&2; exit 2; }
done
[ "$workers" -ge 2 ] || { echo "run-gan.sh: --workers must be at least 2 (discriminators are swapped)" >&2; exit 2; }
[ "$duration" -ge 10 ] || { echo "run-gan.sh: --duration must be >= 10 s" >&2; exit 2; }

bin=build/host
for f in programs/edgetrain-server programs/edgetrain-worker programs/edgetrain-topology; do
  [ -x "$bin/$f" ] || { echo "run-gan.sh: $bin/$f is not built (./build.sh build host)" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out"
trap stop_started_programs EXIT

names=()
for ((i = 0; i < workers; i++)); do names+=("gan-$i"); done
bash boards/fleet-certificates.sh "$out/certs" server=edgetrain-server "${names[@]}" >/dev/null
base=$(free_udp_ports "$workers")
"$bin/programs/edgetrain-topology" --kind full --peers "$workers" --name-prefix gan- --addresses '127.0.0.1:{port}' \
  --base-port "$base" --out "$out/topology.json" >/dev/null

classifier=${EDGETRAIN_DEPS:-/var/cache/edgetrain}/classifiers/paper-cnn-mnist.safetensors
scoring=()
[ -f "$classifier" ] && scoring=(--gan-classifier "$classifier" --eval-data mnist)
start_server "$bin/programs/edgetrain-server" "$out/server.log" --port 0 --state-dir "$out/state" \
  --cert "$out/certs/server.crt" --cert-key "$out/certs/server.key" --ca "$out/certs/ca.crt" \
  --mode gan --gan-workers "$workers" --gan-k "$k" --gan-batch "$batch" --gan-swap-every "$swap_every" \
  --gan-eval-every 200 --stop-after-seconds "$duration" ${scoring[@]+"${scoring[@]}"} ${fp16[@]+"${fp16[@]}"} "$@"
for ((i = 0; i < workers; i++)); do
  start_program "$out/worker-$i.log" "$bin/programs/edgetrain-worker" --mode gan --server "coaps://127.0.0.1:$server_port" \
    --cert "$out/certs/gan-$i.crt" --cert-key "$out/certs/gan-$i.key" --ca "$out/certs/ca.crt" \
    --topology "$out/topology.json" --peer-name "gan-$i" --data mnist --batch "$batch" --worker-id "$i" \
    --workers "$workers" --stats-file "$out/worker-$i.json" --quiet --give-up-after 30 ${fp16[@]+"${fp16[@]}"}
done
echo "MD-GAN: $workers workers, b = $batch, k = $k for $duration s (logs in $out/)"
while kill -0 "$server_pid" 2>/dev/null && ! is_zombie "$server_pid"; do
  line=$(jq -r '"iteration " + (.gan.iteration | tostring) + "  feedbacks " + (.gan.feedbacks | tostring)
                + "  dropped " + (.gan.dropped | tostring) + "  swap rounds " + (.gan.swap_rounds | tostring)' \
         "$server_stats" 2>/dev/null || true)
  printf '\r%-100s' "$line"
  sleep 1
done
echo
stop_started_programs 5
echo "generated digits (a column per class): $out/state/gan/samples.png"
[ -f "$out/state/gan/metrics.csv" ] && echo "scores: $out/state/gan/metrics.csv, $out/state/gan/scores.svg" &&
  tail -1 "$out/state/gan/metrics.csv"
exit 0
