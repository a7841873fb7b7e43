#!/usr/bin/env bash
# The built-in edge models' whole training step (forward, backward, SGD) at batch 10 and 32
# on 1 thread: runtime::Trainer (XNNPACK backend, kernel_bench --path trainer --model M)
# beside its PyTorch CPU twin (torch_step.py --model M, the same layers and parameter
# count), in one run, with each process's peak RSS. Benchmark only, never a test.
#   usage: tests/bench/run_model_bench.sh [host build dir, default build/host] [MODEL...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-$root/build/host}"
shift || true
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(resnet-8 resnet-8-32x32x3 ds-cnn cnn1d mobilenet-mini)
bench="$build/tests/kernel_bench"
python=/usr/bin/python3  # Debian's python3-torch installs for this interpreter only
steps="${STEPS:-20}"
[[ -x "$bench" ]] || { echo "no $bench: build kernel_bench in the host preset first" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null ||
  { echo "no PyTorch for $python: apt-get install python3-torch (benchmark only)" >&2; exit 1; }

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
printf '%-18s %6s %14s %14s %9s %16s %16s\n' model batch edgetrain_ms pytorch_ms speedup edgetrain_RSS_MiB pytorch_RSS_MiB
for model in "${models[@]}"; do
  for batch in 10 32; do
    ours=$("$bench" --path trainer --model "$model" --batch "$batch" --threads 1 --steps "$steps")
    theirs=$("$python" "$here/torch_step.py" --model "$model" --batch "$batch" --threads 1 --steps "$steps")
    ours_ms=$(field ms_per_step <<<"$ours"); theirs_ms=$(field ms_per_step <<<"$theirs")
    printf '%-18s %6s %14s %14s %8.2fx %16s %16s\n' "$model" "$batch" "$ours_ms" "$theirs_ms" \
      "$(awk -v a="$ours_ms" -v b="$theirs_ms" 'BEGIN { print b / a }')" \
      "$(field peak_rss_mib <<<"$ours")" "$(field peak_rss_mib <<<"$theirs")"
  done
done
