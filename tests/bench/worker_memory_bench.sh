#!/usr/bin/env bash
# Peak resident memory of edgetrain-worker training the paper CNN (or --model's; batch 10) on full MNIST
# against a real edgetrain-server on loopback DTLS, as worker 0 of each shard count, printed
# beside the bound it must stay under (issue 40: 16 MB at 1 of 10 shards, on the host and
# under qemu-aarch64). A program that prints figures; the ctest bench_smoke_worker_memory
# runs it once on the host with --check (memory, unlike time, is the same run to run).
#
# What is measured:
# - host: the worker's own VmHWM (peak_rss_bytes in its --stats-file, from /proc/self/status).
# - under qemu-aarch64 (when an aarch64 worker is given): the worker's pages only. QEMU runs
#   it with a reserved guest address space (-R 4 GiB) at a fixed host address (-B), so every
#   page the worker maps (program, shared libraries, heap, stacks) lies inside that window and
#   QEMU's translator, code cache and own libraries outside; a sampler sums Rss of
#   /proc/PID/smaps inside the window every 0.02 s and keeps the peak (boards/measure-worker.sh
#   measures the boards' figure the same way). The qemu process's whole VmHWM is printed
#   beside it (the worker's peak_rss_bytes under QEMU is that one: QEMU does not emulate
#   /proc/self/status).
#
# usage: worker_memory_bench.sh [options] SERVER HOST_WORKER [AARCH64_WORKER EMULATOR...]
#   --steps N       training steps per run (default 30: past the first dense pull, every
#                   buffer and XNNPACK operator made, several delta pulls)
#   --shards "N.."  shard counts, worker 0 of each (default "10 100")
#   --bound MB      the bound printed (default 16, MB = 10^6 bytes)
#   --check MB      exit 1 when a figure (host, and the guest pages under QEMU) is above MB
#   --model NAME    the model server and worker train (default paper-cnn; with full MNIST
#                   one for 28x28x1 images: mlp, mobilenet-mini, resnet-8 or a spec)
#   --data DIR      the worker's data instead of full MNIST: a data directory of one's own
#                   (model/README.md; tests/support/make_user_data.py --shape/--sequence
#                   writes one for ds-cnn's 49x10x1 or cnn1d's 128x9)
# EMULATOR is the command that runs an aarch64 program (qemu-aarch64 -L SYSROOT, as the
# aarch64 tree's CMAKE_CROSSCOMPILING_EMULATOR); -R and -B are added here. Exit 77 when full
# MNIST ($EDGETRAIN_DEPS/mnist-full) is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fail_prefix="worker_memory_bench: "
source "$here/../../common/processes.sh"

steps=30 shard_counts="10 100" bound_mb=16 check_mb="" model=paper-cnn data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --shards) shard_counts="$2"; shift 2 ;;
    --bound) bound_mb="$2"; shift 2 ;;
    --check) check_mb="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    -h|--help) sed -n '2,35s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "usage: worker_memory_bench.sh [options] SERVER HOST_WORKER [AARCH64_WORKER EMULATOR...]" >&2; exit 2; }
server="$1" host_worker="$2"; shift 2
cross_worker="${1:-}"; [ $# -gt 0 ] && shift
emulator=("$@")
[ -z "$cross_worker" ] || [ ${#emulator[@]} -gt 0 ] || fail "an aarch64 worker needs its EMULATOR command"

mnist="${data:-${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist-full}"
if [ -z "$data" ] && ! ls "$mnist"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  echo "SKIP: no full MNIST in $mnist (toolchains/setup-deps.sh fetches it)"
  exit 77
fi

work=$(mktemp -d)
trap 'stop_started_programs; rm -rf "$work"' EXIT
add_device "$server" "$work/keys.toml" bench "$work/bench.toml"
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model "$model" --eval-data none

guest_base=0x200000000000 guest_size=0x100000000
over=0
# run LABEL SHARDS COMMAND...: one worker (COMMAND is the worker, possibly behind QEMU) as
# worker 0 of SHARDS; prints its line; a guest window is sampled when GUEST is set.
run() {
  local label="$1" shards="$2"; shift 2
  local stats="$work/worker-$label-$shards.json" log="$work/worker-$label-$shards.log" guest_kib="" total_kib=""
  start_worker "$log" "$stats" "$@" --config "$work/bench.toml" --server "coaps://127.0.0.1:$server_port" \
    --model "$model" --data "$mnist" --batch 10 --workers "$shards" --worker-id 0 --steps "$steps" --quiet
  local pid=$last_pid
  if [ -n "${GUEST:-}" ]; then
    read -r guest_kib total_kib < <(/usr/bin/python3 "$here/../../boards/guest_rss_sampler.py" "$pid" "$guest_base" "$guest_size")
  fi
  wait_for_exit "$pid" 900 || fail "the $label worker (1 of $shards) exited with status $?"
  [ "$(json_get "$stats" steps)" = "$steps" ] || fail "the $label worker did not train its $steps steps"
  local peak
  peak=$(json_get "$stats" peak_rss_bytes) || fail "no peak_rss_bytes in the $label worker's stats file"
  local figure=$peak what="VmHWM"
  if [ -n "${GUEST:-}" ]; then
    figure=$((guest_kib * 1024)) what="guest pages"
  fi
  local verdict
  verdict=$(awk -v f="$figure" -v b="$bound_mb" 'BEGIN { d = f / 1e6 - b; printf "%s %.2f MB", d <= 0 ? "under it by" : "OVER it by", d < 0 ? -d : d }')
  printf '%-26s 1 of %-3s shards: peak RSS %6.2f MB (%s)  bound %s MB: %s\n' "$label" "$shards" \
    "$(awk -v f="$figure" 'BEGIN { printf "%.2f", f / 1e6 }')" "$what" "$bound_mb" "$verdict"
  if [ -n "${GUEST:-}" ]; then
    printf '%-26s                 whole qemu process %.2f MB (VmHWM %.2f MB)\n' "" \
      "$(awk -v k="$total_kib" 'BEGIN { printf "%.2f", k * 1024 / 1e6 }')" "$(awk -v f="$peak" 'BEGIN { printf "%.2f", f / 1e6 }')"
  fi
  if [ -n "$check_mb" ] && awk -v f="$figure" -v c="$check_mb" 'BEGIN { exit !(f > c * 1e6) }'; then
    echo "  above the checked bound of $check_mb MB" >&2
    over=1
  fi
}

echo "edgetrain-worker peak RSS: $model, batch 10, ${data:+the data in }${data:-full MNIST ($mnist)}, worker 0, $steps steps, default threads"
for shards in $shard_counts; do run host "$shards" "$host_worker"; done
if [ -n "$cross_worker" ]; then
  [ -x /usr/bin/python3 ] || fail "needs /usr/bin/python3 for the guest page sampler"
  for shards in $shard_counts; do
    GUEST=1 run qemu-aarch64 "$shards" "${emulator[@]}" -R "$guest_size" -B "$guest_base" "$cross_worker"
  done
fi
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || true
exit "$over"
