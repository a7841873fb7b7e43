#!/usr/bin/env bash
# Where a run's socket ingress comes from: update payload bytes (what edgetrain-sim counts
# as an update's encoded size) plus a per-datagram transport overhead (DTLS record header,
# nonce and tag, CoAP header, token and options) on every datagram the server received:
# Block1 blocks of the pushes, Block2 requests of the pulls (they carry no payload),
# handshakes and retransmissions. Reads the stats files of an edgetrain-emulate run
# directory's servers (logs/server-N.stats.json: every incarnation's last counters; one
# killed with SIGKILL counts up to its last write, at most a second before) and prints one
# line of figures; with SIM_BYTES_PER_UPDATE (from docs/history.md's simulator table) also
# the socket bytes that simulator bytes plus 63.9 B per push datagram and 49.8 B per pull
# request (constants fitted on the paper runs of docs/history.md) predict.
# usage: experiments/ingress-accounting.sh RUN_DIR [SIM_BYTES_PER_UPDATE MODEL_BYTES PULL_EVERY]
set -euo pipefail
source "$(dirname "$0")/../common/processes.sh"
run=$1 sim=${2:-} model=${3:-} pull_every=${4:-1}
# Totals over server incarnations.
read -r payload socket datagrams < <(for stats in "$run"/logs/server-*.stats.json; do
    echo "$(json_get "$stats" ingress_payload_bytes) $(json_get "$stats" ingress_socket_bytes)" \
      "$(json_get "$stats" ingress_socket_datagrams || echo 0)"
  done | awk '{ p += $1; s += $2; d += $3 } END { printf "%.0f %.0f %.0f\n", p, s, d }')
if [ "$datagrams" = 0 ]; then
  # A server whose stats file does not count datagrams (no ingress_socket_datagrams): the
  # impairer's count of datagrams it delivered to the server stands in. It also counts what
  # reached a server killed before its last stats write, so it can only be a little higher.
  datagrams=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "to_server_datagrams_out") c = i; next }
                      c { d += $c } END { printf "%.0f\n", d }' "$run/links.csv")
  echo "ingress-accounting: datagrams as delivered by the impairer (links.csv): the servers' stats files do not count them" >&2
fi
updates=$(awk -F, 'NR > 1 { a += $9 } END { printf "%.0f\n", a }' "$run/workers.csv")
awk -v p="$payload" -v s="$socket" -v d="$datagrams" -v u="$updates" -v sim="$sim" -v m="$model" -v k="$pull_every" 'BEGIN {
  h = (s - p) / d
  printf "updates %d, payload %.0f B (%.0f B/update), socket %.0f B, %d datagrams; overhead %.1f B/datagram, socket/payload %.3f\n", u, p, p / u, s, d, h, s / p
  if (sim != "") {
    # 63.9 B per Block1 datagram and 49.8 B per Block2 request: fitted on the paper runs
    # (docs/history.md), so a prediction for another run is a check of the model.
    blocks_push = int((sim + 1023) / 1024); blocks_pull = int((m + 1023) / 1024)
    predicted_d = u * (blocks_push + blocks_pull / k)
    predicted = u * sim + u * blocks_push * 63.9 + u * blocks_pull / k * 49.8
    printf "simulator: %.0f B/update (emulator payload differs by %+.1f%%); predicted datagrams %.0f (%+.1f%% vs measured); predicted socket bytes %.0f (%+.1f%% vs measured)\n", sim, 100 * (p / u / sim - 1), predicted_d, 100 * (predicted_d / d - 1), predicted, 100 * (predicted / s - 1)
  } }'
