#!/usr/bin/env bash
# The files the programs write for scripts, read as scripts will read them (jq), with no
# log line parsed: edgetrain-server's --port-file and --stats-file, edgetrain-link-impairer's
# --port-file, edgetrain-worker's --stats-file. One worker trains through one impairer link
# for 20 steps (--steps), a second one runs until SIGTERM; the server is stopped with
# SIGTERM and restarted on its state directory, whose recovery its stats file reports.
# usage: output_files.sh SERVER WORKER IMPAIRER
server="$1"; worker="$2"; impairer="$3"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

# wait_for_file FILE SECONDS [JQ_CONDITION]: until FILE exists (and JQ_CONDITION holds).
wait_for_file() {
  local deadline=$((SECONDS + $2)) condition="${3:-true}"
  until [ -s "$1" ] && jq -e "$condition" "$1" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$1 did not satisfy '$condition' within $2 s: $(cat "$1" 2>&1)"
    sleep 0.1
  done
}
expect() {  # FILE JQ_CONDITION DESCRIPTION
  jq -e "$2" "$1" >/dev/null || fail "$3: '$2' does not hold in $1: $(cat "$1")"
  echo "ok: $3"
}

for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
server_args=(--listen 127.0.0.1 --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" --model mlp
             --eval-data mnist-small --eval-interval 1 --port-file "$work/server.port" --stats-file "$work/server.json")
start_program "$work/server-1.log" "$server" "${server_args[@]}"
server_pid=$last_pid
wait_for_file "$work/server.port" 30
grep -qxE '[0-9]+' "$work/server.port" || fail "the port file is not one decimal number: $(cat "$work/server.port")"
port=$(cat "$work/server.port")
[ "$port" -gt 0 ] || fail "port file says $port"
wait_for_file "$work/server.json" 30
expect "$work/server.json" ".state == \"running\" and .port == $port and .insecure_port == null" "server stats: running on the port of its port file"
expect "$work/server.json" '.recovery.fresh == true and .recovery.version == 0 and .version == 0' "server stats: a fresh state directory"
expect "$work/server.json" '.recovery.rollback == null and .devices_refused == {} and .updates_clipped == 0' "server stats: no rollback, no refused device, nothing clipped"

cat >"$work/links.toml" <<EOT
[[link]]
name = "w0"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:$port"
EOT
start_program "$work/impairer.log" "$impairer" --links "$work/links.toml" --port-file "$work/impairer.json"
wait_for_file "$work/impairer.json" 30 '.links.w0 | test("^127\\.0\\.0\\.1:[1-9][0-9]*$")'
link=$(jq -r .links.w0 "$work/impairer.json")
echo "ok: impairer port file: link w0 listens on $link"

start_program "$work/w0.log" "$worker" --config "$work/w0.toml" --server "coaps://$link" --model mlp --data mnist-small \
  --worker-id 0 --workers 2 --steps 20 --quiet --stats-file "$work/w0.json"
w0=$last_pid
wait_for_exit "$w0" 60 || fail "worker 0 exited with status $?"
expect "$work/w0.json" '.state == "stopped" and .steps == 20 and .updates_accepted == 20' "worker stats: 20 steps, 20 accepted"
expect "$work/w0.json" '.acknowledged_versions == [range(1; 21)] and .server_version == 20' "worker stats: acknowledged versions 1..20 in order"
expect "$work/w0.json" '[.updates_refused, .updates_rejected, .pulls, .delta_pulls, .delta_mismatches, .bytes_sent,
  .bytes_received, .retries, .non_finite_steps, .last_loss] | all(type == "number")' "worker stats: every counter is a number"
expect "$work/w0.json" '.bytes_sent > 0 and .pulls > 0' "worker stats: bytes sent and pulls counted"

# A worker stopped by SIGTERM leaves its final stats, marked stopped.
start_program "$work/w1.log" "$worker" --config "$work/w1.toml" --server "coaps://127.0.0.1:$port" --model mlp --data mnist-small \
  --worker-id 1 --workers 2 --quiet --stats-file "$work/w1.json"
w1=$last_pid
wait_for_file "$work/w1.json" 60 '.updates_accepted >= 3 and .state == "running"'
kill -TERM "$w1"
wait_for_exit "$w1" 30 || fail "worker 1 exited with status $?"
expect "$work/w1.json" '.state == "stopped" and (.acknowledged_versions | length) == .updates_accepted' "worker stats after SIGTERM: stopped, one version per acknowledgement"
expect "$work/w1.json" '.acknowledged_versions | . == sort and .[0] > 20' "worker stats after SIGTERM: versions increase, after worker 0's"
acknowledged=$(jq .server_version "$work/w1.json")

# The evaluator scores version 0 at start and then at most once per --eval-interval, so a
# short run can end before it has scored a trained version: wait for one.
wait_for_file "$work/server.json" 30 ".updates_applied >= $acknowledged and (.last_evaluation.version // 0) > 0"
expect "$work/server.json" '.ingress_payload_bytes > 0 and .ingress_socket_bytes > .ingress_payload_bytes and .ingress_socket_datagrams > 0' "server stats: ingress counted"
expect "$work/server.json" '.last_evaluation | (.accuracy | type) == "number" and (.loss | type) == "number" and .version > 0' "server stats: last evaluation"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
# The worker stops within a second of SIGTERM in every state, so an update it had sent may
# be applied without its acknowledgement reaching it: the server ends at the last version
# the worker heard of, or one above.
expect "$work/server.json" ".state == \"stopped\" and (.version == $acknowledged or .version == $acknowledged + 1)" "server stats at exit: stopped at the last acknowledged version (or one update above it, in flight at SIGTERM)"
acknowledged=$(jq .version "$work/server.json")

# Restarted on the same state directory: the recovery is in the stats file.
rm -f "$work/server.port" "$work/server.json"
start_program "$work/server-2.log" "$server" "${server_args[@]}"
server_pid=$last_pid
wait_for_file "$work/server.json" 30
expect "$work/server.json" ".recovery.fresh == false and .recovery.checkpoint_version == $acknowledged and .recovery.replayed_updates == 0 and .recovery.dropped_wal_bytes == 0 and .recovery.version == $acknowledged" "server stats after restart: recovered at version $acknowledged"
[ "$(jq .port "$work/server.json")" = "$(cat "$work/server.port")" ] || fail "stats and port file disagree"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
echo "every output file holds what the programs did"
