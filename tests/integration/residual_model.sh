#!/usr/bin/env bash
# A built-in residual model end to end in each training mode (issue 35): the real
# edgetrain-server and edgetrain-worker programs on loopback train resnet-8 (a graph: skips,
# strided 1x1 projections; model/README.md, "Built-in edge models") on mnist-small until an
# evaluation that the mode itself makes is clearly above chance (MNIST's commonest class is
# 11 % of the digits):
#   async   server + 2 asynchronous AdaComp workers over DTLS-PSK; the server's evaluator on
#           mnist-small's 2,000 test digits passes 0.30; the workers' updates are accepted and
#           their model deltas reproduce the server's parameters (the compressor, codec and
#           WAL take the graph's tensors like any model's)
#   rounds  server --mode rounds (FedAvg, wait-all) + 2 round workers over DTLS-PSK; the
#           server's evaluator, on the first 500 test digits (cut below: a 2,000-digit
#           evaluation of resnet-8 costs more than the rounds do), passes 0.20; every worker
#           trained rounds and had no delta refused
#   gossip  2 --insecure gossip peers (D-PSGD, full topology); each peer's own validation
#           (worker/README.md, accuracy-aware training: 10 % of its shard, 400 digits held out)
#           passes 0.20; they exchanged models and refused none
# lr 0.1 in rounds and gossip: resnet-8 has no normalization and sits near ln 10 for its first
# ~150 steps at 0.05 (trainer_test's Resnet8LongRun); 0.1 leaves it sooner.
# usage: residual_model.sh SERVER WORKER MODES [TOPOLOGY]   (MODES: comma separated;
#        TOPOLOGY, edgetrain-topology, for gossip)
server="$1"; worker="$2"; modes="$3"; topology="${4:-}"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

train_async() {
  local floor=0.30 i pid stats
  for i in 0 1; do add_device "$server" "$work/async-keys.toml" "w$i" "$work/async-w$i.toml"; done
  # lr 0.05: trainer_test's Resnet8LongRun learns at it.
  start_server "$server" "$work/async-server.log" --port 0 --state-dir "$work/async-state" \
    --keystore "$work/async-keys.toml" --model resnet-8 --lr 0.05 --eval-data mnist-small --eval-interval 1
  local worker_pids=()
  for i in 0 1; do
    start_worker "$work/async-w$i.log" "$work/async-w$i.stats.json" "$worker" --config "$work/async-w$i.toml" \
      --server "coaps://127.0.0.1:$server_port" --model resnet-8 --data mnist-small --worker-id "$i" --workers 2 \
      --duration 90
    worker_pids+=("$last_pid")
  done
  wait_for_json "$server_stats" last_evaluation.accuracy -gt "$floor" 85 "$server_pid" ||
    fail "async resnet-8: no test accuracy above $floor within 85 s (latest: $(json_get "$server_stats" last_evaluation || true))"
  echo "ok: async resnet-8, server + 2 workers: $(json_get "$server_stats" last_evaluation | tr '\n' ' ')"
  for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
  for i in 0 1; do
    wait_for_exit "${worker_pids[$i]}" 30 || fail "async worker $i exited with status $?"
    stats="$work/async-w$i.stats.json"
    [ "$(json_get "$stats" updates_accepted)" -gt 0 ] || fail "async worker $i got no update accepted"
    [ "$(json_get "$stats" delta_mismatches)" -eq 0 ] || fail "async worker $i got an unusable model delta"
  done
  kill -TERM "$server_pid"
  wait_for_exit "$server_pid" 30 || fail "the async server exited with status $?"
}

# cut_test_set SOURCE_DIR N OUT_DIR: the first N test digits as IDX files (the count in each
# header rewritten; the files are raw IDX: 16-byte image and 8-byte label headers).
cut_test_set() {
  local src="$1" n="$2" out="$3" hex count
  mkdir -p "$out"
  hex=$(printf '%08x' "$n")
  count="\\x${hex:0:2}\\x${hex:2:2}\\x${hex:4:2}\\x${hex:6:2}"
  { head -c 4 "$src/t10k-images-idx3-ubyte"; printf "$count"
    dd if="$src/t10k-images-idx3-ubyte" iflag=skip_bytes,count_bytes skip=8 count=$((8 + n * 28 * 28)) status=none
  } >"$out/t10k-images-idx3-ubyte"
  { head -c 4 "$src/t10k-labels-idx1-ubyte"; printf "$count"
    dd if="$src/t10k-labels-idx1-ubyte" iflag=skip_bytes,count_bytes skip=8 count="$n" status=none
  } >"$out/t10k-labels-idx1-ubyte"
}

train_rounds() {
  local floor=0.20 i pid stats started=$SECONDS
  cut_test_set "$mnist_dir" 500 "$work/test-500"
  for i in 0 1; do add_device "$server" "$work/rounds-keys.toml" "w$i" "$work/rounds-w$i.toml"; done
  start_server "$server" "$work/rounds-server.log" --port 0 --state-dir "$work/rounds-state" \
    --keystore "$work/rounds-keys.toml" --model resnet-8 --lr 0.1 --mode rounds --round-policy wait-all \
    --round-deadline 10 --min-clients 2 --local-steps 10 --eval-data "$work/test-500" --eval-interval 0.5
  local worker_pids=()
  for i in 0 1; do
    start_worker "$work/rounds-w$i.log" "$work/rounds-w$i.stats.json" "$worker" --config "$work/rounds-w$i.toml" \
      --mode rounds --lr 0.1 --compressor none --server "coaps://127.0.0.1:$server_port" --model resnet-8 \
      --data mnist-small --worker-id "$i" --workers 2 --quiet --duration 90
    worker_pids+=("$last_pid")
  done
  wait_for_json "$server_stats" last_evaluation.accuracy -gt "$floor" 60 "$server_pid" ||
    fail "rounds resnet-8: no test accuracy above $floor within 60 s (latest: $(json_get "$server_stats" last_evaluation || true))"
  echo "ok: rounds resnet-8, server + 2 workers, $(json_get "$server_stats" rounds.rounds_closed) rounds in $((SECONDS - started)) s: $(json_get "$server_stats" last_evaluation | tr '\n' ' ')"
  for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
  for i in 0 1; do
    wait_for_exit "${worker_pids[$i]}" 30 || fail "rounds worker $i exited with status $?"
    stats="$work/rounds-w$i.stats.json"
    [ "$(json_get "$stats" rounds_trained)" -gt 0 ] || fail "rounds worker $i trained no round"
    [ "$(json_get "$stats" deltas_refused)" -eq 0 ] || fail "rounds worker $i had a delta refused"
  done
  kill -TERM "$server_pid"
  wait_for_exit "$server_pid" 30 || fail "the rounds server exited with status $?"
}

train_gossip() {
  local floor=0.20 i base started=$SECONDS
  [ -n "$topology" ] || fail "gossip needs edgetrain-topology (the 4th argument)"
  base=$(free_udp_ports 2)
  "$topology" --kind full --peers 2 --addresses '127.0.0.1:{port}' --base-port "$base" --out "$work/topology.json"
  local pids=()
  for i in 0 1; do
    # --plateau-patience 1000: validations every 20 iterations, never a stop within the test.
    start_program "$work/peer-$i.log" "$worker" --mode gossip --insecure --topology "$work/topology.json" \
      --peer-name "peer-$i" --model resnet-8 --data mnist-small --worker-id "$i" --workers 2 --lr 0.1 \
      --neighbour-wait 2 --duration 90 --stats-file "$work/peer-$i.json" --quiet \
      --plateau-patience 1000 --validation-fraction 0.1 --validate-every 20
    pids[$i]=$last_pid
  done
  for i in 0 1; do
    wait_for_json "$work/peer-$i.json" validation_accuracy -gt "$floor" 60 "${pids[$i]}" ||
      fail "gossip resnet-8: peer-$i's validation accuracy not above $floor within 60 s (latest: $(json_get "$work/peer-$i.json" validation_accuracy || true))"
  done
  echo "ok: gossip resnet-8, 2 peers in $((SECONDS - started)) s: validation accuracy $(json_get "$work/peer-0.json" validation_accuracy) and $(json_get "$work/peer-1.json" validation_accuracy) at iterations $(json_get "$work/peer-0.json" iteration) and $(json_get "$work/peer-1.json" iteration)"
  for i in 0 1; do kill -TERM "${pids[$i]}"; done
  for i in 0 1; do
    wait_for_exit "${pids[$i]}" 30 || fail "peer-$i exited with status $?: $(tail -n 5 "$work/peer-$i.log")"
    [ "$(json_get "$work/peer-$i.json" exchanges)" -gt 0 ] || fail "peer-$i exchanged no model"
    [ "$(json_get "$work/peer-$i.json" models_refused)" -eq 0 ] || fail "peer-$i refused a neighbour's model"
  done
}

IFS=, read -r -a mode_list <<<"$modes"
[ "${#mode_list[@]}" -gt 0 ] || fail "no mode given (async, rounds, gossip)"
for mode in "${mode_list[@]}"; do
  case "$mode" in
    async) train_async ;;
    rounds) train_rounds ;;
    gossip) train_gossip ;;
    *) fail "unknown mode '$mode' (async, rounds, gossip)" ;;
  esac
done
echo "ok: resnet-8 trained end to end in: $modes"
