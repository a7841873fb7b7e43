#!/usr/bin/env bash
# Time and bytes per update with Q-Block (RFC 9177) against RFC 7959 Block1/Block2, behind
# the link impairer at several loss rates (issue 36): for each loss rate, one
# edgetrain-server and one edgetrain-worker (MODEL, sign + scale, a pull before every
# step) through edgetrain-link-impairer, once with --q-block=false on both programs and once
# with Q-Block, STEPS steps each (the handshake and the first, dense, pull included: both
# runs pay them). Prints one line per run and a table: seconds per update (the worker's
# wall time over its steps), the server socket's bytes in and out per update, and the
# datagrams the impairer dropped. Builds nothing: assumes build/host (edgetrain-server,
# edgetrain-worker, edgetrain-link-impairer). Prints figures; not a test.
#
# Settings (environment): EDGETRAIN_BUILD (build/host), LOSS_RATES ("0 0.01 0.05 0.10"),
# STEPS (10), MODEL (mlp: paper-cnn's first, dense, pull alone is 1,648 Block2 exchanges,
# ~200 s at 5% loss), DELAY_MS (0: the one-way delay; the cost of a loss is then the retransmission
# timeout, 1-1.5 s, not the round trip), SEED (1: the impairer's loss draws).
set -euo pipefail
cd "$(dirname "$0")/.."
source common/processes.sh
build=${EDGETRAIN_BUILD:-build/host}
loss_rates=${LOSS_RATES:-0 0.01 0.05 0.10}
steps=${STEPS:-10}
model=${MODEL:-mlp}
delay_ms=${DELAY_MS:-0}
seed=${SEED:-1}
server=$build/programs/edgetrain-server
worker=$build/programs/edgetrain-worker
impairer=$build/programs/edgetrain-link-impairer
for program in "$server" "$worker" "$impairer"; do
  [[ -x $program ]] || { echo "missing $program: build it in the host preset first" >&2; exit 1; }
done
work=$(mktemp -d "$PWD/$build/q-block-loss.XXXXXX")
trap 'stop_started_programs 5; rm -rf "$work"' EXIT
add_device "$server" "$work/keys.toml" w0 "$work/w0.toml"

# run NAME LOSS FLAG: one server, impairer and worker; appends a line to $work/results.
run() {
  local name=$1 loss=$2 flag=$3 dir="$work/$1-$2"
  mkdir -p "$dir"
  start_server "$server" "$dir/server.log" --port 0 --state-dir "$dir/state" --keystore "$work/keys.toml" \
    --model "$model" --eval-data none "$flag"
  printf '[[link]]\nname = "w0"\nlisten = "127.0.0.1:0"\nupstream = "127.0.0.1:%s"\ndelay_ms = %s\nloss = %s\nseed = %s\n' \
    "$server_port" "$delay_ms" "$loss" "$seed" >"$dir/links.toml"
  start_program "$dir/impairer.log" "$impairer" --links "$dir/links.toml" --port-file "$dir/impairer.json" \
    --stats "$dir/links.csv" --stats-interval 0.5
  local impairer_pid=$last_pid
  local link="" start end
  for _ in $(seq 300); do
    link=$(jq -r '.links.w0 // empty' "$dir/impairer.json" 2>/dev/null || true)
    [ -n "$link" ] && break
    sleep 0.1
  done
  [ -n "$link" ] || fail "the link impairer wrote no port file"
  start=$(date +%s.%N)
  start_worker "$dir/w0.log" "$dir/w0.stats.json" "$worker" --config "$work/w0.toml" --server "coaps://$link" \
    --model "$model" --data mnist --worker-id 0 --workers 1 --sign-scale --steps "$steps" --quiet "$flag"
  wait_for_exit "$last_pid" 3600 || echo "$name at loss $loss: the worker exited with status $?" >&2
  end=$(date +%s.%N)
  kill -TERM "$server_pid" "$impairer_pid"
  wait_for_exit "$server_pid" 30 || true
  wait_for_exit "$impairer_pid" 30 || true
  local updates in out dropped
  updates=$(json_get "$server_stats" version)
  in=$(json_get "$server_stats" ingress_socket_bytes)
  out=$(json_get "$server_stats" egress_socket_bytes)
  dropped=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /dropped_loss$/) c[i] = 1; next }
                     { last = $0 } END { n = split(last, f, ","); s = 0; for (i in c) s += f[i]; print s }' "$dir/links.csv")
  awk -v n="$name" -v l="$loss" -v u="$updates" -v t="$(echo "$end - $start" | bc)" -v i="$in" -v o="$out" -v d="$dropped" \
    'BEGIN { printf "%s loss=%s updates=%d seconds_per_update=%.2f in_bytes_per_update=%.0f out_bytes_per_update=%.0f dropped=%s\n", n, l, u, t / u, i / u, o / u, d }' |
    tee -a "$work/results"
}

echo "model $model, sign + scale, 1 worker, $steps steps per run, one-way delay $delay_ms ms, seed $seed, $(nproc) cores"
for loss in $loss_rates; do
  run rfc7959 "$loss" --q-block=false
  run q-block "$loss" --q-block=true
done
echo
echo "| loss each way | s / update: RFC 7959 | Q-Block | server in B / update: RFC 7959 | Q-Block | server out B / update: RFC 7959 | Q-Block | dropped: RFC 7959 | Q-Block |"
echo "|---|---|---|---|---|---|---|---|---|"
for loss in $loss_rates; do
  field() { grep "^$1 loss=$loss " "$work/results" | grep -o "$2=[0-9.]*" | cut -d= -f2; }
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$loss" \
    "$(field rfc7959 seconds_per_update)" "$(field q-block seconds_per_update)" \
    "$(field rfc7959 in_bytes_per_update)" "$(field q-block in_bytes_per_update)" \
    "$(field rfc7959 out_bytes_per_update)" "$(field q-block out_bytes_per_update)" \
    "$(field rfc7959 dropped)" "$(field q-block dropped)"
done
