#!/usr/bin/env bash
# The aarch64 smoke client, run under qemu-aarch64, against the host smoke server over
# DTLS-PSK on loopback.  usage: qemu_client_to_host_server.sh HOST_SMOKE CROSS_SMOKE EMULATOR...
set -euo pipefail
host_smoke="$1"; cross_smoke="$2"; shift 2
[ -x "$host_smoke" ] || { echo "host server $host_smoke not built: build the host preset first" >&2; exit 1; }
work=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

"$host_smoke" serve --port 0 --port-file "$work/port" --requests 2 --timeout 120 &
server_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "host server did not start" >&2; exit 1; }
port=$(cat "$work/port")

echo "running: $* $cross_smoke request --port $port"
"$@" "$cross_smoke" request --port "$port" --size 5000 | tee "$work/client.out"
grep -q 'client (aarch64): POST /echo 5000 B -> 2.04, echo correct' "$work/client.out"
grep -q 'hello smoke-device from x86_64' "$work/client.out"
wait "$server_pid"
server_pid=""
echo "aarch64 client under QEMU and host server agree"
