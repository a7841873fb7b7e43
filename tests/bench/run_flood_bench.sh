#!/usr/bin/env bash
# Handshake-flood benchmark (transport/README.md, "Handshake floods"): a real
# edgetrain-server on 127.0.0.1 (paper CNN, fresh state on disk), and `edgetrain-loadgen flood`
# against it, which runs FLOOD_ROUNDS pairs of phases of FLOOD_SECONDS each, alternating,
# and prints them side by side: no flood (baseline), and FLOOD_RATE spoofed DTLS ClientHellos
# per second, each from a new loopback source address (127.1.x.y, fresh port: as spoofed
# ones arrive).
# In both, FLOOD_DEVICES established devices post paper-CNN AdaComp updates (their rate) and
# a separate process opens a fresh DTLS session every 0.25 s whose first request must be
# answered within 3 s (the share that was). The goals: during the flood, >= 95% of the new
# handshakes within 3 s, and >= 90% of the baseline's update rate. Builds nothing: assumes
# build/host. Prints figures; not a test.
#
# Settings (environment): EDGETRAIN_BUILD (build/host), FLOOD_RATE (1000), FLOOD_SECONDS
# (15), FLOOD_ROUNDS (2), FLOOD_DEVICES (16), FLOOD_IN_FLIGHT (8), FLOOD_STATE_PARENT (the
# build tree; /dev/shm puts the WAL on tmpfs, where fdatasync costs nothing, so that the
# server's CPU and not the disk bounds the update rate and the flood's CPU cost shows).
# Bounded by `timeout` (10 minutes).
set -euo pipefail

cd "$(dirname "$0")/../.."
source common/processes.sh
build=${EDGETRAIN_BUILD:-build/host}
rate=${FLOOD_RATE:-1000}
seconds=${FLOOD_SECONDS:-15}
rounds=${FLOOD_ROUNDS:-2}
devices=${FLOOD_DEVICES:-16}
in_flight=${FLOOD_IN_FLIGHT:-8}
server=$build/programs/edgetrain-server
loadgen=$build/tests/edgetrain-loadgen
for program in "$server" "$loadgen"; do
  [[ -x $program ]] || { echo "missing $program: build the host preset first" >&2; exit 1; }
done

work=$(mktemp -d "${FLOOD_STATE_PARENT:-$PWD/$build}/flood-bench.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$loadgen" keystore --out "$work/keys.toml" --devices "$devices" >/dev/null
# The server's default handshake limits: the established devices all come from 127.0.0.1,
# and their handshakes (before the phases start) fit its 25 pending per address.
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --eval-data none
echo "$(nproc) cores, $(uname -r); server pid $server_pid on port $server_port"
echo "server state on $(stat -f -c %T "$work")"
timeout 600 "$loadgen" flood --port "$server_port" --keystore "$work/keys.toml" --devices "$devices" \
  --posts-in-flight "$in_flight" --seconds "$seconds" --rounds "$rounds" --spoof-per-second "$rate" \
  --server-pid "$server_pid" \
  | tee "$work/flood.txt"
echo "server handshake counters: $(json_get "$server_stats" handshakes | tr '\n' ' ')"

field() { grep -o "$1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
line=$(grep '^summary flood' "$work/flood.txt")
echo
echo "| figure (${rate} spoofed ClientHellos/s, $devices devices, $rounds × ${seconds} s per condition) | no flood | flood | goal |"
echo "|---|---|---|---|"
printf '| new DTLS handshakes answered within 3 s | %s %% | %s %% (median %s s, p90 %s s) | ≥ 95 %% |\n' \
  "$(field baseline_handshakes_within_pct "$line")" "$(field flood_handshakes_within_pct "$line")" \
  "$(field flood_handshake_median_s "$line")" "$(field flood_handshake_p90_s "$line")"
printf '| updates/s of the established devices | %s | %s (%s %%) | ≥ 90 %% |\n' \
  "$(field baseline_updates_per_s "$line")" "$(field flood_updates_per_s "$line")" "$(field update_rate_pct "$line")"
