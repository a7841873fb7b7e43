#!/usr/bin/env bash
# Issue 12's log flood: two workers (--batch 1) against a server with --max-staleness 0 for 6 s get
# many updates refused as too stale. Run once with the repeat limit off (--log-repeat-burst
# 1000000: every refusal is a line, as before) and once with the defaults (10 lines of a
# kind per 10 s, the rest counted in one line); prints both counts and checks the bound:
# with the defaults at most (kinds) x (10 + 1) refusal lines, whatever the refusals.
# usage: refusal_log_flood.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done

# run_flood NAME SERVER_ARGS...: server and two workers for 6 s; the server's log is $work/NAME.log.
run_flood() {
  local name="$1"; shift
  start_server "$server" "$work/$name.log" --port 0 --state-dir "$work/$name-state" --keystore "$work/keys.toml" \
    --model mlp --max-staleness 0 "$@"
  local pids=()
  for i in 0 1; do
    start_worker "$work/$name-w$i.log" "$work/$name-w$i.stats.json" "$worker" --config "$work/w$i.toml" \
      --server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --worker-id "$i" --workers 2 --duration 6 --batch 1
    pids+=("$last_pid")
  done
  for pid in "${pids[@]}"; do wait_for_exit "$pid" 60 || true; done
  refused_updates=$(jq '[.devices_refused[].refused | to_entries[].value] | add // 0' "$server_stats")
  kill -TERM "$server_pid"
  wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
  refusal_lines=$(grep -c "refused an update" "$work/$name.log" || true)
  log_lines=$(wc -l <"$work/$name.log")
}

run_flood unlimited --log-repeat-burst 1000000
echo "limit off:  $refused_updates updates refused, $refusal_lines refusal lines, $log_lines log lines"
[ "$refusal_lines" -ge "$refused_updates" ] || fail "with the limit off every refusal should be a line"
run_flood limited
echo "defaults:   $refused_updates updates refused, $refusal_lines refusal lines, $log_lines log lines"
kinds=$(jq '[.devices_refused[].refused | keys[]] | length' "$server_stats")
bound=$(( kinds * 11 ))
[ "$refusal_lines" -le "$bound" ] || fail "$refusal_lines refusal lines for $kinds kinds of refusal (bound $bound)"
if [ "$refused_updates" -gt "$bound" ]; then
  grep -q "more in the last" "$work/limited.log" || fail "no counted line although $refused_updates refusals were collapsed"
fi
echo "refusal lines bounded: $refusal_lines <= $bound"
