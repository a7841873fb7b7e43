#!/usr/bin/env bash
# MD-GAN as separate programs on loopback DTLS with X.509 identities from one test CA: the
# server holds the generator (--mode gan), three workers each train a discriminator on their
# shard of mnist-small and send their error feedback; every few iterations they swap
# discriminators peer to peer (--topology, their own CoAP/DTLS endpoints). Then the server
# is killed with SIGKILL: restarted, it is at the last completed iteration or later
# (checkpoint + logged steps), the workers go on, and each worker received discriminators
# from its peers with none refused. A worker may be another program (WORKER_2_COMMAND, e.g.
# the aarch64 build under qemu-aarch64) than the host build the others run.
# usage: [WORKER_2_COMMAND=...] gan_fleet.sh SERVER WORKER TOPOLOGY
server="$1"; worker="$2"; topology="$3"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
bash "$(dirname "$0")/make_test_certificates.sh" "$work/certs" gan-0 gan-1 gan-2 || exit $?
certs="$work/certs"

base=$(python3 -c '
import random, socket
for _ in range(200):
    base = random.randrange(20000, 60000)
    try:
        socks = []
        for p in range(base, base + 3):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", p)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
')
"$topology" --kind full --peers 3 --name-prefix gan- --addresses '127.0.0.1:{port}' --base-port "$base" --out "$work/topology.json"

server_args=(--state-dir "$work/state" --cert "$certs/server.crt" --cert-key "$certs/server.key" --ca "$certs/ca.crt"
             --mode gan --gan-workers 3 --gan-k 2 --gan-batch 8 --gan-deadline 5 --gan-swap-every 10
             --gan-checkpoint-every 15 --gan-samples-every 20)
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
port=$server_port

worker_pids=()
for i in 0 1 2; do
  command=("$worker")
  [ "$i" = 2 ] && [ -n "${WORKER_2_COMMAND:-}" ] && read -r -a command <<<"$WORKER_2_COMMAND"
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "${command[@]}" --mode gan --server "coaps://127.0.0.1:$port" \
    --cert "$certs/gan-$i.crt" --cert-key "$certs/gan-$i.key" --ca "$certs/ca.crt" --topology "$work/topology.json" \
    --peer-name "gan-$i" --data mnist-small --batch 8 --worker-id "$i" --workers 3 --gan-fp16 --quiet --duration 150 \
    --give-up-after 60
  worker_pids+=("$last_pid")
done

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
! grep -q ERROR "$work/server-1.log" "$work/server-2.log" || fail "an ERROR in the server's log"
echo "PASS"
