#!/usr/bin/env bash
# A gossip fleet on one machine, no server (edgetrain-worker --mode gossip): N peers on
# loopback, each with its own certificate from one fleet CA (boards/fleet-certificates.sh),
# in a topology from edgetrain-topology, train on MNIST for a bounded time with a live
# progress line; at the end edgetrain-fleet-eval scores every peer's checkpoint and their
# consensus model (the peers' average), written to OUT/fleet.json.
#
#   demo/run-gossip.sh [--peers N] [--topology ring|random-regular|full] [--duration S]
#                      [--out DIR] [-- PEER OPTIONS...]
#   defaults: 4 peers, ring, 60 s, gossip-results/, the mlp, dense D-PSGD. For example
#   demo/run-gossip.sh -- --model paper-cnn --publish-fraction 0.01
#   demo/run-gossip.sh -- --gossip ad-psgd
#
# Needs build/host (./build.sh build host).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail_prefix="run-gossip.sh: "
source common/processes.sh

peers=4 kind=ring duration=60 out=gossip-results
while [ $# -gt 0 ]; do
  case "$1" in
    --peers) peers="${2:?}"; shift 2 ;;
    --topology) kind="${2:?}"; shift 2 ;;
    --duration) duration="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "run-gossip.sh: unknown argument '$1' (peer options go after --)" >&2; exit 2 ;;
  esac
done
[[ "$peers" =~ ^[0-9]+$ ]] && [ "$peers" -ge 2 ] || { echo "run-gossip.sh: --peers must be at least 2" >&2; exit 2; }
[[ "$duration" =~ ^[0-9]+$ ]] && [ "$duration" -ge 5 ] || { echo "run-gossip.sh: --duration must be >= 5 s" >&2; exit 2; }
# The peers' model: --model among the peer options, else the mlp (added to them).
model=""
for ((a = 1; a <= $#; a++)); do [ "${!a}" = --model ] && { b=$((a + 1)); model="${!b}"; }; done
[ -n "$model" ] || { model=mlp; set -- --model mlp "$@"; }

bin=build/host
for f in programs/edgetrain-worker programs/edgetrain-topology programs/edgetrain-fleet-eval; do
  [ -x "$bin/$f" ] || { echo "run-gossip.sh: $bin/$f is not built (./build.sh build host)" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out"
trap stop_started_programs EXIT

names=()
for ((i = 0; i < peers; i++)); do names+=("peer-$i"); done
bash boards/fleet-certificates.sh "$out/certs" "${names[@]}"
base=$(free_udp_ports "$peers")
"$bin/programs/edgetrain-topology" --kind "$kind" --peers "$peers" --addresses '127.0.0.1:{port}' --base-port "$base" \
  --out "$out/topology.json"

for ((i = 0; i < peers; i++)); do
  start_program "$out/peer-$i.log" "$bin/programs/edgetrain-worker" --mode gossip --topology "$out/topology.json" \
    --peer-name "peer-$i" --cert "$out/certs/peer-$i.crt" --cert-key "$out/certs/peer-$i.key" --ca "$out/certs/ca.crt" \
    --data mnist --duration "$duration" --state-dir "$out/state-$i" --stats-file "$out/peer-$i.json" \
    --quiet "$@"
done
echo "$peers peers ($kind, logs in $out/peer-N.log) for $duration s"
while :; do
  alive=0
  for pid in "${started_pids[@]}"; do kill -0 "$pid" 2>/dev/null && ! is_zombie "$pid" && alive=$((alive + 1)); done
  line=$(jq -rs '"iterations " + (map(.iteration) | (min | tostring) + ".." + (max | tostring))
                 + "  exchanges " + (map(.exchanges) | add | tostring)
                 + "  sent " + ((map(.bytes_sent) | add) / 1e6 | tostring | .[0:6]) + " MB"' "$out"/peer-*.json 2>/dev/null || true)
  printf '\r%-100s' "peers running $alive/$peers  $line"
  [ "$alive" -gt 0 ] || break
  sleep 1
done
echo
"$bin/programs/edgetrain-fleet-eval" --data mnist --model "$model" --out "$out/fleet.json" "$out"/state-*/peer.safetensors
