#!/usr/bin/env bash
# A device whose address changes mid-run (issue 38 part 4; a NAT rebinding): one worker
# trains through a link impairer, which is told (SIGUSR1) to replace its upstream socket, so
# the server sees the worker's datagrams come from a new source port. The server holds no
# DTLS session for that address: it drops them, the worker's request times out
# (--request-timeout, 5 s here, 60 s by default) and its next request starts a new handshake
# from the new address. Checked from the files the programs
# write: the worker keeps training (updates accepted after the rebinding), the server counts
# a second handshake, nothing acknowledged is lost (the server's version is at least every
# version the worker was acknowledged) and the worker's stats say how many retries it took.
# Prints the time until the server saw the new handshake.
# usage: worker_rebinding.sh SERVER WORKER IMPAIRER
server="$1"; worker="$2"; impairer="$3"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

wait_for_json() {  # FILE SECONDS JQ_CONDITION
  local deadline=$((SECONDS + $2))
  until [ -s "$1" ] && jq -e "$3" "$1" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$1 did not satisfy '$3' within $2 s: $(cat "$1" 2>&1 | head -c 600)"
    sleep 0.1
  done
}

add_device "$server" "$work/keys.toml" w0 "$work/w0.toml"
start_program "$work/server.log" "$server" --listen 127.0.0.1 --port 0 --state-dir "$work/state" \
  --keystore "$work/keys.toml" --model mlp --port-file "$work/server.port" --stats-file "$work/server.json"
server_pid=$last_pid
wait_for_json "$work/server.json" 30 '.state == "running"'
port=$(cat "$work/server.port")
cat >"$work/links.toml" <<EOT
[[link]]
name = "w0"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:$port"
EOT
start_program "$work/impairer.log" "$impairer" --links "$work/links.toml" --port-file "$work/impairer.json" \
  --stats "$work/links.csv" --stats-interval 0.2
impairer_pid=$last_pid
wait_for_json "$work/impairer.json" 30 '.links.w0'
link=$(jq -r .links.w0 "$work/impairer.json")

start_program "$work/w0.log" "$worker" --config "$work/w0.toml" --server "coaps://$link" --model mlp \
  --data mnist-small --quiet --duration 60 --request-timeout 5 --stats-file "$work/w0.json"
w0=$last_pid
wait_for_json "$work/w0.json" 30 '.updates_accepted >= 20'
handshakes_before=$(json_get "$work/server.json" handshakes.client_hellos_admitted)
before=$(json_get "$work/w0.json" updates_accepted)
echo "before the rebinding: $before updates accepted, $handshakes_before handshakes admitted"
kill -USR1 "$impairer_pid"
started=$(date +%s.%N)
# The new session from the new address (the server's stats file: at least once a second).
wait_for_json "$work/server.json" 30 ".handshakes.client_hellos_admitted > $handshakes_before"
recovered=$(date +%s.%N)
after=$(json_get "$work/w0.json" updates_accepted)
wait_for_json "$work/w0.json" 30 ".updates_accepted >= $((after + 20))"
kill -TERM "$w0"; wait_for_exit "$w0" 30 || fail "the worker exited with status $?"
highest=$(json_get "$work/w0.json" acknowledged_highest)
kill -TERM "$server_pid"; wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
version=$(json_get "$work/server.json" version)
[ "$version" -ge "$highest" ] || fail "the server is at version $version, below the acknowledged $highest"
[ "$(json_get "$work/w0.json" acknowledged_increasing)" = true ] || fail "acknowledged versions went back"
seconds=$(awk -v a="$started" -v b="$recovered" 'BEGIN { printf "%.1f", b - a }')
echo "PASS: rebound; a new handshake within $seconds s of it (the server's stats file, written every second; worker retries $(json_get "$work/w0.json" retries)), then 20 more updates accepted; server version $version >= acknowledged $highest"
