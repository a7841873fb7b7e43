#!/usr/bin/env bash
# Q-Block2 (RFC 9177) between the programs, and RFC 7959 Block2 with peers that do not offer
# it, end to end on loopback (MLP, mnist-small, a pull before every step):
#  1. the server (Q-Block on, the default) and a worker with --q-block=false, which asks for
#     every block of a pull as the previous release does: every update accepted;
#  2. the same with a worker with Q-Block on: every update accepted, and fewer datagrams
#     reach the server's socket per step than in 1 (a pull is one request per burst of 10
#     blocks, not one per block);
#  3. a server with --q-block=false (answers 4.02 to a Q-Block2 request) and a worker with
#     Q-Block on, which falls back to Block2: every update accepted.
# usage: q_block_programs.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
steps=15
add_device "$server" "$work/keys.toml" w0 "$work/w0.toml"

# run NAME SERVER-FLAGS WORKER-FLAGS: sets per_step, the server's ingress datagrams per step.
run() {
  local name="$1" server_flags="$2" worker_flags="$3"
  # shellcheck disable=SC2086 # flags: words on purpose
  start_server "$server" "$work/$name-server.log" --port 0 --state-dir "$work/$name-state" \
    --keystore "$work/keys.toml" --model mlp --eval-data none $server_flags
  # shellcheck disable=SC2086
  start_worker "$work/$name-worker.log" "$work/$name-worker.stats.json" "$worker" --config "$work/w0.toml" \
    --server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --worker-id 0 --workers 1 \
    --steps "$steps" --quiet $worker_flags
  wait_for_exit "$last_pid" 120 || fail "$name: the worker exited with status $?"
  local stats="$work/$name-worker.stats.json"
  [ "$(json_get "$stats" steps)" -eq "$steps" ] && [ "$(json_get "$stats" updates_accepted)" -eq "$steps" ] ||
    fail "$name: the worker did not get all $steps updates accepted"
  kill -TERM "$server_pid"
  wait_for_exit "$server_pid" 30 || fail "$name: the server exited with status $?"
  [ "$(json_get "$server_stats" version)" -eq "$steps" ] || fail "$name: the server applied $(json_get "$server_stats" version) updates, not $steps"
  per_step=$(( $(json_get "$server_stats" ingress_socket_datagrams) / steps ))
}

run block2-worker "" --q-block=false
block2=$per_step
echo "ok: a worker without Q-Block trains against the server: $block2 datagrams in per step"
run q-block "" ""
q_block=$per_step
echo "ok: a worker with Q-Block trains: $q_block datagrams in per step"
[ $((q_block * 4)) -lt $((block2 * 3)) ] ||
  fail "Q-Block2 pulls did not save datagrams: $q_block per step against $block2 with Block2"
run block2-server --q-block=false ""
fallback=$per_step
echo "ok: a worker with Q-Block trains against a server without it (Block2): $fallback datagrams in per step"
