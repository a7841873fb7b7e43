#!/usr/bin/env bash
# Paper-CNN train step: edgetrain fast (kernel composition), runtime::Trainer (XNNPACK
# backend, from raw pixels), reference vs PyTorch CPU, side by side, plus the
# XNNPACK GEMM peak of this machine and, when an aarch64 tree exists, the step under QEMU.
# Installs python3-torch with apt-get if /usr/bin/python3 cannot import torch (benchmark
# only; never a runtime or test dependency).
#   usage: tests/bench/run_kernel_bench.sh [host build dir, default build/host]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-$root/build/host}"
bench="$build/tests/kernel_bench"
python=/usr/bin/python3  # Debian's python3-torch installs for this interpreter only
steps="${STEPS:-20}"

[[ -x "$bench" ]] || { echo "no $bench: build the host preset first" >&2; exit 1; }
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "installing python3-torch (benchmark only) ..." >&2
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get install -y -qq python3-torch >&2
fi

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }

printf '%-28s %6s %8s %10s %8s %8s %10s\n' what batch threads ms/step GFLOP/s %peak peakRSS_MiB
for threads in 1 2; do
  peak=$("$bench" --gemm-peak --threads "$threads" | field gflops)
  printf '%-28s %6s %8s %10s %8s %8s %10s\n' "XNNPACK GEMM 512x1024x1024" - "$threads" - "$peak" 100 -
  for batch in 10 32; do
    runs=()
    runs+=("$("$bench" --path fast --batch "$batch" --threads "$threads" --steps "$steps")")
    runs+=("$("$bench" --path trainer --batch "$batch" --threads "$threads" --steps "$steps")")
    if [[ $threads -eq 1 ]]; then  # the reference loops are single-threaded
      runs+=("$("$bench" --path reference --batch "$batch" --threads 1 --steps 3 --warmup 1)")
    fi
    runs+=("$("$python" "$here/torch_step.py" --batch "$batch" --threads "$threads" --steps "$steps")")
    for line in "${runs[@]}"; do
      name=${line%% *}
      ms=$(field ms_per_step <<<"$line"); gf=$(field gflops <<<"$line"); rss=$(field peak_rss_mib <<<"$line")
      pct=$(awk -v g="$gf" -v p="$peak" 'BEGIN { printf "%.0f", 100 * g / p }')
      printf '%-28s %6s %8s %10s %8s %8s %10s\n' "$name" "$batch" "$threads" "$ms" "$gf" "$pct" "$rss"
    done
    fast_ms=$(field ms_per_step <<<"${runs[0]}"); trainer_ms=$(field ms_per_step <<<"${runs[1]}")
    torch_ms=$(field ms_per_step <<<"${runs[-1]}")
    awk -v f="$fast_ms" -v r="$trainer_ms" -v t="$torch_ms" -v b="$batch" -v n="$threads" \
      'BEGIN { printf "  -> batch %s, %s thread(s): edgetrain fast is %.2fx PyTorch, the Trainer %.2fx\n", b, n, t / f, t / r }'
  done
done

aarch64_bench="$root/build/aarch64/tests/kernel_bench"
sysroot="${EDGETRAIN_DEPS:-/var/cache/edgetrain}/sysroot-aarch64"
if [[ -x "$aarch64_bench" ]] && command -v qemu-aarch64 >/dev/null; then
  echo "under qemu-aarch64 (sanity only: emulation, not board speed):"
  qemu-aarch64 -L "$sysroot" "$aarch64_bench" --path fast --batch 10 --threads 1 --steps 5 --warmup 1
  qemu-aarch64 -L "$sysroot" "$aarch64_bench" --path trainer --batch 10 --threads 1 --steps 5 --warmup 1
fi
