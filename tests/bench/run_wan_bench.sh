#!/usr/bin/env bash
# WAN timing benchmark: a real edgetrain-server on 127.0.0.1 (paper CNN, fresh state), and
# edgetrain-loadgen wan through the user-space UDP relay (tests/support/udp_delay_proxy.h) with a
# one-way delay and a loss rate in each direction, once with RFC 7252's CoAP timing and
# once with edgetrain's WAN default (transport/README.md, "Timing"). The relay's losses are
# seeded, the same seed for both. Prints every trial and a table. Builds nothing: assumes
# build/host. Prints figures; not a test.
#
# Settings (environment): EDGETRAIN_BUILD (build/host), WAN_DELAY_MS (50), WAN_LOSS (0.05),
# WAN_TRIALS (20), WAN_SEED (1). Each run is bounded by `timeout` (10 minutes).
set -euo pipefail

cd "$(dirname "$0")/../.."
source common/processes.sh
build=${EDGETRAIN_BUILD:-build/host}
delay=${WAN_DELAY_MS:-50}
loss=${WAN_LOSS:-0.05}
trials=${WAN_TRIALS:-20}
seed=${WAN_SEED:-1}
server=$build/programs/edgetrain-server
loadgen=$build/tests/edgetrain-loadgen
for program in "$server" "$loadgen"; do
  [[ -x $program ]] || { echo "missing $program: build the host preset first" >&2; exit 1; }
done

work=$(mktemp -d "$PWD/$build/wan-bench.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$loadgen" keystore --out "$work/keys.toml" --devices 0 >/dev/null
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" --eval-data none
port=$server_port

: >"$work/wan.txt"
for timing in rfc7252 wan; do
  timeout 600 "$loadgen" wan --port "$port" --keystore "$work/keys.toml" --delay-ms "$delay" --loss "$loss" \
    --trials "$trials" --seed "$seed" --timing "$timing" | tee -a "$work/wan.txt"
done

field() { grep -o "$1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
echo
echo "| CoAP timing ($delay ms one way, loss $loss each way, $trials trials) | handshake median / mean | update median / mean / p90 | failed |"
echo "|---|---|---|---|"
while read -r line; do
  printf '| %s | %.2f / %.2f s | %.2f / %.2f / %.2f s | %s |\n' "$(field label "$line")" \
    "$(field handshake_median_s "$line")" "$(field handshake_mean_s "$line")" "$(field update_median_s "$line")" \
    "$(field update_mean_s "$line")" "$(field update_p90_s "$line")" "$(field failed "$line")"
done < <(grep '^summary wan' "$work/wan.txt")
