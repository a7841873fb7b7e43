#!/usr/bin/env bash
# Device management against a running server (issue 12, part 4):
#   - add-device makes printable keys: Debian's coap-client-openssl reads /status with the
#     key as text, exactly as the printed worker configuration's comment says;
#   - list-devices lists names and never a key unless --show-keys;
#   - remove-device: the removed device's worker is refused (4.01 on its open session, then
#     its handshake) and exits with its
#     "identity unknown" status (12) while the other worker's updates go on being applied;
#   - rotate-key: the old key fails the handshake, the new one reads /status; a worker
#     re-keyed while it trains gets 4.01 on its open session and exits (11 or 12);
#   - 12 add-device commands at once: none is lost (the keystore lock).
# usage: device_management.sh SERVER WORKER [COAP_CLIENT]
server="$1"; worker="$2"; client="${3:-coap-client-openssl}"
source "$(dirname "$0")/process_test_lib.sh"
if ! command -v "$client" >/dev/null; then
  echo "SKIP: $client not installed (Debian package libcoap3-bin; toolchains/setup-deps.sh installs it)"
  exit 77
fi
require_mnist
keys="$work/keys.toml"

# key_of NAME: the key as text (list-devices --show-keys --json).
key_of() { "$server" list-devices --keystore "$keys" --show-keys --json | jq -er --arg n "$1" '.[] | select(.name == $n) | .key'; }
# read_status NAME KEY: 0 when coap-client gets the status JSON with this identity and key.
read_status() {
  timeout 30 "$client" -B 8 -v 0 -m get -u "$1" -k "$2" "coaps://127.0.0.1:$server_port/status" >"$work/status.out" 2>&1 &&
    grep -q '"version"' "$work/status.out"
}

add_device "$server" "$keys" pi-a "$work/pi-a.toml"
add_device "$server" "$keys" pi-b "$work/pi-b.toml"
add_device "$server" "$keys" monitor "$work/monitor.toml"
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$keys" --model mlp \
  --checkpoint-every 0

# ---- add-device's key works with coap-client, as its output says ------------------------
command=$(sed -n 's/^#   \(coap-client-openssl .*\)$/\1/p' "$work/monitor.toml")
[ -n "$command" ] || fail "add-device printed no coap-client command: $(cat "$work/monitor.toml")"
monitor_key=$(key_of monitor)
[[ "$monitor_key" =~ ^[A-Za-z0-9_-]{32}$ ]] || fail "the key '$monitor_key' is not 32 characters of base64url"
read_status monitor "$monitor_key" || fail "coap-client could not read /status with add-device's key: $(cat "$work/status.out")"
echo "ok: coap-client-openssl read /status with add-device's printable key"

# ---- list-devices -------------------------------------------------------------------------
"$server" list-devices --keystore "$keys" >"$work/list.txt"
[ "$(cut -f1 "$work/list.txt" | tr '\n' ' ')" = "monitor pi-a pi-b " ] || fail "list-devices: $(cat "$work/list.txt")"
! grep -qF "$monitor_key" "$work/list.txt" || fail "list-devices printed a key without --show-keys"
echo "ok: list-devices names monitor, pi-a, pi-b and shows no key"

# ---- remove-device while both workers train ------------------------------------------------
flags=(--server "coaps://127.0.0.1:$server_port" --model mlp --data "$(basename "$mnist_dir")" --workers 2 --quiet
       --max-refusals 2 --give-up-after 20)
start_worker "$work/a.log" "$work/a.json" "$worker" --config "$work/pi-a.toml" "${flags[@]}" --worker-id 0
a_pid=$last_pid
start_worker "$work/b.log" "$work/b.json" "$worker" --config "$work/pi-b.toml" "${flags[@]}" --worker-id 1
b_pid=$last_pid
wait_for_json "$server_stats" updates_applied -ge 20 60 "$server_pid" || fail "the workers applied fewer than 20 updates"
"$server" remove-device pi-a --keystore "$keys" 2>>"$work/commands.log"
status=0
wait_for_exit "$a_pid" 30 || status=$?
[ "$status" -eq 12 ] || fail "the removed device's worker: exit status $status, not 12 (identity unknown)"
grep -q "not authorized\|4.03\|unknown\|no longer" "$work/server.log" || fail "the server did not log the refusal"
applied=$(json_get "$server_stats" updates_applied)
wait_for_json "$server_stats" updates_applied -ge $((applied + 10)) 30 "$server_pid" ||
  fail "the remaining worker's updates stopped after the removal"
kill -0 "$b_pid" || fail "pi-b's worker stopped"
echo "ok: removed pi-a: its worker exited 12 (its open session refused, then its handshake); pi-b went on ($applied -> $(json_get "$server_stats" updates_applied) updates)"

# ---- rotate-key ------------------------------------------------------------------------------
"$server" rotate-key monitor --keystore "$keys" --server-uri "coaps://127.0.0.1:$server_port" \
  >"$work/monitor-rotated.toml" 2>>"$work/commands.log"
new_key=$(key_of monitor)
[ "$new_key" != "$monitor_key" ] || fail "rotate-key kept the key"
grep -qF -- "-k $new_key " "$work/monitor-rotated.toml" || fail "rotate-key did not print the new key's command"
if read_status monitor "$monitor_key"; then fail "the old key still reads /status after rotate-key: $(cat "$work/status.out")"; fi
read_status monitor "$new_key" || fail "the new key does not read /status: $(cat "$work/status.out")"
echo "ok: rotate-key: the old key fails the handshake, the new one reads /status"
# ---- rotate-key while the device trains: its open session stops working ---------------------
"$server" rotate-key pi-b --keystore "$keys" >"$work/pi-b-rotated.toml" 2>>"$work/commands.log"
status=0
wait_for_exit "$b_pid" 45 || status=$?
[ "$status" -eq 11 ] || [ "$status" -eq 12 ] ||
  fail "the re-keyed device's worker (old key, open session): exit status $status, not 11 or 12: $(tail -3 "$work/b.log")"
grep -q "session key revoked" "$work/b.log" || fail "pi-b's worker was not told its session key was revoked: $(tail -5 "$work/b.log")"
sleep 2  # the stats file catches up with what was applied before the worker ended
applied=$(json_get "$server_stats" updates_applied)
sleep 2
[ "$(json_get "$server_stats" updates_applied)" -eq "$applied" ] || fail "updates were applied after pi-b's worker ended"
echo "ok: rotate-key pi-b while it trained: its open session got 4.01 'session key revoked', its worker exited $status"

# ---- concurrent edits lose nothing --------------------------------------------------------------
pids=()
for i in $(seq 1 12); do
  "$server" add-device "fleet-$i" --keystore "$keys" >/dev/null 2>>"$work/commands.log" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || fail "an add-device run at the same time as others failed: $(cat "$work/commands.log")"; done
count=$("$server" list-devices --keystore "$keys" --json | jq '[.[] | select(.name | startswith("fleet-"))] | length')
[ "$count" -eq 12 ] || fail "12 add-device at once left $count devices"
[ "$(stat -c %a "$keys")" = 600 ] || fail "the keystore's mode is $(stat -c %a "$keys")"
echo "ok: 12 add-device commands at once: all 12 devices in the keystore (mode 600)"

kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
