#!/usr/bin/env bash
# The report program's gossip side on a made-up run directory, no peers running:
# gossip-wiring gives every peer an address and the impairer a link per directed edge to the
# right neighbour; gossip-topologies points each peer's neighbours at the impairer's ends;
# gossip-row turns a fleet evaluation into timeline rows; summarize --mode gossip passes a
# peer that resumed from its last checkpoint and fails (exit 3) one that started over; and
# gossip-compare tables the run.
# usage: emulate_gossip_report.sh REPORT_PROGRAM TOPOLOGY_PROGRAM
set -euo pipefail
report="$1" topology="$2"
fail() { echo "FAIL: $*" >&2; exit 1; }
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
mkdir -p "$run/logs"

"$report" plan --seed 3 --workers 3 --network netns --subnet 150 --link delay=5,loss=0.01 --impaired 1 >"$run/plan.csv"
"$topology" --kind ring --peers 3 --name-prefix w --out "$run/topology.json" 2>/dev/null
"$report" gossip-wiring "$run" --network netns --subnet 150
[ "$(cat "$run/peers.csv")" = "peer,name,listen,neighbours,attack
0,w0,10.150.0.2:5684,1;2,
1,w1,10.150.0.6:5684,0;2,
2,w2,10.150.0.10:5684,0;1," ] || fail "peers.csv: $(cat "$run/peers.csv")"
[ "$(grep -c '^\[\[link\]\]' "$run/links.toml")" -eq 6 ] || fail "not a link per directed edge"
# w1 dials w2 through a link on w1's side (10.150.0.5) that forwards to w2's address, with
# w1's profile (not impaired); w0's links carry w0's profile.
grep -A3 'name = "w1-w2"' "$run/links.toml" | grep -q 'listen = "10.150.0.5:0"' || fail "w1-w2 does not listen on w1's side"
grep -A3 'name = "w1-w2"' "$run/links.toml" | grep -q 'upstream = "10.150.0.10:5684"' || fail "w1-w2 does not lead to w2"
grep -A5 'name = "w0-w2"' "$run/links.toml" | grep -q 'delay_ms = 5' || fail "w0's links lack w0's profile"
grep -A5 'name = "w1-w0"' "$run/links.toml" | grep -q 'delay_ms = 0' || fail "w1's links took another peer's profile"
"$report" gossip-wiring "$run" --network loopback --subnet 150
grep -q '^2,w2,127.150.0.12:5684,' "$run/peers.csv" || fail "loopback peers do not get addresses of their own"
# Attackers (edgetrain-emulate --malicious-peers): marked in peers.csv; none but attackers refused.
"$report" gossip-wiring "$run" --network loopback --subnet 150 --malicious-peers 1 --attack bias:1e30
grep -q '^0,w0,127.150.0.10:5684,1;2,bias:1e30$' "$run/peers.csv" || fail "the attacker is not marked: $(cat "$run/peers.csv")"
if "$report" gossip-wiring "$run" --network loopback --subnet 150 --malicious-peers 3 --attack bias:1 2>/dev/null; then
  fail "gossip-wiring took a fleet of attackers only"
fi
"$report" gossip-wiring "$run" --network loopback --subnet 150

echo '{"links": {"w0-w1": "127.0.0.1:4001", "w0-w2": "127.0.0.1:4002", "w1-w0": "127.0.0.1:4003",
  "w1-w2": "127.0.0.1:4004", "w2-w0": "127.0.0.1:4005", "w2-w1": "127.0.0.1:4006"}}' >"$run/logs/impairer.ports.json"
"$report" gossip-topologies "$run"
[ "$(jq -r '.peers[].address' "$run/peers/w1.topology.json" | paste -sd' ')" = "127.0.0.1:4003 127.150.0.11:5684 127.0.0.1:4004" ] ||
  fail "w1's topology does not lead through the impairer: $(jq -c .peers "$run/peers/w1.topology.json")"
rm "$run/logs/impairer.ports.json"
if "$report" gossip-topologies "$run" 2>/dev/null; then fail "gossip-topologies went on without the impairer's ports"; fi

# Peer 1 was killed at iteration 47 (stats) and restarted; its checkpoints come every 10.
stats() {  # FILE ITERATION RESUMED BYTES
  printf '{"mode": "gossip", "iteration": %s, "resumed_iteration": %s, "steps": 5, "exchanges": 9, "bytes_sent": %s,
    "bytes_received": 7, "neighbours_skipped": 0, "models_refused": 0, "requests_refused": 0, "batch": 10}\n' "$2" "$3" "$4" >"$1"
}
stats "$run/logs/worker-0.0.stats.json" 60 0 1000
stats "$run/logs/worker-1.0.stats.json" 47 0 400
stats "$run/logs/worker-1.1.stats.json" 58 40 300
stats "$run/logs/worker-2.0.stats.json" 59 0 900
echo '{"peers": [{"iteration": 60}, {"iteration": 50}, {"iteration": 55}], "mean_accuracy": 0.9, "min_accuracy": 0.85,
  "max_accuracy": 0.93, "consensus_accuracy": 0.95, "test_examples": 1000}' >"$run/eval.json"
printf 'link,listen,to_server_bytes_in,to_worker_bytes_in\nw0-w1,x,100,200\nw1-w0,x,300,600\n' >"$run/links.csv"
[ "$("$report" gossip-row "$run" --elapsed 12.5 --eval "$run/eval.json")" = "12,55,0.9000,2600,1200" ] ||
  fail "gossip-row: $(tail -n1 "$run/timeline.csv")"
[ "$(tail -n1 "$run/gossip-timeline.csv")" = "12.5,55.0,50,60,0.9000,0.8500,0.9300,0.9500,867,400,3,0,0" ] ||
  fail "gossip-timeline.csv: $(tail -n1 "$run/gossip-timeline.csv")"

echo "a gossip run" >"$run/run.label"
: >"$run/settings.md"
"$report" summarize "$run" --mode gossip --checkpoint-every 10 --stop-kind time --stopped "time" --network netns \
  --target-accuracy 0.9 >"$run/report.txt" || fail "a resume from the last checkpoint (40 of 47) failed the check"
[ "$(jq -r '.peer_restarts[0].required' "$run/outcome.json")" = 40 ] || fail "the required iteration is not 40"
[ "$(jq -r '.mean_peer_at_target.elapsed_s' "$run/outcome.json")" = 12.5 ] || fail "time to the target is wrong"
grep -q '^1,w1,.*,58,10,18,0,0,0,700,14,10,1,40,,0,0,0,0$' "$run/workers.csv" || fail "workers.csv: $(sed -n 3p "$run/workers.csv")"
stats "$run/logs/worker-1.1.stats.json" 58 30 300
status=0
"$report" summarize "$run" --mode gossip --checkpoint-every 10 --stop-kind time --stopped "time" --network netns \
  >"$run/report.txt" || status=$?
[ "$status" -eq 3 ] && grep -q "CHECKPOINT NOT RESUMED: peer 1 resumed at iteration 30" "$run/report.txt" ||
  fail "a peer that resumed behind its last checkpoint passed (status $status)"
[ "$(jq -r .checkpoints_resumed "$run/outcome.json")" = false ] || fail "outcome.json does not say so"

"$report" gossip-compare "$run" --out "$run/compare" --target-accuracy 0.9 | grep -q '^| a gossip run | ' ||
  fail "gossip-compare has no row for the run"
[ -s "$run/compare/accuracy-vs-time.svg" ] || fail "gossip-compare drew no plot"
echo "emulate_gossip_report: ok"
