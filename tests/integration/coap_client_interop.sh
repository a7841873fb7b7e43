#!/usr/bin/env bash
# A standard CoAP client on another TLS stack talks to edgetrain-server: Debian's
# coap-client-openssl (libcoap over OpenSSL; the server is libcoap over Mbed TLS) does
# GET coaps://127.0.0.1:PORT/status with DTLS-PSK and gets the status JSON.
# usage: coap_client_interop.sh SERVER [COAP_CLIENT]
server="$1"; client="${2:-coap-client-openssl}"
source "$(dirname "$0")/process_test_lib.sh"
if ! command -v "$client" >/dev/null; then
  echo "SKIP: $client not installed (Debian package libcoap3-bin; toolchains/setup-deps.sh installs it)"
  exit 77
fi

# coap-client takes the key as the literal bytes of its -k argument, so this device gets a
# printable key, written in the keystore's format (hex of the bytes, file mode 0600).
identity=interop-client
key=edgetrain-interop-psk-0123456789
(umask 077 && printf '[devices]\n%s = "%s"\n' "$identity" "$(printf '%s' "$key" | od -An -tx1 | tr -d ' \n')" \
  >"$work/keys.toml")
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" --model mlp

# -B bounds the wait; -v 4 keeps its log to warnings. The server answers /status in one
# block-wise body that coap-client reassembles.
timeout 30 "$client" -B 20 -v 4 -m get -u "$identity" -k "$key" "coaps://127.0.0.1:$server_port/status" \
  >"$work/status.json" 2>"$work/client.log" || { cat "$work/client.log" >&2; fail "$client failed (status $?)"; }
cat "$work/status.json"
python3 - "$work/status.json" <<'PY' || fail "the reply is not the server's status JSON"
import json, sys
status = json.load(open(sys.argv[1]))
assert status["model"] == "mlp", status
assert status["version"] == 0, status
# It only read /status: a monitor, not a worker.
assert status["workers_seen"] == [] and status["monitors"] == ["interop-client"], status
assert status["ingress_socket_datagrams"] >= 4, status  # its handshake and request were counted
PY
grep -q "first request from 'interop-client'" "$work/server.log" || fail "the server did not log the client"

# A wrong key fails the handshake, and the server keeps serving.
if timeout 30 "$client" -B 5 -v 0 -m get -u "$identity" -k "not-the-key-0123456789abcdef" \
  "coaps://127.0.0.1:$server_port/status" >"$work/refused.out" 2>&1 && grep -q '"version"' "$work/refused.out"; then
  fail "a wrong key got the status"
fi
kill -0 "$server_pid" || fail "the server died"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
echo "coap-client-openssl read /status from edgetrain-server over DTLS-PSK"
