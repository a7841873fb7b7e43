#!/usr/bin/env bash
# edgetrain-worker's failures, each with its exit status (worker/worker_exit_codes.h) and a
# message naming the cause (issue 12):
#   - --help lists every exit status, and the man page and worker/README.md list the same;
#     the systemd unit does not restart after the permanent ones;
#   - a key longer than 32 bytes: refused at start, naming the limit (2);
#   - a port that receives and never answers (a firewall): "no answer from HOST:PORT" (10),
#     within --request-timeout instead of libcoap's 31 s handshake;
#   - a closed port: "nothing listens on HOST:PORT" (10); with --log-level error, only that;
#   - a wrong key: the handshake refused (11), after --max-refusals tries;
#   - an identity the server does not know (12);
#   - another model than the server's (13);
#   - the server SIGKILLed mid-run: given up after --give-up-after seconds (14);
#   - SIGTERM during a handshake with a silent port: exits within 1.5 s, and a run that
#     applied nothing ends non-zero (15).
# The exit statuses are what this test asserts; the log lines are checked only for the
# words a person needs (the address, the cause).
# usage: worker_failures.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
repo="$(cd "$(dirname "$0")/../.." && pwd)"

# ---- exit statuses documented where people look ----------------------------------------
"$worker" --help >"$work/help.txt" || fail "--help failed"
codes=$(sed -n '/^Exit status:/,$p' "$work/help.txt" | sed -nE 's/^ *([0-9]+)  .*/\1/p')
[ "$(echo "$codes" | tr '\n' ' ')" = "0 1 2 10 11 12 13 14 15 " ] || fail "--help lists exit statuses '$codes'"
for code in $codes; do
  grep -qx "\.B $code" "$repo/boards/packaging/edgetrain-worker.1" || fail "the man page does not list exit status $code"
  grep -qE "^ *\| \`$code\` \|" "$repo/worker/README.md" || fail "worker/README.md does not list exit status $code"
done
permanent=$(sed -n '/^Exit status:/,$p' "$work/help.txt" | sed -nE 's/^ *([0-9]+)  .*\[permanent.*/\1/p' | tr '\n' ' ')
grep -qx "RestartPreventExitStatus=${permanent% }" "$repo/boards/packaging/edgetrain-worker.service.in" ||
  fail "the systemd unit does not hold RestartPreventExitStatus=${permanent% } (the permanent statuses of --help)"
echo "ok: --help, the man page and worker/README.md list exit statuses $(echo $codes); the unit keeps ${permanent% } down"

# expect_exit NAME PID STATUS SECONDS PATTERN: the worker NAME (log $work/NAME.log) exits
# with STATUS within SECONDS, its log holding PATTERN (grep -E).
expect_exit() {
  local name="$1" pid="$2" expected="$3" seconds="$4" pattern="$5" status=0
  wait_for_exit "$pid" "$seconds" || status=$?
  [ "$status" -eq "$expected" ] || fail "$name: exit status $status, not $expected"
  grep -qE -- "$pattern" "$work/$name.log" || fail "$name: no '$pattern' in its log"
  echo "ok: $name: exit status $status: $(grep -m1 -oE -- "$pattern.{0,100}" "$work/$name.log")"
}

# ---- a key longer than Mbed TLS takes ----------------------------------------------------
status=0
"$worker" --identity w --key-hex "$(printf '%066d' 0)" >"$work/long-key.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "a 33-byte key: exit status $status, not 2: $(cat "$work/long-key.log")"
grep -q "33 bytes.*32 bytes (MBEDTLS_PSK_MAX_LEN)" "$work/long-key.log" || fail "a 33-byte key: $(cat "$work/long-key.log")"
echo "ok: a 33-byte key refused at start (2): $(cat "$work/long-key.log")"

require_mnist
# The data set require_mnist found, by its name (the one the end-to-end tests train on).
worker_flags=(--data "$(basename "$mnist_dir")" --worker-id 0 --workers 1 --quiet)

# ---- a port that takes datagrams and never answers, and a closed one ---------------------
start_program "$work/silent.log" python3 -c '
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
with open(sys.argv[1] + ".tmp", "w") as f: f.write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True: s.recv(65536)' "$work/silent.port"
wait_for_port_file "$work/silent.port" 10 "$last_pid" || fail "the silent UDP socket did not start"
silent=$(cat "$work/silent.port")
closed=$(python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# (The cases run side by side where they do not meet: the test stays short.)
start_program "$work/silent-port.log" "$worker" --server "coaps://127.0.0.1:$silent" --identity w --key-hex 00112233445566778899aabbccddeeff \
  --model mlp "${worker_flags[@]}" --request-timeout 2 --give-up-after 2
silent_pid=$last_pid
start_program "$work/closed-port.log" "$worker" --server "coaps://127.0.0.1:$closed" --identity w --key-hex 00112233445566778899aabbccddeeff \
  --model mlp "${worker_flags[@]}" --give-up-after 1
closed_pid=$last_pid
start_program "$work/closed-port-errors-only.log" "$worker" --server "coaps://127.0.0.1:$closed" --identity w \
  --key-hex 00112233445566778899aabbccddeeff --model mlp "${worker_flags[@]}" --give-up-after 1 --log-level error
closed_quiet_pid=$last_pid

# ---- SIGTERM in the middle of a handshake with the silent port --------------------------
start_worker "$work/sigterm.log" "$work/sigterm.json" "$worker" --server "coaps://127.0.0.1:$silent" --identity w \
  --key-hex 00112233445566778899aabbccddeeff --model mlp "${worker_flags[@]}"
pid=$last_pid
wait_for_json "$work/sigterm.json" state = running 30 "$pid" || fail "the worker for SIGTERM did not start"
sleep 1  # well into its first handshake, which the silent port leaves hanging for 31 s
sent=$(date +%s%N)
kill -TERM "$pid"
while kill -0 "$pid" 2>/dev/null && ! is_zombie "$pid"; do
  [ $(( ($(date +%s%N) - sent) / 1000000 )) -lt 5000 ] || fail "SIGTERM: still running 5 s later"
  sleep 0.02
done
latency_ms=$(( ($(date +%s%N) - sent) / 1000000 ))
status=0; wait "$pid" || status=$?
[ "$latency_ms" -lt 1500 ] || fail "SIGTERM during a handshake: exited after $latency_ms ms"
[ "$status" -eq 15 ] || fail "SIGTERM before anything was applied: exit status $status, not 15"
[ "$(json_get "$work/sigterm.json" state)" = stopped ] || fail "SIGTERM: no final stats"
echo "ok: SIGTERM during a handshake: exited after $latency_ms ms, status 15 (nothing applied)"
expect_exit silent-port "$silent_pid" 10 20 "no answer from 127\.0\.0\.1:$silent"
expect_exit closed-port "$closed_pid" 10 20 "nothing listens on 127\.0\.0\.1:$closed"
# --log-level error: the same ending and its cause, without the retries and the start line.
expect_exit closed-port-errors-only "$closed_quiet_pid" 10 20 "exit status 10: .*nothing listens on 127\.0\.0\.1:$closed"
grep -q "retrying in" "$work/closed-port.log" || fail "closed port: no retry lines at the default --log-level info"
! grep -qE "retrying in|^[0-9 :-]+ edgetrain-worker: worker 0/1" "$work/closed-port-errors-only.log" ||
  fail "--log-level error still wrote info or warning lines: $(cat "$work/closed-port-errors-only.log")"
echo "ok: --log-level error keeps only why the worker stopped ($(wc -l <"$work/closed-port-errors-only.log") lines)"

# ---- a server: wrong key, unknown identity, another model, then killed mid-run -----------
add_device "$server" "$work/keys.toml" w0 "$work/w0.toml"
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" --model mlp
uri="coaps://127.0.0.1:$server_port"

start_program "$work/wrong-key.log" "$worker" --config "$work/w0.toml" --server "$uri" --key-hex "$(printf '%032d' 0)" \
  --model mlp "${worker_flags[@]}"
wrong_key_pid=$last_pid
start_program "$work/unknown-identity.log" "$worker" --server "$uri" --identity stranger \
  --key-hex 00112233445566778899aabbccddeeff --model mlp "${worker_flags[@]}" --max-refusals 2
unknown_pid=$last_pid
start_program "$work/wrong-model.log" "$worker" --config "$work/w0.toml" --server "$uri" --model paper-cnn "${worker_flags[@]}"
wrong_model_pid=$last_pid
expect_exit wrong-key "$wrong_key_pid" 11 30 "refused the DTLS handshake \(alert [a-z_]+\): wrong key for identity 'w0'"
grep -q "3 times in a row; giving up" "$work/wrong-key.log" || fail "wrong key: not given up after --max-refusals (3)"
expect_exit unknown-identity "$unknown_pid" 12 30 "does not know the PSK identity 'stranger'"
grep -q "2 times in a row; giving up" "$work/unknown-identity.log" || fail "unknown identity: not given up after --max-refusals 2"
expect_exit wrong-model "$wrong_model_pid" 13 60 "the server's model does not match model 'paper-cnn'"

start_worker "$work/server-killed.log" "$work/server-killed.json" "$worker" --config "$work/w0.toml" --server "$uri" \
  --model mlp "${worker_flags[@]}" --give-up-after 2
pid=$last_pid
wait_for_json "$work/server-killed.json" updates_accepted -ge 3 30 "$pid" || fail "the worker trained nothing"
kill -KILL "$server_pid"
expect_exit server-killed "$pid" 14 30 "no answer from the server for [0-9]+ s; giving up"
[ "$(json_get "$work/server-killed.json" state)" = stopped ] || fail "server killed: the worker wrote no final stats"
echo "every worker failure ended with its own exit status and a message naming the cause"
