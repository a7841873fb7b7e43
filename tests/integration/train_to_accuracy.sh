#!/usr/bin/env bash
# End to end on one machine: edgetrain-server and three edgetrain-worker processes over
# DTLS-PSK on loopback train the MLP on MNIST until the server's evaluator reports a test
# accuracy above FLOOR (in the server's --stats-file). Also checks that the server's socket
# ingress (DTLS, headers, handshakes) exceeds the payload ingress, that its socket egress
# exceeds the model bytes the workers received, and that everything stops
# cleanly. Extra server flags after FLOOR, e.g. --publish-every 5: then the workers train on
# the published model (server/README.md), whose deltas must check out against its digest too;
# --pull-fraction F: the cheap pull (server/README.md, "Cheap pull"): every pull a delta
# smaller than the dense model, from the server's record of that worker's copy (the server's
# stats file counts them), each checked by its digest; the first one too (the seeded first
# pull: a delta from version 0's model), except for worker 2, which runs with another --seed:
# its first delta fails the digest, it pulls the dense model once and still trains. Without
# --pull-fraction every worker's seeded first pull must check out (no fallback).
# usage: train_to_accuracy.sh SERVER WORKER [FLOOR [SERVER FLAGS...]]
server="$1"; worker="$2"; floor="${3:-0.70}"
server_flags=("${@:4}")
source "$(dirname "$0")/process_test_lib.sh"
require_mnist

for i in 0 1 2; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model mlp --eval-data mnist-small --eval-interval 1 "${server_flags[@]}"
echo "server on port $server_port"

cheap=0; [[ " ${server_flags[*]} " == *" --pull-fraction "* ]] && cheap=1
worker_pids=()
for i in 0 1 2; do
  # With the cheap pull, worker 2's version 0 is not the server's (the server's --seed is 1).
  seed_flags=(); [ "$cheap" = 1 ] && [ "$i" = 2 ] && seed_flags=(--seed 7)
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "$worker" --config "$work/w$i.toml" \
    --server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --worker-id "$i" --workers 3 --duration 75 \
    ${seed_flags[@]+"${seed_flags[@]}"}
  worker_pids+=("$last_pid")
done

# The server's stats file carries its latest evaluation (rewritten every second).
wait_for_json "$server_stats" last_evaluation.accuracy -gt "$floor" 70 "$server_pid" ||
  fail "no test accuracy above $floor within 70 s (latest: $(json_get "$server_stats" last_evaluation || true))"
echo "reached: $(json_get "$server_stats" last_evaluation | tr '\n' ' ')"

# The socket sees every payload byte plus DTLS records, CoAP headers and the handshakes.
# Payload first: both only grow, so a socket count read after it can only be larger.
payload=$(json_get "$server_stats" ingress_payload_bytes)
socket=$(json_get "$server_stats" ingress_socket_bytes)
[ "$payload" -gt 0 ] && [ "$socket" -gt "$payload" ] || fail "socket ingress $socket not above payload ingress $payload"

for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
pulled=0
for i in 0 1 2; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $?"
  stats="$work/w$i.stats.json"
  [ "$(json_get "$stats" state)" = stopped ] || fail "worker $i did not write its final stats"
  [ "$(json_get "$stats" updates_accepted)" -gt 0 ] || fail "worker $i got no update accepted"
  # Pulls after the first are model deltas (the default), each checked against the digest
  # of the server's parameters; a delta that did not reproduce them is counted.
  [ "$(json_get "$stats" delta_pulls)" -gt 0 ] || fail "worker $i pulled no model delta"
  fallbacks=0; [ "$cheap" = 1 ] && [ "$i" = 2 ] && fallbacks=1
  [ "$(json_get "$stats" seeded_first_pull_fallbacks)" -eq "$fallbacks" ] ||
    fail "worker $i: $(json_get "$stats" seeded_first_pull_fallbacks) seeded first pulls fell back to dense, expected $fallbacks"
  [ "$(json_get "$stats" delta_mismatches)" -eq "$fallbacks" ] || fail "worker $i got an unusable model delta"
  pulled=$((pulled + $(json_get "$stats" bytes_received)))
done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
if [[ " ${server_flags[*]} " == *" --publish-every "* ]]; then
  steps=$(json_get "$server_stats" published_model.steps)
  [ "$steps" -gt 0 ] || fail "the server published no step of its published model"
  [ "$(json_get "$server_stats" published_model.version)" -le "$(json_get "$server_stats" version)" ] ||
    fail "the published model is ahead of the true one"
  echo "published model: $steps steps, relative lag $(json_get "$server_stats" published_model.relative_lag)"
else
  [ "$(json_get "$server_stats" published_model)" = null ] || fail "a published model without --publish-every"
fi
if [[ " ${server_flags[*]} " == *" --pull-fraction "* ]]; then
  # Every pull a delta from the worker's record smaller than the dense model, counted by the
  # server and by each worker; the first one a seeded delta from version 0 as small as the
  # later ones, but for worker 2 (another --seed): its seeded delta fails, then one dense pull.
  dense=$(json_get "$server_stats" cheap_pull.dense_pulls)
  deltas=$(json_get "$server_stats" cheap_pull.delta_pulls)
  largest=$(json_get "$server_stats" cheap_pull.largest_delta_bytes)
  model_bytes=$(json_get "$server_stats" cheap_pull.dense_model_bytes)
  [ "$dense" -eq 1 ] || fail "cheap pull: $dense dense pulls, expected one (worker 2's, after its seeded delta failed)"
  [ "$(json_get "$server_stats" cheap_pull.seeded_records)" -eq 3 ] ||
    fail "cheap pull: $(json_get "$server_stats" cheap_pull.seeded_records) records started from version 0, expected one per worker"
  [ "$deltas" -gt 30 ] || fail "cheap pull: only $deltas deltas"
  [ "$largest" -lt "$model_bytes" ] || fail "cheap pull: a delta of $largest B, the dense model is $model_bytes B"
  [ "$(json_get "$server_stats" cheap_pull.records)" -eq 3 ] || fail "cheap pull: not one record per worker"
  for i in 0 1 2; do
    stats="$work/w$i.stats.json"
    dense_expected=0; kind=delta; [ "$i" = 2 ] && { dense_expected=1; kind=dense; }
    [ $(( $(json_get "$stats" pulls) - $(json_get "$stats" delta_pulls) )) -eq "$dense_expected" ] ||
      fail "worker $i: $(json_get "$stats" pulls) pulls of which $(json_get "$stats" delta_pulls) deltas, expected $dense_expected dense"
    [ "$(json_get "$stats" first_pull)" = "$kind" ] || fail "worker $i: its first pull was $(json_get "$stats" first_pull), expected $kind"
    first=$(json_get "$stats" first_pull_bytes)
    if [ "$kind" = delta ]; then
      # One of the deltas the server counted, a tenth of the dense model at most.
      [ "$first" -gt 0 ] && [ "$first" -le "$largest" ] && [ $((first * 10)) -lt "$model_bytes" ] ||
        fail "worker $i: a seeded first pull of $first B (largest delta $largest B, dense $model_bytes B)"
    else
      [ "$first" -eq "$model_bytes" ] || fail "worker $i: a dense first pull of $first B, the dense model is $model_bytes B"
    fi
  done
  echo "seeded first pulls: $(json_get "$work/w0.stats.json" first_pull_bytes) B and $(json_get "$work/w1.stats.json" first_pull_bytes) B against $model_bytes B dense; worker 2 (--seed 7) fell back to dense"

  echo "cheap pull: $dense dense pulls, $deltas deltas ($(json_get "$server_stats" cheap_pull.repeated_pulls) repeated), mean $(( $(json_get "$server_stats" cheap_pull.delta_bytes) / deltas )) B, largest $largest B against $model_bytes B dense"
else
  [ "$(json_get "$server_stats" cheap_pull)" = null ] || fail "cheap pull records without --pull-fraction"
fi
# "stopped" is written after the final checkpoint.
[ "$(json_get "$server_stats" state)" = stopped ] || fail "the server did not write its final checkpoint and stats"
# What left the server's socket carries every model byte the workers received, in DTLS records.
egress=$(json_get "$server_stats" egress_socket_bytes)
[ "$egress" -gt "$pulled" ] || fail "socket egress $egress B not above the $pulled B of models the workers received"
echo "three workers trained the MLP past $floor test accuracy; socket ingress $socket B vs payload $payload B; egress $egress B for $pulled B of models"
