#!/usr/bin/env bash
# edgetrain-emulate --mode gossip at CI size: 3 peers (MLP, ring, D-PSGD with compressed
# exchanges) in their namespaces, no server, every exchange through the link impairer (a
# link per directed edge, one peer's links capped at 50 Mbit/s), peer 1 killed with SIGKILL mid-run and
# restarted. Checks, from the run's files: the fleet learns (the final mean peer accuracy
# on the whole test set reaches FLOOR, and evaluations during the run are in the timeline),
# the restarted peer resumed from its last checkpoint (not from scratch), every directed
# link carried traffic, no peer refused a model, and a gossip run refuses a server failure.
# usage: emulate_gossip.sh BUILD_DIR [FLOOR]
build_dir="$1"; floor="${2:-0.7}"
emulate="$(dirname "$0")/../../emulation/edgetrain-emulate"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist

status=0
"$emulate" --build-dir "$build_dir" --mode gossip --out "$work/bad" --workers 3 --fail kill-server@5 --quiet \
  >"$work/bad.log" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "no server to kill" "$work/bad.log" || fail "a gossip run took a server failure (status $status)"

status=0
"$emulate" --build-dir "$build_dir" --mode gossip --out "$work/run" --workers 3 --model mlp --data mnist-small \
  --gossip-publish-fraction 0.1 --checkpoint-every 5 --neighbour-wait 2 --link bandwidth=50000 --impaired 1 --fail kill-worker:1@8+2 \
  --duration 30 --eval-interval 4 --eval-examples 500 --quiet >"$work/emulate.log" 2>&1 || status=$?
watched_logs+=("$work/emulate.log" "$work/run/logs/worker-0.log" "$work/run/logs/worker-1.log")
[ "$status" -eq 0 ] || fail "edgetrain-emulate exited with status $status"
cat "$work/run/events.log" "$work/run/summary.md"

outcome="$work/run/outcome.json"
[ "$(json_get "$outcome" mode)" = gossip ] || fail "outcome.json is not a gossip run's"
json_compare "$(json_get "$outcome" final.mean_accuracy)" -ge "$floor" || fail "the peers' mean accuracy stayed below $floor"
[ "$(json_get "$outcome" final.test_examples)" -eq 2000 ] || fail "the final evaluation did not use the whole test set"
[ "$(tail -n +2 "$work/run/gossip-timeline.csv" | wc -l)" -ge 2 ] || fail "fewer than 2 evaluations during the run"
[ "$(json_get "$outcome" peer_restarts | wc -l)" -eq 1 ] || fail "peer 1's restart is not in outcome.json"
[ "$(json_get "$outcome" checkpoints_resumed)" = true ] || fail "peer 1 did not resume from its last checkpoint"
resumed=$(json_get "$outcome" peer_restarts.0.resumed_iteration)
[ "$resumed" -ge 5 ] || fail "peer 1 resumed at iteration $resumed: it was killed before its first checkpoint, or started over"

# A ring of 3: 6 directed links, each of which carried requests and answers.
[ "$(grep -c '^\[\[link\]\]' "$work/run/links.toml")" -eq 6 ] || fail "links.toml does not have a link per directed edge"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
         $c["to_server_bytes_in"] == 0 || $c["to_worker_bytes_in"] == 0 { print "idle link " $1; bad = 1 }
         END { exit bad }' "$work/run/links.csv" || fail "a link carried nothing: an exchange bypassed the impairer"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $c["models_refused"] != 0 { bad = 1 } END { exit bad }' \
  "$work/run/workers.csv" || fail "a peer refused a neighbour's model"
echo "emulate_gossip: ok"
