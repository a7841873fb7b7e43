#!/usr/bin/env bash
# Offline training (issue 38 part 1; worker/README.md, "An intermittent link"), as processes
# on loopback: edgetrain-server, and three edgetrain-workers: "steady" talks to the server
# directly, "offline" (--offline-steps, its tries of the server short probes kept to a share
# of the time offline: --offline-try-timeout, --offline-try-share) and "idle" (without it,
# as the paper's worker) each
# through a link of edgetrain-link-impairer. The impairer is stopped (SIGSTOP) for the
# outage: both links are down, the server stays up and the steady worker moves its version
# on. Checks that
#   - the offline worker keeps taking local steps (its stats file: offline, buffered steps,
#     offline time), never more than its bound;
#   - once the links are back (SIGCONT), its accumulated steps arrive as one update whose
#     fetched version is the version it held when the server went away, and the server
#     applied it at that staleness: its WAL holds the update from that identity, computed
#     from that version, at the version the worker was acknowledged;
#   - the offline worker's tries while away were probes (offline_tries > 0) whose time
#     (offline_try_seconds) stays within --offline-try-share of its time offline, plus one try;
#   - the idle worker took no step offline and trained on once the link was back;
#   - every worker stops cleanly with status 0;
#   - --offline-steps is refused (status 2) where it is not built: other modes, --shards.
# No time is asserted: every wait is for a state the programs write, with a bound.
# usage: worker_offline.sh SERVER WORKER LINK_IMPAIRER
server="$1"; worker="$2"; impairer="$3"
source "$(dirname "$0")/process_test_lib.sh"

# Where it is not built, the setting is refused at start (status 2), never ignored.
for refused in "--mode rounds" "--shards coaps://127.0.0.1:1,coaps://127.0.0.1:2"; do
  status=0
  # shellcheck disable=SC2086 # the flags split on purpose
  "$worker" $refused --identity w --key-hex 00112233445566778899aabbccddeeff --offline-steps 5 \
    >"$work/refused.log" 2>&1 || status=$?
  [ "$status" -eq 2 ] && grep -q -- "--offline-steps" "$work/refused.log" ||
    fail "--offline-steps with $refused: status $status: $(cat "$work/refused.log")"
done
echo "ok: --offline-steps refused with --mode rounds and with --shards"

require_mnist
data=$(basename "$mnist_dir")

for name in steady offline idle; do add_device "$server" "$work/keys.toml" "$name" "$work/$name.toml"; done
# D far above what the steady worker applies during the outage: the offline update is to be
# scaled by the staleness rule, not refused (the refusal is worker_test's).
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model mlp --max-staleness 20000 --checkpoint-every 0

cat >"$work/links.toml" <<EOF
[[link]]
name = "offline"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:$server_port"
[[link]]
name = "idle"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:$server_port"
EOF
start_program "$work/impairer.log" "$impairer" --links "$work/links.toml" --port-file "$work/impairer.json"
impairer_pid=$last_pid
for _ in $(seq 100); do [ -s "$work/impairer.json" ] && break; sleep 0.1; done
offline_link=$(json_get "$work/impairer.json" links.offline) || fail "the impairer wrote no port file"
idle_link=$(json_get "$work/impairer.json" links.idle)

# --request-timeout 3: the outage is noticed within seconds (the default is 60 s).
common=(--model mlp --data "$data" --workers 3 --duration 90 --request-timeout 3 --give-up-after 60)
start_worker "$work/steady.log" "$work/steady.json" "$worker" --config "$work/steady.toml" \
  --server "coaps://127.0.0.1:$server_port" --worker-id 0 "${common[@]}" --slowdown 2
steady_pid=$last_pid
start_worker "$work/offline.log" "$work/offline.json" "$worker" --config "$work/offline.toml" \
  --server "coaps://$offline_link" --worker-id 1 "${common[@]}" --offline-steps 400 --offline-seconds 60 \
  --offline-try-timeout 0.5 --offline-try-share 0.25 --longest-request 30
offline_pid=$last_pid
start_worker "$work/idle.log" "$work/idle.json" "$worker" --config "$work/idle.toml" \
  --server "coaps://$idle_link" --worker-id 2 "${common[@]}"
idle_pid=$last_pid

for name in offline idle steady; do
  wait_for_json "$work/$name.json" updates_accepted -ge 3 40 || fail "the $name worker trained nothing"
done
idle_accepted_before=$(json_get "$work/idle.json" updates_accepted)
echo "ok: three workers training; links down (SIGSTOP to the impairer)"
kill -STOP "$impairer_pid"

wait_for_json "$work/offline.json" buffered_steps -ge 50 40 "$offline_pid" ||
  fail "the offline worker buffered no steps while its link was down: $(json_get "$work/offline.json" | tr '\n' ' ')"
[ "$(json_get "$work/offline.json" offline)" = true ] || fail "the offline worker does not say it is offline"
wait_for_json "$work/offline.json" offline_seconds -gt 0 10 || fail "no offline time in the offline worker's stats"
held=$(json_get "$work/offline.json" server_version)
version_down=$(json_get "$server_stats" version)
# The steady worker moves the server on meanwhile: the offline update will be stale.
wait_for_json "$server_stats" version -ge $((version_down + 20)) 30 "$server_pid" || fail "the steady worker stalled"
echo "ok: offline worker: $(json_get "$work/offline.json" buffered_steps) steps buffered, $(json_get "$work/offline.json" offline_seconds) s offline; server at version $(json_get "$server_stats" version)"
kill -CONT "$impairer_pid"

wait_for_json "$work/offline.json" offline_updates_accepted -ge 1 40 "$offline_pid" ||
  fail "the offline update was not accepted once the link was back: $(json_get "$work/offline.json" | tr '\n' ' ')"
from=$(json_get "$work/offline.json" last_offline_from_version)
acknowledged=$(json_get "$work/offline.json" last_offline_acknowledged_version)
steps=$(json_get "$work/offline.json" last_offline_steps)
[ "$steps" -ge 50 ] && [ "$steps" -le 400 ] || fail "the offline update carried $steps steps, not 50..400 (--offline-steps 400)"
# The model it held when the links went down (its last pull; its last acknowledged update
# was $held), not one pulled since.
[ "$from" -gt 0 ] && [ "$from" -le "$version_down" ] ||
  fail "the offline update was computed from version $from (last acknowledged $held, server at $version_down when the links went down)"
staleness=$((acknowledged - 1 - from))
[ "$staleness" -ge 20 ] || fail "the offline update's staleness is $staleness: the steady worker's updates during the outage are missing"
[ "$(json_get "$work/offline.json" offline_updates_refused)" -eq 0 ] || fail "an offline update was refused"
tries=$(json_get "$work/offline.json" offline_tries)
try_seconds=$(json_get "$work/offline.json" offline_try_seconds)
offline_seconds=$(json_get "$work/offline.json" offline_seconds)
[ "$tries" -ge 1 ] || fail "the offline worker never tried the server while away"
python3 -c 'import sys; spent, offline, tries = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]); sys.exit(spent > 0.25 * offline + spent / tries)' \
  "$try_seconds" "$offline_seconds" "$tries" ||
  fail "the offline worker spent $try_seconds s of $offline_seconds s offline in $tries tries (--offline-try-share 0.25)"
echo "ok: $tries tries while offline, $try_seconds s in them, $offline_seconds s offline"
wait_for_json "$work/idle.json" updates_accepted -gt "$idle_accepted_before" 40 "$idle_pid" || fail "the idle worker did not train on once its link was back"

# The server's WAL (server/write_ahead_log.h): the record of version `acknowledged` comes
# from identity "offline", and the update in it was computed from version `from`.
# Its header says how many local steps it carries (CODEC.md: local steps at 6; the claim a
# server with --offline-step-credit honours).
python3 - "$work/state/wal.log" offline "$from" "$acknowledged" "$steps" <<'EOF' || fail "the server's WAL does not hold the offline update as the worker was told"
import struct, sys
path, identity, fetched, version = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
steps = int(sys.argv[5])
data = open(path, "rb").read()
pos = 32  # header
while pos + 8 <= len(data):
    length, _crc = struct.unpack_from("<II", data, pos)
    body = data[pos + 8 : pos + 8 + length]
    pos += 8 + length
    produced, _sequence, id_length = struct.unpack_from("<QQH", body, 0)
    who = body[18 : 18 + id_length]
    update = body[18 + id_length :]
    if produced == version:
        got = struct.unpack_from("<Q", update, 24)[0]  # CODEC.md: fetched version at 24
        claimed = struct.unpack_from("<H", update, 6)[0]
        print(f"WAL: version {produced} from {who.decode()} computed from version {got}: staleness {produced - 1 - got}, {claimed} local steps")
        sys.exit(0 if who == identity and got == fetched and claimed == steps else 1)
print(f"WAL: no record of version {version}")
sys.exit(1)
EOF
echo "ok: one update of $steps offline steps from version $from applied at version $acknowledged (staleness $staleness)"

kill -TERM "$steady_pid" "$offline_pid" "$idle_pid"
for name in steady offline idle; do
  pid_var="${name}_pid"
  wait_for_exit "${!pid_var}" 30 || fail "the $name worker exited with status $?"
  [ "$(json_get "$work/$name.json" state)" = stopped ] || fail "the $name worker wrote no final stats"
done
[ "$(json_get "$work/idle.json" offline_steps)" -eq 0 ] && [ "$(json_get "$work/idle.json" offline_seconds)" = 0 ] ||
  fail "the worker without --offline-steps trained offline"
[ "$(json_get "$work/idle.json" retries)" -gt 0 ] || fail "the idle worker never met the outage"
[ "$(json_get "$work/offline.json" offline_steps)" -ge "$steps" ] || fail "offline steps not counted"
echo "the offline worker trained through the outage and its update was applied at staleness $staleness; the idle worker waited"
