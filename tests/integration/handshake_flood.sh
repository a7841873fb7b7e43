#!/usr/bin/env bash
# A DTLS handshake flood against the real edgetrain-server (transport/README.md, "Handshake
# floods"): 500 ClientHellos as fast as they go, each from a new loopback source address
# (the flood that used to lock every new device out for half a minute at 101), then a
# steady 1000 per second while a new worker trains: the worker's first update must be
# acknowledged within 10 s of its start (data loading and training included), and, when
# Debian's coap-client-openssl is installed, a fresh session of that OpenSSL client must be
# answered within its 3 s wait. Afterwards no handshake is pending and the server's resident
# memory is within 4 MB of what it was before the flood. Everything is read from the
# programs' stats files and /proc, no log line. MEMORY_CHECK "off" (the sanitizer tree)
# skips the memory comparison: AddressSanitizer keeps every freed block in its quarantine,
# so there resident memory grows with any activity at all.
# usage: handshake_flood.sh SERVER WORKER LOADGEN [MEMORY_CHECK [COAP_CLIENT]]
server="$1"; worker="$2"; loadgen="$3"; memory_check="${4:-on}"; client="${5:-coap-client-openssl}"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status"; }
handshakes() { json_get "$server_stats" "handshakes.$1"; }

for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
# coap-client takes -k literally: a device with a printable key, written like the keystore's.
interop_key=edgetrain-flood-psk-0123456789ab
printf 'interop = "%s"\n' "$(printf '%s' "$interop_key" | od -An -tx1 | tr -d ' \n')" >>"$work/keys.toml"
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model mlp --eval-data none
worker_args=(--server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --workers 2 --steps 3 --quiet)

# Warm-up: a worker trains 3 steps, so that what a session costs the server is in the baseline.
start_program "$work/w0.log" "$worker" --config "$work/w0.toml" "${worker_args[@]}" --worker-id 0 --stats-file "$work/w0.json"
wait_for_exit "$last_pid" 60 || fail "the warm-up worker exited with status $?"
sleep 1
baseline=$(rss_kb)
echo "server resident memory before the flood: $baseline kB"

"$loadgen" spoof --port "$server_port" --count 500 --per-second 0 || fail "the burst of ClientHellos failed"
start_program "$work/flood.log" "$loadgen" spoof --port "$server_port" --per-second 1000 --seconds 8
flood_pid=$last_pid

started=$SECONDS
start_program "$work/w1.log" "$worker" --config "$work/w1.toml" "${worker_args[@]}" --worker-id 1 --stats-file "$work/w1.json"
w1=$last_pid
wait_for_json "$work/w1.json" updates_accepted -ge 1 10 "$w1" ||
  fail "the new worker got no update acknowledged within 10 s of its start during the flood"
echo "ok: a new worker's first update was acknowledged $((SECONDS - started)) s after its start, during the flood"
if command -v "$client" >/dev/null; then
  timeout 10 "$client" -B 3 -v 0 -m get -u interop -k "$interop_key" "coaps://127.0.0.1:$server_port/status" \
    >"$work/status.json" 2>&1 || true
  grep -q '"version"' "$work/status.json" ||
    fail "$client got no /status within 3 s during the flood: $(head -c 300 "$work/status.json")"
  echo "ok: $client (OpenSSL) completed a handshake within 3 s during the flood"
else
  echo "note: $client not installed, the OpenSSL client's handshake was not tried"
fi
wait_for_exit "$w1" 60 || fail "worker 1 exited with status $?"
wait_for_exit "$flood_pid" 30 || fail "the flood exited with status $?"

wait_for_json "$server_stats" handshakes.hello_verify_requests -ge 5000 10 "$server_pid" ||
  fail "the server answered only $(handshakes hello_verify_requests) of the 8500+ ClientHellos with a cookie"
wait_for_json "$server_stats" handshakes.pending -eq 0 15 "$server_pid" ||
  fail "$(handshakes pending) handshakes still pending after the flood"
echo "ok: $(handshakes hello_verify_requests) ClientHellos answered statelessly, $(handshakes client_hellos_admitted) admitted, none pending"
sleep 1
after=$(rss_kb)
echo "server resident memory after the flood: $after kB (before: $baseline kB)"
if [ "$memory_check" = on ]; then
  [ "$after" -le $((baseline + 4096)) ] || fail "the server's memory grew by $((after - baseline)) kB over the flood"
else
  echo "note: memory not compared (sanitizer build)"
fi
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
echo "a handshake flood locked nobody out and left no state behind"
