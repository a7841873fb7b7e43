# Sourced (bash) by every script that runs edgetrain's programs as separate processes: the
# end-to-end tests, the demo, the benchmarks, boards/measure-worker.sh and the emulator.
# It starts programs in the background and remembers them, waits on the files the programs
# write for scripts (--port-file, --stats-file; server/README.md, worker/README.md) with a
# bound instead of sleeping or reading log wording, reads those JSON files, and prints the
# programs' logs when something fails. It sets no trap: the caller decides (tests kill
# everything with `trap stop_started_programs EXIT`, the emulator also deletes namespaces).
# JSON is read with jq (a Debian package that toolchains/setup-deps.sh installs; it starts in
# milliseconds, which matters to loops that poll a stats file ten times a second).
#
# Variables: started_pids (every program started), watched_logs (printed by fail),
# fail_prefix (what fail puts before its message; default "FAIL: "), last_pid,
# server_pid, server_port, server_stats (set by start_server).

started_pids=()
watched_logs=()
: "${fail_prefix=FAIL: }"

# fail MESSAGE: prints MESSAGE and the last lines of every watched log, exits 1.
fail() {
  echo "${fail_prefix}$*" >&2
  local log
  for log in ${watched_logs[@]+"${watched_logs[@]}"}; do
    echo "---- last lines of $log" >&2
    tail -n 25 "$log" >&2 || true
  done
  exit 1
}

# stop_started_programs [GRACE_SECONDS]: SIGTERM to every program still running, SIGKILL
# after GRACE_SECONDS (default 0: SIGKILL at once), then reaps them.
stop_started_programs() {
  local pid grace="${1:-0}"
  if [ "$grace" != 0 ]; then
    for pid in ${started_pids[@]+"${started_pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
    local deadline=$((SECONDS + ${grace%.*} + 1))
    for pid in ${started_pids[@]+"${started_pids[@]}"}; do
      while kill -0 "$pid" 2>/dev/null && ! is_zombie "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    done
  fi
  for pid in ${started_pids[@]+"${started_pids[@]}"}; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  started_pids=()
}

is_zombie() { [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" = Z ]; }

# start_program LOG COMMAND...: runs COMMAND in the background with stdout and stderr
# appended to LOG; sets $last_pid.
start_program() {
  local log="$1"; shift
  "$@" >>"$log" 2>&1 &
  last_pid=$!
  started_pids+=("$last_pid")
  watched_logs+=("$log")
}

# wait_for_exit PID SECONDS: returns the program's exit status; fails if it is still
# running after SECONDS.
wait_for_exit() {
  local pid="$1" deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null && ! is_zombie "$pid"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "process $pid still running after $2 s"
    sleep 0.1
  done
  local status=0
  wait "$pid" || status=$?
  return "$status"
}

# json_get FILE [KEY]: prints the value at KEY (dots separate levels: recovery.version;
# a number indexes a list) of the JSON object in FILE, or the whole object without KEY.
# Scalars print as themselves (strings without quotes, null as "null", booleans as
# true/false), a list one element a line, an object one "key value" line per entry.
# Returns 1, printing nothing, if the file is missing or unreadable or has no such key.
json_get() {
  [ $# -ge 1 ] && [ $# -le 2 ] || fail "json_get FILE [KEY]"
  jq -r --arg key "${2:-}" '
    ($key | if . == "" then [] else split(".") | map(if test("^[0-9]+$") then tonumber else . end) end) as $path
    | if ($path | length) > 0 and ((try (getpath($path[:-1]) | has($path[-1])) catch false) | not)
      then error("no such key") else getpath($path) end
    | if type == "array" then .[] | tostring
      elif type == "object" then to_entries[] | "\(.key) \(.value | tostring)"
      else tostring end' "$1" 2>/dev/null
}

# json_compare VALUE OP EXPECTED: OP is = or != (as text), or -eq -ne -gt -ge -lt -le
# (as numbers, decimals allowed).
json_compare() {
  case "$2" in
    =) [ "$1" = "$3" ] ;;
    !=) [ "$1" != "$3" ] ;;
    -eq|-ne|-gt|-ge|-lt|-le)
      [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || return 1
      awk -v a="$1" -v op="$2" -v b="$3" 'BEGIN {
        r = (op == "-eq") ? a == b : (op == "-ne") ? a != b : (op == "-gt") ? a > b : (op == "-ge") ? a >= b : (op == "-lt") ? a < b : a <= b
        exit !r }' ;;
    *) fail "json_compare: unknown operator '$2'" ;;
  esac
}

# wait_for_json FILE KEY OP VALUE SECONDS [PID]: returns 0 once the value at KEY in FILE
# compares with VALUE (json_compare), 1 if it did not within SECONDS or PID (when given)
# exited first.
wait_for_json() {
  local file="$1" key="$2" op="$3" expected="$4" deadline=$((SECONDS + $5)) pid="${6:-}" value
  while :; do
    if value=$(json_get "$file" "$key") && json_compare "$value" "$op" "$expected"; then return 0; fi
    [ "$SECONDS" -lt "$deadline" ] || return 1
    if [ -n "$pid" ] && { ! kill -0 "$pid" 2>/dev/null || is_zombie "$pid"; }; then
      # One more look: the program may have written the file just before it exited.
      value=$(json_get "$file" "$key") && json_compare "$value" "$op" "$expected" && return 0
      return 1
    fi
    sleep 0.1
  done
}

# add_device SERVER KEYSTORE NAME CONFIG: adds device NAME to KEYSTORE (edgetrain-server
# add-device) and writes the worker configuration it prints to CONFIG.
add_device() {
  local err
  err=$("$1" add-device "$3" --keystore "$2" --server-uri coaps://127.0.0.1:0 2>&1 >"$4") ||
    fail "add-device $3 failed: $err"
}

# start_server SERVER LOG ARGS...: SERVER (the edgetrain-server program) on 127.0.0.1 with
# ARGS, its port file and stats file next to LOG (LOG without .log, plus .port and
# .stats.json; both removed first). Waits until the server has bound its port and written
# its first stats (after recovery), at most 60 s; sets $server_pid, $server_port and
# $server_stats. Pass --port 0 for any free port.
start_server() {
  local program="$1" log="$2"; shift 2
  local base="${log%.log}"
  rm -f "$base.port" "$base.stats.json"
  start_program "$log" "$program" --listen 127.0.0.1 --port-file "$base.port" --stats-file "$base.stats.json" "$@"
  server_pid=$last_pid
  server_stats="$base.stats.json"
  wait_for_port_file "$base.port" 60 "$server_pid" || fail "the server did not report its port within 60 s"
  server_port=$(cat "$base.port")
  wait_for_json "$server_stats" state = running 60 "$server_pid" || fail "the server wrote no stats within 60 s"
}

# wait_for_port_file FILE SECONDS [PID]: returns 0 once FILE holds a port number (the
# programs write it atomically), 1 if not within SECONDS or PID exited first.
wait_for_port_file() {
  local deadline=$((SECONDS + $2)) pid="${3:-}"
  until [[ "$(cat "$1" 2>/dev/null)" =~ ^[1-9][0-9]*$ ]]; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    if [ -n "$pid" ] && { ! kill -0 "$pid" 2>/dev/null || is_zombie "$pid"; }; then
      [[ "$(cat "$1" 2>/dev/null)" =~ ^[1-9][0-9]*$ ]]
      return
    fi
    sleep 0.05
  done
}

# start_worker LOG STATS COMMAND...: runs COMMAND (an edgetrain-worker, possibly behind
# qemu-aarch64 or `ip netns exec`, with its flags) with --stats-file STATS appended, output
# appended to LOG; STATS is removed first. Sets $last_pid.
start_worker() {
  local log="$1" stats="$2"; shift 2
  rm -f "$stats"
  start_program "$log" "$@" --stats-file "$stats"
}

# acknowledged_versions STATS...: every server version the workers of these stats files
# got in a 2.04, one a line, file by file in the order given.
acknowledged_versions() {
  local stats
  for stats in "$@"; do json_get "$stats" acknowledged_versions || true; done
}

# highest_acknowledged STATS...: the highest of them (0 if none).
highest_acknowledged() { local v; v=$(acknowledged_versions "$@" | sort -n | tail -n1); echo "${v:-0}"; }

# strictly_increasing: reads numbers, one a line; fails (status 1, the offending pair on
# stdout) if one is not above the one before.
strictly_increasing() {
  awk 'NR > 1 && $1 <= prev { print "version " $1 " after " prev; bad = 1; exit } { prev = $1 } END { exit bad }'
}

# free_udp_ports N: prints a port P such that P .. P+N-1 are free UDP ports on 127.0.0.1 (for
# programs whose addresses must be known before they start, e.g. a topology file's peers).
# Another process may take one before it is used: callers that care retry.
free_udp_ports() {
  python3 -c '
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    base, socks = random.randrange(20000, 60000), []
    try:
        for p in range(base, base + n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", p)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()' "$1"
}
