#!/usr/bin/env bash
# common/processes.sh on its own, without edgetrain's programs: json_get's output for every
# kind of value and its failure on a missing file or key, json_compare, the bounded waits
# (a value that arrives, one that never does, a program that exits first), start_program
# and stop_started_programs, and fail printing the watched logs.
# usage: processes_lib_test.sh
source "$(dirname "$0")/process_test_lib.sh"
check() {  # DESCRIPTION GOT EXPECTED
  [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"
}

cat >"$work/stats.json" <<'EOF'
{"state": "running", "version": 12, "loss": 0.25, "fresh": false, "last_evaluation": null,
 "acknowledged_versions": [3, 5, 8], "recovery": {"version": 7, "fresh": true}, "links": {"w0": "127.0.0.1:4000"}}
EOF
check "a string" "$(json_get "$work/stats.json" state)" running
check "a number" "$(json_get "$work/stats.json" version)" 12
check "a float" "$(json_get "$work/stats.json" loss)" 0.25
check "false" "$(json_get "$work/stats.json" fresh)" false
check "null" "$(json_get "$work/stats.json" last_evaluation)" null
check "a list, one a line" "$(json_get "$work/stats.json" acknowledged_versions | tr '\n' ' ')" "3 5 8 "
check "a list element" "$(json_get "$work/stats.json" acknowledged_versions.1)" 5
check "a nested key" "$(json_get "$work/stats.json" recovery.version)" 7
check "an object, key and value a line" "$(json_get "$work/stats.json" links)" "w0 127.0.0.1:4000"
! json_get "$work/stats.json" no_such_key >/dev/null || fail "a missing key did not fail"
! json_get "$work/stats.json" recovery.version.deeper >/dev/null || fail "a key below a number did not fail"
! json_get "$work/missing.json" version >/dev/null || fail "a missing file did not fail"
echo '{"state": "runn' >"$work/torn.json"
! json_get "$work/torn.json" state >/dev/null || fail "malformed JSON did not fail"
echo "ok: json_get"

json_compare 0.86 -ge 0.85 && json_compare 12 -eq 12 && json_compare stopped = stopped && json_compare 3 -lt 10 ||
  fail "json_compare: a true comparison failed"
! json_compare 0.84 -ge 0.85 && ! json_compare null -gt 0 && ! json_compare a = b || fail "json_compare: a false comparison held"
check "highest_acknowledged" "$(highest_acknowledged "$work/stats.json" "$work/missing.json")" 8
check "highest_acknowledged of nothing" "$(highest_acknowledged "$work/missing.json")" 0
printf '1\n2\n5\n' | strictly_increasing >/dev/null || fail "strictly_increasing refused 1 2 5"
! printf '1\n5\n5\n' | strictly_increasing >/dev/null || fail "strictly_increasing took a repeat"
echo "ok: comparisons and acknowledged versions"

# A value that arrives after a while, one that never does, a program that exits first.
(sleep 0.5; echo '{"state": "stopped"}' >"$work/later.json.tmp" && mv "$work/later.json.tmp" "$work/later.json") &
wait_for_json "$work/later.json" state = stopped 10 || fail "wait_for_json missed a value written later"
started=$SECONDS
! wait_for_json "$work/stats.json" version -gt 100 1 || fail "wait_for_json returned for a value never reached"
(( SECONDS - started <= 3 )) || fail "wait_for_json overran its bound"
start_program "$work/quitter.log" sh -c 'echo bye; exit 3'
started=$SECONDS
! wait_for_json "$work/never.json" state = running 30 "$last_pid" || fail "wait_for_json held for an absent file"
(( SECONDS - started <= 5 )) || fail "wait_for_json kept waiting after the program exited"
wait_for_exit "$last_pid" 5 && fail "the program's exit status was lost" || check "exit status" "$?" 3
(sleep 0.3; echo 4242 >"$work/port.tmp" && mv "$work/port.tmp" "$work/port") &
wait_for_port_file "$work/port" 10 || fail "wait_for_port_file missed the port"
echo "ok: bounded waits"

start_program "$work/sleeper.log" sleep 1000
sleeper=$last_pid
stop_started_programs
! kill -0 "$sleeper" 2>/dev/null || fail "stop_started_programs left a program running"
echo "watched line" >"$work/watched.log"
watched_logs=("$work/watched.log")
out=$( (fail "on purpose") 2>&1) && fail "fail did not exit non-zero"
grep -q "FAIL: on purpose" <<<"$out" && grep -q "watched line" <<<"$out" || fail "fail did not print the watched logs: $out"
watched_logs=()
echo "ok: programs started and stopped, logs printed on failure"
