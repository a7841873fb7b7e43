#!/usr/bin/env bash
# A sharded server in the emulator: edgetrain-emulate --shards 3 runs three edgetrain-server
# --shard J/3 processes and 3 workers (MLP, AdaComp), each worker reaching every shard
# through its own impairer link, and kills shard 1 with SIGKILL mid-run, restarting it 2 s
# later on its state directory. Checks: the model assembled from the shards' checkpoints
# learns (test accuracy reaches FLOOR after the restart), no version shard 1 acknowledged is
# lost (its recovered version against the highest one any worker got from it), every worker
# got updates acknowledged, and there is one link per worker and shard.
# usage: emulate_shards.sh BUILD_DIR [FLOOR]
build_dir="$1"; floor="${2:-0.8}"
emulate="$(dirname "$0")/../../emulation/edgetrain-emulate"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist

status=0
# Slowed-down workers and a raised staleness bound, as in emulate_small.sh: the shards apply
# faster than three workers produce, and the kill must find updates applied on every shard.
"$emulate" --build-dir "$build_dir" --out "$work/run" --workers 3 --shards 3 --shard-checkpoint-every 20 --model mlp \
  --data mnist-small --pull-every 8 --request-timeout 30 --slowdown 100 --max-staleness 1000 --fail kill-shard:1@10+2 \
  --duration 110 --target-accuracy "$floor" --eval-interval 1 --eval-examples 1000 --quiet >"$work/emulate.log" 2>&1 || status=$?
watched_logs+=("$work/emulate.log" "$work/run/logs/shard-1-1.log" "$work/run/logs/shard-1-2.log" "$work/run/logs/worker-0.log"
               "$work/run/logs/fleet-eval.log")
[ "$status" -eq 0 ] || fail "edgetrain-emulate exited with status $status"
cat "$work/run/events.log"

outcome="$work/run/outcome.json"
cat "$outcome"
recovered=$(expect_emulated_restarts_lost_nothing "$outcome" "shard 1")
grep -q "restarted shard 1: recovered version" "$work/run/events.log" || fail "events.log has no restart check of shard 1"
[ "$(json_get "$outcome" stop)" = target ] && json_compare "$(json_get "$outcome" target_reached.accuracy)" -ge "$floor" ||
  fail "the assembled model's test accuracy never reached $floor"
# Learning went on after the restart: the row that met the floor was evaluated after it
# (the timeline's version is the mean of the three shards' checkpoint versions).
restart_time=$(awk -F, 'NR == 2 { print $1 }' "$work/run/restarts.csv")
json_compare "$(json_get "$outcome" target_reached.elapsed_s)" -gt "$restart_time" ||
  fail "the floor was met before shard 1's restart at $restart_time s"
[ "$(tail -n +2 "$work/run/links.csv" | wc -l)" -eq 9 ] || fail "not one link per worker and shard: $(cat "$work/run/links.csv")"
awk -F, 'NR > 1 && $9 == 0 { bad = 1 } END { exit bad }' "$work/run/workers.csv" ||
  fail "a worker got no update acknowledged: $(cat "$work/run/workers.csv")"
awk -F, 'END { exit !($5 > $4 && $4 > 0) }' "$work/run/timeline.csv" ||
  fail "the shards' socket ingress not above their payload ingress: $(tail -n1 "$work/run/timeline.csv")"
for j in 0 1 2; do
  [ -s "$work/run/state/shard-$j/checkpoint.safetensors" ] || fail "shard $j left no checkpoint"
done
json_compare "$(json_get "$work/run/logs/final-eval.json" test_examples)" -gt 1000 || fail "the final evaluation did not use the whole test set"
echo "3 shards, 3 workers, shard 1 killed and restarted: learned past $floor, no acknowledged update lost"
