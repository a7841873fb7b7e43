#!/usr/bin/env bash
# edgetrain-emulate --mode gossip with an attacker (issue 37), at CI size: 4 MLP peers on a
# ring behind the impairer, peer w0 an edgetrain-gossip-attacker publishing a 1e30 output
# bias, the honest peers on the defence's defaults. Checks, from the run's files: w0's two
# honest neighbours refused its models (their stats files' "neighbours", for the magnitude
# bound) and mixed none in, and the run's evaluations, timeline, outcome.json and summary.md
# are the three honest peers' (w0's checkpoint in none of them), who still learn. Also that the
# settings refuse an attack outside gossip and a fleet of attackers only.
# usage: emulate_gossip_attack.sh BUILD_DIR [FLOOR]
build_dir="$1"; floor="${2:-0.6}"
emulate="$(dirname "$0")/../../emulation/edgetrain-emulate"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist

refused() {  # MESSAGE ARGS...: the settings refuse ARGS, saying MESSAGE
  local says=$1 status=0
  shift
  "$emulate" --build-dir "$build_dir" --out "$work/bad" --quiet "$@" >"$work/bad.log" 2>&1 || status=$?
  [ "$status" -eq 1 ] && grep -q -- "$says" "$work/bad.log" || fail "edgetrain-emulate $* was not refused ($status): $(cat "$work/bad.log")"
}
refused "are for --mode gossip" --malicious-peers 1
refused "must be below --workers 3" --mode gossip --workers 3 --malicious-peers 3
refused "is not bias:V or scale:F" --mode gossip --workers 3 --malicious-peers 1 --attack bias:lots

status=0
"$emulate" --build-dir "$build_dir" --mode gossip --out "$work/run" --workers 4 --model mlp --data mnist-small \
  --malicious-peers 1 --local-lr 0.1 --checkpoint-every 5 --neighbour-wait 2 \
  --duration 12 --eval-interval 4 --eval-examples 500 --quiet >"$work/emulate.log" 2>&1 || status=$?
watched_logs+=("$work/emulate.log" "$work/run/logs/worker-0.log" "$work/run/logs/worker-1.log")
[ "$status" -eq 0 ] || fail "edgetrain-emulate exited with status $status"
cat "$work/run/events.log" "$work/run/summary.md"
grep -q "ATTACKER: .* --attack bias:1e30" "$work/run/logs/worker-0.log" || fail "w0 did not run as the attacker"

# w0's honest neighbours on the ring, w1 and w3: refused for the bound, nothing mixed in.
for i in 1 3; do
  s="$work/run/logs/worker-$i.0.stats.json"
  [ "$(json_get "$s" neighbours.w0.refused)" -ge 1 ] || fail "w$i did not refuse w0: $(json_get "$s" neighbours)"
  [ "$(json_get "$s" neighbours.w0.mixed)" = 0 ] || fail "w$i mixed the attacker's model in"
  [ "$(json_get "$s" neighbours.w0.last_refusal)" = "model above the magnitude bound from a neighbour" ] ||
    fail "w$i refused w0 for: $(json_get "$s" neighbours.w0.last_refusal)"
done

outcome="$work/run/outcome.json"
[ "$(jq -c .attack.attackers "$outcome")" = '["w0"]' ] || fail "outcome.json's attackers: $(jq -c .attack "$outcome")"
[ "$(json_get "$outcome" attack.honest_peers)" = 3 ] || fail "outcome.json does not count 3 honest peers"
[ "$(json_get "$outcome" attack.attacker_models_refused)" -ge 2 ] || fail "outcome.json counts too few refusals"
[ "$(json_get "$outcome" attack.attacker_models_mixed)" = 0 ] || fail "outcome.json says a poisoned model was mixed in"
[ "$(json_get "$outcome" final.peers_evaluated)" = 3 ] || fail "the final evaluation is not of the 3 honest peers"
[ "$(jq -r '.peers[].peer' "$work/run/logs/final-eval.json" | paste -sd' ')" = "w1 w2 w3" ] ||
  fail "the final evaluation holds other peers than w1 w2 w3"
json_compare "$(json_get "$outcome" final.mean_accuracy)" -ge "$floor" || fail "the honest peers' mean accuracy stayed below $floor"
[ "$(tail -n +2 "$work/run/gossip-timeline.csv" | wc -l)" -ge 1 ] || fail "no evaluation during the run"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $c["honest_peers"] != 3 { bad = 1 } END { exit bad }' \
  "$work/run/gossip-timeline.csv" || fail "a timeline row is not of the 3 honest peers"
grep -q "mean honest peer" "$work/run/summary.md" || fail "summary.md does not say the accuracy is the honest peers'"
echo "emulate_gossip_attack: ok ($(json_get "$outcome" attack.attacker_models_refused) refusals of w0; honest peers $(json_get "$outcome" final.mean_accuracy))"
