#!/usr/bin/env bash
# MD-GAN as separate programs on loopback DTLS with X.509 identities from one test CA: the
# server holds the generator (--mode gan), three workers each train a discriminator on their
# shard of mnist-small and send their error feedback; every few iterations they swap
# discriminators peer to peer (--topology, their own CoAP/DTLS endpoints). A worker is killed
# with SIGKILL mid-run: iterations go on without it (dropped at the deadline, counted) and,
# restarted, it takes part again. Then the server is killed with SIGKILL: restarted, it is at
# the last completed iteration or later (checkpoint + logged steps), the workers go on, and
# each worker received discriminators from its peers with none refused. The generator is
# scored with a small MLP classifier (made here by edgetrain-sim): the Frechet distance of
# its samples to test digits falls (this run is too short for the MNIST score to rise:
# gan_fleet_test checks that in one process).
# A worker may be another program (WORKER_2_COMMAND, e.g. the aarch64 build under
# qemu-aarch64) than the host build the others run. GAN_SCORES=print prints the scores
# without asking the distance to fall: the sanitizer tree's programs reach about 45
# iterations here, where whether it has fallen depends on when the kills land (the
# optimized tree checks it).
# usage: [WORKER_2_COMMAND=...] [GAN_SCORES=print] gan_fleet.sh SERVER WORKER TOPOLOGY SIM
server="$1"; worker="$2"; topology="$3"; sim="$4"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
bash "$(dirname "$0")/make_test_certificates.sh" "$work/certs" gan-0 gan-1 gan-2 || exit $?
certs="$work/certs"

base=$(free_udp_ports 3)
"$topology" --kind full --peers 3 --name-prefix gan- --addresses '127.0.0.1:{port}' --base-port "$base" --out "$work/topology.json"

# The yardstick: an MLP classifier of mnist-small (about 90% on its test digits).
"$sim" --data mnist-small --model mlp --workers 1 --compressor none --updates 600 --eval-every 600 --seed 3 --quiet \
  --out "$work/classifier-run" --save-model "$work/classifier.safetensors" >"$work/sim.log" 2>&1 ||
  fail "edgetrain-sim: $(tail -3 "$work/sim.log")"

server_args=(--state-dir "$work/state" --cert "$certs/server.crt" --cert-key "$certs/server.key" --ca "$certs/ca.crt"
             --mode gan --gan-workers 3 --gan-k 2 --gan-batch 8 --gan-deadline 2 --gan-swap-every 10
             --gan-checkpoint-every 15 --gan-eval-every 20 --gan-eval-samples 200
             --gan-classifier "$work/classifier.safetensors" --gan-classifier-model mlp --eval-data mnist-small)
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
port=$server_port

start_gan_worker() {  # start_gan_worker I LOG
  local i="$1"
  local command=("$worker")
  [ "$i" = 2 ] && [ -n "${WORKER_2_COMMAND:-}" ] && read -r -a command <<<"$WORKER_2_COMMAND"
  start_worker "$2" "$work/w$i.stats.json" "${command[@]}" --mode gan --server "coaps://127.0.0.1:$port" \
    --cert "$certs/gan-$i.crt" --cert-key "$certs/gan-$i.key" --ca "$certs/ca.crt" --topology "$work/topology.json" \
    --peer-name "gan-$i" --data mnist-small --batch 8 --worker-id "$i" --workers 3 --gan-fp16 --quiet --duration 150 \
    --give-up-after 60
  worker_pids[$i]=$last_pid
}
worker_pids=()
for i in 0 1 2; do start_gan_worker "$i" "$work/w$i.log"; done

wait_for_json "$server_stats" gan.iteration -ge 10 60 "$server_pid" || fail "fewer than 10 GAN iterations in 60 s"
kill -KILL "${worker_pids[1]}"
wait "${worker_pids[1]}" 2>/dev/null || true
at=$(json_get "$server_stats" gan.iteration)
echo "killed worker 1 (SIGKILL) near iteration $at"
wait_for_json "$server_stats" gan.iteration -ge $((at + 3)) 30 "$server_pid" || fail "iterations stopped when a worker was killed"
wait_for_json "$server_stats" gan.dropped -ge 1 5 "$server_pid" || fail "the killed worker was not counted as dropped"
start_gan_worker 1 "$work/w1-restarted.log"
wait_for_json "$work/w1.stats.json" iterations -ge 3 60 "${worker_pids[1]}" || fail "the restarted worker 1 did not take part"

wait_for_json "$server_stats" gan.iteration -ge 25 60 "$server_pid" || fail "fewer than 25 GAN iterations in 60 s"
before=$(json_get "$server_stats" gan.iteration)
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
echo "killed the server (SIGKILL) near iteration $before"
start_server "$server" "$work/server-2.log" --port "$port" "${server_args[@]}"
after=$(json_get "$server_stats" gan.iteration)
checkpoint=$(json_get "$server_stats" gan.recovered_checkpoint_iteration)
replayed=$(json_get "$server_stats" gan.replayed_iterations)
echo "restarted at iteration $after (checkpoint $checkpoint + $replayed logged steps)"
[ "$after" -ge "$before" ] || fail "restarted at iteration $after, before the $before completed"
[ "$after" -eq $((checkpoint + replayed)) ] || fail "iteration $after is not checkpoint $checkpoint + $replayed replayed"
wait_for_json "$server_stats" gan.iteration -ge $((after + 15)) 60 "$server_pid" || fail "training did not go on after the restart"
wait_for_json "$server_stats" gan.swap_rounds -ge 1 30 "$server_pid" || fail "no swap round after the restart"
for i in 0 1 2; do
  wait_for_json "$work/w$i.stats.json" swaps_received -ge 1 30 "${worker_pids[$i]}" || fail "worker $i received no discriminator"
done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $? after SIGTERM"
for i in 0 1 2; do kill -TERM "${worker_pids[$i]}"; done
for i in 0 1 2; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $? after SIGTERM"
  [ "$(json_get "$work/w$i.stats.json" peer_requests_refused)" -eq 0 ] || fail "worker $i refused a peer's discriminator"
done
[ -s "$work/state/gan/samples.png" ] || fail "no grid of samples in state/gan/samples.png"
ls "$work/state/gan"/checkpoint-* >/dev/null || fail "no GAN checkpoint"
echo "feedbacks $(json_get "$server_stats" gan.feedbacks), dropped $(json_get "$server_stats" gan.dropped)"
# The scores: a row per evaluation, the first at iteration 0; the Frechet distance falls.
python3 - "$work/state/gan/metrics.csv" "${GAN_SCORES:-check}" <<'PY' || fail "the generator's samples did not come closer to the test digits"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("Frechet distance (MNIST score) by iteration:",
      ", ".join("%s: %.1f (%.2f)" % (r["iteration"], float(r["frechet_distance"]), float(r["mnist_score"])) for r in rows))
assert len(rows) >= 2 and rows[0]["iteration"] == "0", rows
if sys.argv[2] == "check":
  assert min(float(r["frechet_distance"]) for r in rows[1:]) < 0.97 * float(rows[0]["frechet_distance"]), rows
PY
[ -s "$work/state/gan/scores.svg" ] || fail "no gan/scores.svg"
! grep -q ERROR "$work/server-1.log" "$work/server-2.log" || fail "an ERROR in the server's log"
echo "PASS"
