#!/usr/bin/env bash
# A built-in residual model end to end (issue 35): edgetrain-server and two asynchronous
# edgetrain-workers over DTLS-PSK on loopback train resnet-8 (a graph: skips, strided 1x1
# projections; model/README.md, "Built-in edge models") on mnist-small until the server's
# evaluator reports a test accuracy above FLOOR. The workers' updates are accepted and their
# model deltas reproduce the server's parameters (the compressor, codec and WAL take the
# graph's tensors like any model's), and everything stops cleanly.
# usage: residual_model.sh SERVER WORKER [FLOOR]
server="$1"; worker="$2"; floor="${3:-0.30}"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
# lr 0.05: resnet-8 has no normalization; trainer_test's Resnet8LongRun learns at it.
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model resnet-8 --lr 0.05 --eval-data mnist-small --eval-interval 1
worker_pids=()
for i in 0 1; do
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "$worker" --config "$work/w$i.toml" \
    --server "coaps://127.0.0.1:$server_port" --model resnet-8 --data mnist-small --worker-id "$i" --workers 2 \
    --duration 90
  worker_pids+=("$last_pid")
done
wait_for_json "$server_stats" last_evaluation.accuracy -gt "$floor" 85 "$server_pid" ||
  fail "resnet-8: no test accuracy above $floor within 85 s (latest: $(json_get "$server_stats" last_evaluation || true))"
echo "ok: resnet-8, server + 2 async workers: $(json_get "$server_stats" last_evaluation | tr '\n' ' ')"
for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
for i in 0 1; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $?"
  stats="$work/w$i.stats.json"
  [ "$(json_get "$stats" updates_accepted)" -gt 0 ] || fail "worker $i got no update accepted"
  [ "$(json_get "$stats" delta_mismatches)" -eq 0 ] || fail "worker $i got an unusable model delta"
done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
echo "ok: resnet-8 trained end to end"
