#!/usr/bin/env bash
# Prints the figures each boards/<board>/README.md lists: the size of the stripped worker
# binary inside the board's .deb, and the worker's peak resident memory while it trains the
# paper CNN against a host edgetrain-server on 127.0.0.1, run under qemu-aarch64.
#
# How the guest's memory is told apart from QEMU's own: qemu-aarch64 runs with a reserved
# guest address space (-R 4 GiB) at a fixed host address (-B), so every page the worker
# maps (its program, shared libraries, heap, stacks, thread stacks) lies inside that window,
# while QEMU's translator, code cache and own libraries lie outside it. A sampler reads
# /proc/PID/smaps every 0.05 s and sums Rss inside the window (the guest's RSS) and over
# everything (what `ps` shows for the qemu process). The peak of the first is the figure.
# It counts resident pages of the worker's shared libraries as the board's RSS would.
#
# usage: boards/measure-worker.sh BOARD [STEPS]   (default 20 steps; needs build/host and build/BOARD)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail_prefix="measure-worker: "
source common/processes.sh
board="${1:?usage: boards/measure-worker.sh BOARD [STEPS]}"
steps="${2:-20}"
[ -f "boards/$board/board.cmake" ] || { echo "measure-worker: unknown board '$board'" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "measure-worker: STEPS must be a positive number" >&2; exit 2; }
deps="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
server=build/host/programs/edgetrain-server
[ -x /usr/bin/python3 ] || { echo "measure-worker: needs /usr/bin/python3 (Debian package python3) for its sampler" >&2; exit 1; }
[ -x "$server" ] || { echo "measure-worker: build the host server first (cmake --build build/host --target edgetrain-server)" >&2; exit 1; }
[ -f "build/$board/CPackConfig.cmake" ] || { echo "measure-worker: configure and build build/$board first (./build.sh package $board)" >&2; exit 1; }

work=$(mktemp -d)
trap 'stop_started_programs; rm -rf "$work"' EXIT
cpack --config "build/$board/CPackConfig.cmake" -B "$work/pkg" -D CPACK_OUTPUT_FILE_PREFIX="$work/pkg" >/dev/null
deb=$(ls "$work"/pkg/edgetrain-worker-"$board"_*_arm64.deb)
dpkg-deb -x "$deb" "$work/root"
worker="$work/root/usr/bin/edgetrain-worker"
size=$(stat -c %s "$worker")
code=$(aarch64-linux-gnu-size "$worker" | awk 'NR == 2 { print $1 + $2 }')   # text + data; the file adds segment padding

add_device "$server" "$work/keys.toml" measure "$work/device.toml"
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" --model paper-cnn
port=$server_port

sed -nE "s/^key_hex = '(.*)'/\1/p" "$work/device.toml" >"$work/worker.psk"
guest_base=0x200000000000 guest_size=0x100000000
# The board's packaged configuration (threads, batch, model) and the unit's Environment=,
# with this run's server and key.
unit_env=$(sed -n 's/^Environment=//p' "$work/root/lib/systemd/system/edgetrain-worker.service" | tr '\n' ' ')
stats="$work/worker.stats.json"
start_worker "$work/worker.log" "$stats" env $unit_env qemu-aarch64 -R "$guest_size" -B "$guest_base" \
  -L "$deps/sysroot-aarch64" "$worker" --config "$work/root/etc/edgetrain/worker.toml" --identity measure \
  --key-file "$work/worker.psk" --server "coaps://127.0.0.1:$port" --data "$deps/mnist-full" --steps "$steps" --quiet
worker_pid=$last_pid
read -r guest_kib total_kib < <(/usr/bin/python3 boards/guest_rss_sampler.py "$worker_pid" "$guest_base" "$guest_size")
status=0; wait "$worker_pid" || status=$?
if [ "$status" != 0 ] || [ "$(json_get "$stats" steps)" != "$steps" ]; then
  echo "measure-worker: the worker did not finish its $steps steps (exit $status):" >&2; tail -n 20 "$work/worker.log" >&2; exit 1
fi
threads=$(sed -nE 's/^threads = ([0-9]+)/\1/p' "$work/root/etc/edgetrain/worker.toml")
awk -v b="$board" -v s="$size" -v c="$code" -v t="$threads" -v n="$steps" -v g="$guest_kib" -v q="$total_kib" 'BEGIN {
  printf "board %s: stripped edgetrain-worker %d bytes (%.2f MB), code %d bytes; paper-cnn, %s threads, %d steps under qemu-aarch64\n", b, s, s / 1e6, c, t, n
  printf "  peak RSS: worker (guest pages) %.1f MiB = %.1f MB; whole qemu process %.1f MiB\n", g / 1024, g * 1.024 / 1000, q / 1024 }'
echo "  unit environment: ${unit_env:-none}"
echo "  worker: $(json_get "$stats" steps) steps, $(json_get "$stats" updates_accepted) updates accepted," \
  "$(json_get "$stats" pulls) pulls ($(json_get "$stats" delta_pulls) as deltas), $(json_get "$stats" bytes_received) bytes pulled"
