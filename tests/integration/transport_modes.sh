#!/usr/bin/env bash
# The programs' transport modes end to end on loopback:
#  1. plain CoAP needs --insecure on both sides: edgetrain-worker refuses a coap:// URI
#     without it, and a server without it opens no plaintext socket at all;
#  2. a worker trains the MLP against an --insecure server over plain CoAP, its updates
#     keyed on 'unauthenticated:NAME';
#  3. X.509: a server with --cert/--cert-key/--ca and no keystore, a worker with a certificate
#     from the same CA trains (identity = the certificate's CN); a worker whose
#     certificate comes from another CA gets nothing accepted and exits with status 11.
# usage: transport_modes.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
common_worker_flags=(--model mlp --data mnist-small --worker-id 0 --workers 1 --quiet)

# udp_sockets PID: how many UDP sockets the process holds (from /proc, no root needed).
udp_sockets() {
  local inodes count=0 inode
  inodes=$(find "/proc/$1/fd" -lname 'socket:*' -printf '%l\n' 2>/dev/null | sed -E 's/socket:\[([0-9]+)\]/\1/')
  for inode in $inodes; do
    if awk -v i="$inode" 'NR > 1 && $10 == i { found = 1 } END { exit !found }' /proc/net/udp /proc/net/udp6; then
      count=$((count + 1))
    fi
  done
  echo "$count"
}

# check_trained STATS STEPS: the worker stopped normally with every one of STEPS updates acknowledged.
check_trained() {
  [ "$(json_get "$1" state)" = stopped ] && [ "$(json_get "$1" steps)" -eq "$2" ] &&
    [ "$(json_get "$1" updates_accepted)" -eq "$2" ] || fail "worker of $1 did not get all $2 updates accepted"
  [ "$(acknowledged_versions "$1" | wc -l)" -eq "$2" ] ||
    fail "worker of $1 has $(acknowledged_versions "$1" | wc -l) acknowledged versions, not $2"
}

# ---- 1. the flag is required on both sides ------------------------------------------------
add_device "$server" "$work/keys.toml" w-psk "$work/w-psk.toml"
if "$worker" --server coap://127.0.0.1:5683 --identity w-plain "${common_worker_flags[@]}" --steps 1 \
  >"$work/no-flag.log" 2>&1; then
  fail "the worker accepted a coap:// URI without --insecure"
fi
grep -q "refusing plain CoAP" "$work/no-flag.log" || fail "no clear error without --insecure: $(cat "$work/no-flag.log")"
if "$worker" --server coaps://127.0.0.1:5684 --insecure --identity w-plain "${common_worker_flags[@]}" --steps 1 \
  >"$work/flag-on-dtls.log" 2>&1; then
  fail "the worker accepted --insecure with a coaps:// URI"
fi

# The event loop's datagrams per pass comes from a flag or the config file; out of range,
# either way, is a clear error before any state is made.
printf 'datagrams_per_pass = 5000\n' >"$work/bad-pass.toml"
if "$server" --config "$work/bad-pass.toml" --state-dir "$work/state-bad" --keystore "$work/keys.toml" --model mlp \
     >"$work/bad-pass.log" 2>&1; then
  fail "the server accepted datagrams_per_pass = 5000"
fi
grep -q "datagrams_per_pass): datagrams-per-pass must be in 1..1024" "$work/bad-pass.log" && [ ! -e "$work/state-bad" ] ||
  fail "no clear error for datagrams_per_pass = 5000, or state was made: $(cat "$work/bad-pass.log")"

printf 'datagrams_per_pass = 4\n' >"$work/pass.toml"
# One DTLS socket per event loop, all on the one port (SO_REUSEPORT).
start_server "$server" "$work/dtls-only.log" --port 0 --state-dir "$work/state-dtls" --keystore "$work/keys.toml" --model mlp \
  --config "$work/pass.toml" --loop-threads 3
[ "$(udp_sockets "$server_pid")" -eq 3 ] || fail "a DTLS-only server with 3 loops holds $(udp_sockets "$server_pid") UDP sockets, not 3"
[ "$(json_get "$server_stats" port)" = "$server_port" ] && [ "$(jq '.loops | length' "$server_stats")" = 3 ] ||
  fail "the stats file does not name the port file's port and 3 event loops: $(cat "$server_stats")"
[ "$(json_get "$server_stats" insecure_port)" = null ] || fail "a DTLS-only server reports a plain CoAP port"
! grep -q "plain CoAP" "$work/dtls-only.log" || fail "a DTLS-only server mentions plain CoAP"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the DTLS-only server exited with status $?"

# ---- 2. a worker trains against an --insecure server over plain CoAP -----------------------
start_server "$server" "$work/insecure.log" --port 0 --insecure --insecure-port 0 --state-dir "$work/state-insecure" \
  --keystore "$work/keys.toml" --model mlp --loop-threads 1
grep -q "WARNING: --insecure: plain CoAP on 127.0.0.1:[0-9]* with NO encryption" "$work/insecure.log" ||
  fail "no start-up warning for --insecure"
plain_port=$(json_get "$server_stats" insecure_port)
[[ "$plain_port" =~ ^[1-9][0-9]*$ ]] && [ "$plain_port" != "$server_port" ] || fail "plain CoAP on the DTLS port"
[ "$(udp_sockets "$server_pid")" -eq 2 ] || fail "an --insecure server holds $(udp_sockets "$server_pid") UDP sockets, not 2"
start_worker "$work/w-plain.log" "$work/w-plain.stats.json" "$worker" --server "coap://127.0.0.1:$plain_port" --insecure --identity w-plain \
  "${common_worker_flags[@]}" --steps 15
wait_for_exit "$last_pid" 60 || fail "the plain CoAP worker exited with status $?"
check_trained "$work/w-plain.stats.json" 15
grep -q "WARNING: --insecure" "$work/w-plain.log" || fail "the worker gave no warning for --insecure"
grep -q "first request from 'unauthenticated:w-plain' over plain CoAP from 127.0.0.1:[0-9]*: the identity is declared, NOT authenticated" \
  "$work/insecure.log" || fail "the server did not log the plain CoAP worker as unauthenticated"
# The DTLS endpoint of the same server keeps working next to it.
start_worker "$work/w-psk.log" "$work/w-psk.stats.json" "$worker" --config "$work/w-psk.toml" --server "coaps://127.0.0.1:$server_port" \
  "${common_worker_flags[@]}" --steps 5
wait_for_exit "$last_pid" 60 || fail "the PSK worker exited with status $?"
check_trained "$work/w-psk.stats.json" 5
[ "$(acknowledged_versions "$work/w-psk.stats.json" | tail -n1)" -eq 20 ] || fail "the server did not reach version 20"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the insecure server exited with status $?"

# ---- 3. X.509 certificates ----------------------------------------------------------------
bash "$(dirname "$0")/make_test_certificates.sh" "$work/pki" w-cert || fail "could not make certificates"
pki="$work/pki"
# Server and worker take the certificate settings from their TOML files here, the
# stranger below from flags.
printf 'cert = "%s"\ncert_key = "%s"\nca = "%s"\ncoap_ack_timeout = 2.0\n' \
  "$pki/server.crt" "$pki/server.key" "$pki/ca.crt" >"$work/server-x509.toml"
printf 'cert = "%s"\ncert_key = "%s"\nca = "%s"\n' \
  "$pki/w-cert.crt" "$pki/w-cert.key" "$pki/ca.crt" >"$work/w-cert.toml"
start_server "$server" "$work/x509.log" --port 0 --state-dir "$work/state-x509" --model mlp --config "$work/server-x509.toml"
grep -q "(CoAP over DTLS, X.509)" "$work/x509.log" || fail "the server does not say it serves X.509"
grep -q "CoAP timing: ACK_TIMEOUT 2 s" "$work/x509.log" || fail "coap_ack_timeout from the config was not applied"
start_worker "$work/w-cert.log" "$work/w-cert.stats.json" "$worker" --config "$work/w-cert.toml" --server "coaps://127.0.0.1:$server_port" \
  "${common_worker_flags[@]}" --steps 15
wait_for_exit "$last_pid" 60 || fail "the certificate worker exited with status $?"
check_trained "$work/w-cert.stats.json" 15
grep -q "first request from 'w-cert'$" "$work/x509.log" || fail "the server did not see the certificate's CN as identity"
# A certificate from another CA: handshakes refused, nothing accepted, the worker gives up
# with the status of a refused handshake (11) before its --duration is over.
start_worker "$work/stranger.log" "$work/stranger.stats.json" "$worker" --server "coaps://127.0.0.1:$server_port" \
  --cert "$pki/stranger.crt" --cert-key "$pki/stranger.key" --ca "$pki/ca.crt" "${common_worker_flags[@]}" --duration 6
status=0
wait_for_exit "$last_pid" 60 || status=$?
[ "$status" -eq 11 ] || fail "the stranger worker exited with status $status, not 11 (handshake refused)"
[ "$(json_get "$work/stranger.stats.json" state)" = stopped ] && [ "$(json_get "$work/stranger.stats.json" updates_accepted)" -eq 0 ] ||
  fail "a certificate from another CA got updates accepted"
! grep -q "first request from 'stranger'" "$work/x509.log" || fail "the server served the stranger"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the X.509 server exited with status $?"
echo "plain CoAP only with --insecure on both sides; a worker trained over plain CoAP and one over X.509; another CA refused"
