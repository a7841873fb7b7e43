# Sourced by the process-level tests (edgetrain-server and edgetrain-worker as separate
# programs on loopback). Gives them a private work directory, background programs that are
# killed when the test exits however it exits, bounded waits on log lines instead of
# sleeps, and the server's logs printed when a check fails.
set -euo pipefail

work=$(mktemp -d)
started_pids=()
watched_logs=()

stop_everything() {
  local pid
  for pid in ${started_pids[@]+"${started_pids[@]}"}; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap stop_everything EXIT

fail() {
  echo "FAIL: $*" >&2
  local log
  for log in ${watched_logs[@]+"${watched_logs[@]}"}; do
    echo "---- last lines of $log" >&2
    tail -n 25 "$log" >&2 || true
  done
  exit 1
}

# start_program LOG COMMAND...: runs COMMAND in the background with stdout and stderr in
# LOG; sets $last_pid.
start_program() {
  local log="$1"; shift
  "$@" >"$log" 2>&1 &
  last_pid=$!
  started_pids+=("$last_pid")
  watched_logs+=("$log")
}

# wait_for_line FILE REGEX SECONDS: returns 0 once a line of FILE matches REGEX (grep -E),
# 1 if none did within SECONDS.
wait_for_line() {
  local deadline=$((SECONDS + $3))
  until grep -qE -- "$2" "$1" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# wait_for_exit PID SECONDS: the program's exit status, or fails the test if it is still
# running after SECONDS.
wait_for_exit() {
  local pid="$1" deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null && [ -z "$(ps -o stat= -p "$pid" | grep Z)" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "process $pid still running after $2 s"
    sleep 0.1
  done
  local status=0
  wait "$pid" || status=$?
  return "$status"
}

# add_device KEYSTORE NAME: adds NAME to the keystore; the worker configuration goes to
# $work/NAME.toml.
add_device() {
  "$server" add-device "$2" --keystore "$1" --server-uri coaps://127.0.0.1:0 >"$work/$2.toml" 2>>"$work/add-device.log" ||
    fail "add-device $2 failed: $(cat "$work/add-device.log")"
}

# start_server LOG ARGS...: edgetrain-server on 127.0.0.1 with ARGS; waits until it
# listens and sets $server_pid and $server_port (pass --port 0 for any free port).
start_server() {
  local log="$1"; shift
  start_program "$log" "$server" --listen 127.0.0.1 "$@"
  server_pid=$last_pid
  wait_for_line "$log" 'listening on 127\.0\.0\.1:[0-9]+' 30 || fail "the server did not start listening"
  server_port=$(grep -oE 'listening on 127\.0\.0\.1:[0-9]+' "$log" | head -n1 | cut -d: -f2)
}

# acked_versions LOG: the server versions a worker logged with --log-acks, one a line.
acked_versions() { sed -nE 's/.*acknowledged: server version ([0-9]+).*/\1/p' "$1"; }

# require_mnist: without MNIST, skips the test (exit 77) on a developer's machine and
# fails it under CI (CI set), where set-up always provides the data; the C++ tests follow
# the same rule (EDGETRAIN_REQUIRE_DATA in tests/support/test_data.h).
mnist_dir="${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist"
require_mnist() {
  if ! ls "$mnist_dir"/train-images-idx3-ubyte* >/dev/null 2>&1; then
    [ -z "${CI:-}" ] || fail "no MNIST in $mnist_dir under CI (toolchains/setup-deps.sh converts it)"
    echo "SKIP: no MNIST in $mnist_dir (toolchains/setup-deps.sh converts it)"
    exit 77
  fi
}
