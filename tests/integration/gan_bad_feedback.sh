#!/usr/bin/env bash
# Issue 37 as separate programs on loopback DTLS (PSK from one keystore): a real
# edgetrain-server --mode gan, two honest edgetrain-workers, and an attacker holding a valid
# identity (gan_feedback_client) that takes a slot and posts feedbacks of ±3.4e38, ±1e30
# and NaN, one iteration each. Each is refused with 4.22 and counted for that device; the
# batches the server hands out stay finite (the client checks every sample, before and
# after each attack); the honest workers keep progressing; no step was refused (nothing
# reached the step); and after a restart the server replays to a finite generator and
# still serves finite batches.
# usage: gan_bad_feedback.sh SERVER WORKER CLIENT
server="$1"; worker="$2"; client="$3"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
for name in honest-0 honest-1 attacker; do add_device "$server" "$work/keys.toml" "$name" "$work/$name.toml"; done

server_args=(--state-dir "$work/state" --keystore "$work/keys.toml" --mode gan --gan-workers 3 --gan-batch 8
             --gan-deadline 1 --gan-eval-every 0 --gan-checkpoint-every 1000)
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
port=$server_port
pids=()
for i in 0 1; do
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "$worker" --config "$work/honest-$i.toml" --mode gan \
    --server "coaps://127.0.0.1:$port" --data mnist-small --batch 8 --worker-id "$i" --workers 2 --quiet \
    --duration 100 --give-up-after 60
  pids+=("$last_pid")
done
wait_for_json "$server_stats" gan.iteration -ge 2 60 "$server_pid" || fail "fewer than 2 GAN iterations in 60 s"

"$client" "$port" "$work/keys.toml" attacker 8 422 3.4e38 1e30 nan | tee "$work/client.log" ||
  fail "the attacker's feedbacks were not all refused with 4.22, or a batch was not finite"
wait_for_json "$server_stats" gan.out_of_bounds_refused -ge 3 10 "$server_pid" || fail "the refusals were not counted"
[ "$(json_get "$server_stats" gan.devices_refused.attacker.out_of_bounds)" -eq 3 ] ||
  fail "the attacker's refusals were not counted for it: $(json_get "$server_stats" gan.devices_refused)"
[ "$(json_get "$server_stats" gan.steps_refused)" -eq 0 ] || fail "a step was refused: bad feedback reached it"

# The honest workers keep progressing.
for i in 0 1; do
  before=$(json_get "$work/w$i.stats.json" iterations)
  wait_for_json "$work/w$i.stats.json" iterations -ge $((before + 3)) 30 "${pids[$i]}" ||
    fail "honest worker $i stopped progressing after the attack (at $before)"
  [ "$(json_get "$work/w$i.stats.json" feedbacks_out_of_bounds)" -eq 0 ] || fail "honest worker $i had a feedback refused"
done
echo "honest workers at $(json_get "$work/w0.stats.json" iterations) and $(json_get "$work/w1.stats.json" iterations) iterations"

# A restart replays gan.wal: a finite generator, finite batches.
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
start_server "$server" "$work/server-2.log" --port "$port" "${server_args[@]}"
echo "restarted at iteration $(json_get "$server_stats" gan.iteration) ($(json_get "$server_stats" gan.replayed_iterations) replayed)"
[ "$(json_get "$server_stats" gan.replayed_refused_steps)" -eq 0 ] || fail "a refused step in the log"
"$client" "$port" "$work/keys.toml" attacker 8 422 | tee -a "$work/client.log" || fail "the restarted server's batches are not finite"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $? after SIGTERM"
for pid in "${pids[@]}"; do kill -TERM "$pid"; wait_for_exit "$pid" 30 || true; done
! grep -q ERROR "$work/server-1.log" "$work/server-2.log" || fail "an ERROR in the server's log"
grep -q "feedback refused: .*beyond the bound" "$work/server-1.log" || fail "the refusal is not in the server's log"
echo "PASS"
