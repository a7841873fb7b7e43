#!/usr/bin/env bash
# Efficiency on aarch64 without a board (issue 40): counts, under qemu-aarch64 with QEMU's TCG
# plugins, the guest instructions of one training step of the paper CNN (runtime::Trainer,
# XNNPACK backend, from raw pixels: what the worker calls), and the L1d/L1i/L2 misses of a
# simulated cache sized like a board's core.
#
# How: kernel_bench from an aarch64 tree (tests/bench/kernel_bench.cc, `--path trainer
# --threads 1`) runs twice per configuration, with LO and HI steps (no warm-up steps);
# per-step figure = (count(HI) - count(LO)) / (HI - LO), so start-up, model set-up, operator
# creation and exit cancel out. Repeated runs agree to within a few dozen instructions per
# step; a third run of 2*HI-LO steps checks that the two per-step estimates agree.
#
# Per layer: boards/qemu-plugins/phase_insns.c (edgetrain's own plugin) splits the count at
# each entry of a layer function (conv/pool/fc forward and backward, softmax, SGD) and
# prints the mean per step over steps 2..HI; its sum is checked against the differenced total.
#
# The other plugins are QEMU 7.2's own examples, tests/plugin/insn.c (inline counter) and
# contrib/plugins/cache.c (set-associative L1d, L1i and a unified L2, LRU), built here with
# gcc against glib and the plugin API header include/qemu/qemu-plugin.h of Debian bookworm's
# qemu source package (fetched with `apt-get source`, deb-src derived from the machine's own
# apt sources by toolchains/apt-private.sh, which toolchains/setup-deps.sh uses for libcoap). Cached in
# $EDGETRAIN_DEPS/qemu-plugins (default /var/cache/edgetrain/qemu-plugins).
#
# --torch: also PyTorch 1.13's step on the same model, batch and data, one thread
# (boards/torch_step.py run by Debian's python3-torch:arm64 from a private arm64 root that
# `toolchains/setup-deps.sh --only torch-arm64` unpacks under $EDGETRAIN_DEPS/torch-arm64),
# counted by phase_insns.c between close() marks the script makes (no fixed addresses in
# Python), and a table of both side by side. PyTorch's cache misses are not simulated:
# cache.c has no marks, and differencing two runs that each import torch (billions of
# instructions) under a callback per memory access would take hours on this machine.
#
# Not in ctest: it runs QEMU with a callback per memory access (a minute or more).
set -euo pipefail

usage() {
  cat <<USAGE
usage: boards/count-instructions.sh [--build DIR] [--batches "10 32"] [--steps LO,HI]
                                    [--cpu QEMU_CPU] [--no-cache] [--torch] [--torch-steps N]
                                    [--torch-blas openblas|reference] [--data DIR] [--help]

Counts instructions (and simulated cache misses) per paper-CNN training step of the aarch64
kernel_bench under qemu-aarch64 with QEMU's TCG plugins; prints one table.

  --build DIR     aarch64 build tree holding tests/kernel_bench (default build/aarch64;
                  build it with: cmake --build build/aarch64 --target kernel_bench)
  --batches LIST  batch sizes (default "10 32")
  --steps LO,HI   step counts of the two runs that are differenced (default 2,12)
  --cpu NAME      qemu-aarch64 -cpu (default cortex-a72: ARMv8.0-A + CRC, the instruction
                  set of the Pi 3, Zero 2 W and Pi 4; cortex-a76 adds the v8.2 extensions)
  --no-cache      instruction counts only, skip the cache simulation
  --torch         also count PyTorch 1.13 for arm64 (Debian's python3-torch, OpenBLAS) on the
                  same step with boards/torch_step.py and print both side by side; the first
                  time it unpacks a private arm64 root (toolchains/setup-deps.sh --only
                  torch-arm64, about 230 MB of packages)
  --torch-steps N PyTorch steps averaged, after 3 warm-up steps and 1 skipped (default 10)
  --torch-blas B  the libblas.so.3 PyTorch's fully-connected layers call: openblas (default;
                  what update-alternatives picks when it is installed) or reference (Debian's
                  libblas3, what apt installs with python3-torch when nothing else provides it)
  --data DIR      MNIST IDX files PyTorch trains on (default \$EDGETRAIN_DEPS/mnist-full)
  --help          this text

Cache configurations simulated (contrib/plugins/cache.c, LRU, 64-byte lines, no prefetch):
  a72: L1d 32 KiB 2-way, L1i 48 KiB 3-way, L2 1 MiB 16-way   (Pi 4, one core's view)
  a53: L1d 32 KiB 4-way, L1i 32 KiB 2-way, L2 512 KiB 16-way (Pi 3 / Zero 2 W)
Needs root for apt-get when qemu-user, libglib2.0-dev, dpkg-dev or gcc are missing.
USAGE
}

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build/aarch64
batches="10 32"
steps_arg="2,12"
cpu=cortex-a72
do_cache=1
do_torch=0
torch_steps=10
torch_blas=openblas
data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="${2:?--build needs a directory}"; shift 2 ;;
    --batches) batches="${2:?--batches needs a list}"; shift 2 ;;
    --steps) steps_arg="${2:?--steps needs LO,HI}"; shift 2 ;;
    --cpu) cpu="${2:?--cpu needs a name}"; shift 2 ;;
    --no-cache) do_cache=0; shift ;;
    --torch) do_torch=1; shift ;;
    --torch-steps) torch_steps="${2:?--torch-steps needs a number}"; shift 2 ;;
    --data) data="${2:?--data needs a directory}"; shift 2 ;;
    --torch-blas) torch_blas="${2:?--torch-blas needs openblas or reference}"; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "count-instructions: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
lo=${steps_arg%,*}; hi=${steps_arg#*,}
[[ "$lo" =~ ^[0-9]+$ && "$hi" =~ ^[0-9]+$ && $lo -ge 1 && $hi -gt $lo ]] \
  || { echo "count-instructions: --steps wants LO,HI with 1 <= LO < HI" >&2; exit 2; }

deps="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
sysroot="$deps/sysroot-aarch64"
plugdir="$deps/qemu-plugins"
bench="$build/tests/kernel_bench"
data="${data:-$deps/mnist-full}"
[[ "$torch_steps" =~ ^[0-9]+$ && $torch_steps -ge 1 ]] || { echo "count-instructions: --torch-steps wants N >= 1" >&2; exit 2; }
[[ "$torch_blas" == openblas || "$torch_blas" == reference ]] \
  || { echo "count-instructions: --torch-blas wants openblas or reference" >&2; exit 2; }
say() { echo "count-instructions: $*" >&2; }
# private_apt_opts and derive_deb_src_sources (deb-src entries from the machine's own sources).
# shellcheck source=toolchains/apt-private.sh
. toolchains/apt-private.sh
fail() { say "$*"; exit 1; }

[ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] || fail "no aarch64 sysroot at $sysroot: run toolchains/setup-deps.sh"
[ -x "$bench" ] || fail "no $bench: cmake --build $build --target kernel_bench"
[ $do_torch -eq 0 ] || [ -f "$data/train-images-idx3-ubyte" ] \
  || fail "no MNIST IDX files in $data: run toolchains/setup-deps.sh (or give --data)"

# --- packages ------------------------------------------------------------------------------
missing=()
for p in qemu-user libglib2.0-dev dpkg-dev gcc pkg-config; do
  dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} with apt-get"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || fail "apt-get install ${missing[*]} failed"
fi
qemu_version=$(dpkg-query -W -f='${Version}' qemu-user)

# --- QEMU source and plugins ---------------------------------------------------------------
stamp="$plugdir/stamp"
own_plugin=boards/qemu-plugins/phase_insns.c
stamp_key="qemu-user $qemu_version v1"
if [ "$(cat "$stamp" 2>/dev/null)" != "$stamp_key" ] \
   || [ ! -f "$plugdir/libinsn.so" ] || [ ! -f "$plugdir/libcache.so" ]; then
  mkdir -p "$plugdir"
  aptdir="$plugdir/apt"
  rm -rf "$aptdir" "$plugdir/src" "$plugdir/dl"; mkdir -p "$plugdir/dl"
  say "deriving deb-src entries from this machine's apt sources"
  derive_deb_src_sources "$aptdir"
  mapfile -t opts < <(private_apt_opts "$aptdir" src)
  say "apt-get update (deb-src, private state in $aptdir)"
  apt-get "${opts[@]}" update -q >&2 || fail "apt-get update for deb-src failed"
  # The source of the installed qemu-user's version: the plugin ABI must match.
  # (A binNMU suffix +bN is not part of the source version.)
  src_version=${qemu_version%+b[0-9]*}
  say "apt-get source qemu=$src_version"
  (cd "$plugdir/dl" && apt-get "${opts[@]}" source --download-only "qemu=$src_version" >&2) \
    || (cd "$plugdir/dl" && apt-get "${opts[@]}" source --download-only qemu >&2) \
    || fail "apt-get source qemu failed"
  dsc=$(ls "$plugdir"/dl/qemu_*.dsc | head -n1)
  say "unpacking $(basename "$dsc") (Debian patches applied)"
  nice -n 10 dpkg-source -x "$dsc" "$plugdir/src" >/dev/null || fail "dpkg-source -x failed"
  rm -rf "$plugdir/dl"
  [ -f "$plugdir/src/include/qemu/qemu-plugin.h" ] || fail "no include/qemu/qemu-plugin.h in the qemu source"
  for c in tests/plugin/insn.c contrib/plugins/cache.c; do
    name=$(basename "$c" .c)
    say "building lib$name.so from $c"
    # shellcheck disable=SC2046
    nice -n 10 gcc -O2 -fPIC -shared -Wall $(pkg-config --cflags glib-2.0) -I"$plugdir/src/include/qemu" \
      -o "$plugdir/lib$name.so" "$plugdir/src/$c" $(pkg-config --libs glib-2.0) || fail "building $c failed"
  done
  echo "$stamp_key" > "$stamp"
fi
# edgetrain's own plugin (per-layer phases), rebuilt whenever its source changes.
own_key=$(sha256sum "$own_plugin" | cut -c1-16)
if [ "$(cat "$plugdir/phase_insns.stamp" 2>/dev/null)" != "$own_key" ] || [ ! -f "$plugdir/libphase_insns.so" ]; then
  say "building libphase_insns.so from $own_plugin"
  # shellcheck disable=SC2046
  nice -n 10 gcc -O2 -fPIC -shared -Wall $(pkg-config --cflags glib-2.0) -I"$plugdir/src/include/qemu" \
    -o "$plugdir/libphase_insns.so" "$own_plugin" $(pkg-config --libs glib-2.0) || fail "building $own_plugin failed"
  echo "$own_key" > "$plugdir/phase_insns.stamp"
fi

# --- measurements --------------------------------------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_counted LOG PLUGIN-SPEC BATCH STEPS: runs kernel_bench under the plugin, output in LOG.
run_counted() {
  nice -n 10 qemu-aarch64 -cpu "$cpu" -L "$sysroot" -plugin "$2" -d plugin -D "$1" \
    "$bench" --path trainer --batch "$3" --threads 1 --steps "$4" --warmup 0 >/dev/null \
    || fail "kernel_bench under qemu-aarch64 failed (plugin $2)"
}
per_step() { awk -v a="$1" -v b="$2" -v n=$((hi - lo)) 'BEGIN { printf "%.0f", (b - a) / n }'; }

declare -A cache_args=(
  [a72]="dcachesize=32768,dassoc=2,dblksize=64,icachesize=49152,iassoc=3,iblksize=64,l2cachesize=1048576,l2assoc=16,l2blksize=64"
  [a53]="dcachesize=32768,dassoc=4,dblksize=64,icachesize=32768,iassoc=2,iblksize=64,l2cachesize=524288,l2assoc=16,l2blksize=64"
)

declare -A ips_of=()
say "kernel_bench: $bench ($(stat -c %y "$bench" | cut -d. -f1)), qemu-aarch64 -cpu $cpu, steps $lo and $hi"
printf '%-6s %-10s %14s %14s %12s %12s %12s %12s\n' batch what insns/step mem_acc/step L1d_miss L1i_miss L2_acc L2_miss
for batch in $batches; do
  for n in "$lo" "$hi" $((2 * hi - lo)); do
    say "batch $batch: instruction count, $n steps"
    run_counted "$work/insn-$batch-$n.txt" "$plugdir/libinsn.so,inline=on" "$batch" "$n"
  done
  i_lo=$(sed -n 's/^insns: //p' "$work/insn-$batch-$lo.txt")
  i_hi=$(sed -n 's/^insns: //p' "$work/insn-$batch-$hi.txt")
  i_hh=$(sed -n 's/^insns: //p' "$work/insn-$batch-$((2 * hi - lo)).txt")
  ips=$(per_step "$i_lo" "$i_hi"); ips2=$(per_step "$i_hi" "$i_hh")
  awk -v a="$ips" -v b="$ips2" 'BEGIN { d = (a > b ? a - b : b - a) / a; exit !(d < 0.001) }' \
    || say "warning: per-step counts of steps $lo..$hi ($ips) and $hi..$((2 * hi - lo)) ($ips2) differ by more than 0.1 %"
  ips_of[$batch]=$ips
  printf '%-6s %-10s %14s %14s %12s %12s %12s %12s\n' "$batch" instr "$ips" - - - - -
  [ $do_cache -eq 1 ] || continue
  for cfg in a72 a53; do
    for n in "$lo" "$hi"; do
      say "batch $batch: $cfg cache simulation, $n steps"
      run_counted "$work/cache-$cfg-$batch-$n.txt" "$plugdir/libcache.so,${cache_args[$cfg]},limit=1" "$batch" "$n"
    done
    # Second line of the report: core, data accesses, data misses, rate, insn accesses,
    # insn misses, rate, l2 accesses, l2 misses, rate.
    read -r -a a < <(sed -n 2p "$work/cache-$cfg-$batch-$lo.txt")
    read -r -a b < <(sed -n 2p "$work/cache-$cfg-$batch-$hi.txt")
    printf '%-6s %-10s %14s %14s %12s %12s %12s %12s\n' "$batch" "cache-$cfg" "$(per_step "${a[4]}" "${b[4]}")" \
      "$(per_step "${a[1]}" "${b[1]}")" "$(per_step "${a[2]}" "${b[2]}")" "$(per_step "${a[5]}" "${b[5]}")" \
      "$(per_step "${a[7]}" "${b[7]}")" "$(per_step "${a[8]}" "${b[8]}")"
  done
done
# --- per layer ------------------------------------------------------------------------------
# phase_insns.so starts a phase at each entry of a layer function of kernel_bench (found with
# nm; qemu-aarch64 7.2 loads a PIE main program at guest address 0x5500000000), so each layer's
# phase holds its edgetrain code and the XNNPACK/libc code it calls, plus the Trainer's glue up
# to the next layer call. Phase 0 ("input") is compute_gradient up to conv1: pixels to floats.
# "sgd" is kernels::sgd_update plus kernel_bench's loop and clock reads until the next step.
load_base=0x5500000000
symbols=$(aarch64-linux-gnu-nm -C "$bench" 2>/dev/null || nm -C "$bench")
entry_of() {
  local off; off=$(grep -F " T $1" <<<"$symbols" | head -n1 | cut -d' ' -f1)
  [ -n "$off" ] || fail "no symbol $1 in $bench"
  printf '%x' $((load_base + 0x$off))
}
phase_args="step=$(entry_of 'edgetrain::runtime::Trainer::compute_gradient(')"
# The Trainer calls Conv2dXnn::backward_overwriting_dout (it masks the trainer's own gradient
# buffer in place); Conv2dXnn::backward is the other entry to the same code. Neither calls the
# other, so both can start a conv_bwd phase.
for f in "Conv2dXnn::forward(|conv_fwd" "Conv2dXnn::backward(|conv_bwd" \
         "Conv2dXnn::backward_overwriting_dout(|conv_bwd" "MaxPool2x2Xnn::forward(|pool_fwd" \
         "MaxPool2x2Xnn::backward(|pool_bwd" "FullyConnectedTrainXnn::forward(|fc_fwd" \
         "FullyConnectedTrainXnn::backward(|fc_bwd" "softmax_cross_entropy_forward(|softmax_fwd" \
         "softmax_cross_entropy_backward(|softmax_bwd" "sgd_update(|sgd"; do
  phase_args+=",entry=$(entry_of "edgetrain::kernels::${f%%|*}"):${f##*|}"
done
for batch in $batches; do
  say "batch $batch: per-layer phases, $hi steps"
  run_counted "$work/phase-$batch.txt" "$plugdir/libphase_insns.so,$phase_args" "$batch" "$hi"
  got=$(sed -n 's/^steps //p' "$work/phase-$batch.txt")
  [ "$got" = "$hi" ] || fail "phase plugin saw $got steps, not $hi: is the load base still $load_base?"
  sum=$(sed -n 's/^total_per_step //p' "$work/phase-$batch.txt")
  awk -v a="$sum" -v b="${ips_of[$batch]}" 'BEGIN { d = (a > b ? a - b : b - a) / b; exit !(d < 0.001) }' \
    || say "warning: batch $batch: phases sum to $sum per step, the differenced count is ${ips_of[$batch]}"
done
echo
echo "per layer (mean instructions per step over steps 2..$hi; the forward layer order is"
echo "conv1 pool1 conv2 pool2 fc1 fc2, backward the reverse):"
phase_files=()
for b in $batches; do phase_files+=("$work/phase-$b.txt"); done
awk -v batches="$batches" '
  FNR == 1 { f++ }
  $1 == "phase" { pos = $2; lab[pos] = $3; v[f, pos] = $4; if (pos > maxp) maxp = pos }
  $1 == "total_per_step" { tot[f] = $2 }
  END {
    nb = split(batches, B, " ")
    # Name the phases after the layers: k-th forward call of a kind is layer k of that kind,
    # k-th backward call is the k-th from the end.
    for (p = 0; p <= maxp; p++) { split(lab[p], s, "_"); if (s[2] == "bwd") nbwd[s[1]]++ }
    for (p = 0; p <= maxp; p++) {
      split(lab[p], s, "_"); kind = s[1]
      if (lab[p] == "step") name[p] = "input (compute_gradient to conv1)"
      else if (lab[p] == "sgd") name[p] = "sgd_update + bench loop"
      else if (kind == "softmax") name[p] = lab[p]
      else if (s[2] == "fwd") name[p] = kind (++cf[kind]) " forward"
      else name[p] = kind (nbwd[kind] - cb[kind]++) " backward"
    }
    printf "%-36s", "phase"; for (i = 1; i <= nb; i++) printf " %14s %6s", "batch " B[i], "%"; printf "\n"
    for (p = 0; p <= maxp; p++) {
      printf "%-36s", name[p]
      for (i = 1; i <= nb; i++) printf " %14d %6.1f", v[i, p], 100 * v[i, p] / tot[i]
      printf "\n"
    }
    printf "%-36s", "sum"; for (i = 1; i <= nb; i++) printf " %14d %6s", tot[i], ""; printf "\n"
  }' "${phase_files[@]}"

# --- PyTorch ----------------------------------------------------------------------------------
if [ $do_torch -eq 1 ]; then
  say "PyTorch arm64 root (toolchains/setup-deps.sh --only torch-arm64; quick once unpacked)"
  EDGETRAIN_DEPS="$deps" toolchains/setup-deps.sh --only torch-arm64 >&2 \
    || fail "could not set up the PyTorch arm64 root"
  troot="$deps/torch-arm64/root"
  torch_deb_version=$(dpkg-deb -f "$(ls "$deps"/torch-arm64/apt/archives/python3-torch_*_arm64.deb | head -n1)" Version)
  # The marks' values come from torch_step.py itself, so the two cannot drift apart; close is
  # system call 57 on aarch64 (the generic Linux table).
  mark=$(sed -n 's/^MARK = \(0x[0-9A-Fa-f]*\).*/\1/p' boards/torch_step.py)
  [ -n "$mark" ] || fail "no MARK in boards/torch_step.py"
  marks="syscall=57,stepmark=$mark,mark=$((mark + 1)):forward,mark=$((mark + 2)):backward,mark=$((mark + 3)):sgd"
  # One thread everywhere (torch_step.py calls torch.set_num_threads(1); OpenBLAS and OpenMP
  # read these at load time); a fixed hash seed keeps Python's run repeatable.
  guest_env=(-E OPENBLAS_NUM_THREADS=1 -E OMP_NUM_THREADS=1 -E PYTHONHASHSEED=0)
  # The root's libblas.so.3 and liblapack.so.3 lead to OpenBLAS; the reference ones are found
  # first through the guest's library path.
  [ "$torch_blas" = openblas ] \
    || guest_env+=(-E LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu/blas:/usr/lib/aarch64-linux-gnu/lapack)
  declare -A torch_of=()
  for batch in $batches; do
    say "batch $batch: PyTorch $torch_deb_version ($torch_blas BLAS), $torch_steps steps (and the import of torch: a minute or two)"
    nice -n 10 qemu-aarch64 -cpu "$cpu" -L "$troot" "${guest_env[@]}" \
      -plugin "$plugdir/libphase_insns.so,$marks" -d plugin -D "$work/torch-$batch.txt" \
      "$troot/usr/bin/python3" boards/torch_step.py --batch "$batch" --steps "$torch_steps" \
      --data "$data" >&2 || fail "boards/torch_step.py under qemu-aarch64 failed"
    got=$(sed -n 's/^steps //p' "$work/torch-$batch.txt")
    [ "$got" = $((torch_steps + 2)) ] || fail "phase plugin saw $got PyTorch step marks, not $((torch_steps + 2))"
    torch_of[$batch]=$(sed -n 's/^total_per_step //p' "$work/torch-$batch.txt")
  done
  echo
  blas_name=OpenBLAS; [ "$torch_blas" = openblas ] || blas_name="reference BLAS"
  echo "edgetrain against PyTorch $torch_deb_version (Debian python3-torch:arm64, $blas_name), aarch64"
  echo "instructions per training step of the paper CNN, one thread, qemu-aarch64 -cpu $cpu"
  echo "(edgetrain: the differenced count above; PyTorch: mean of $torch_steps steps between marks):"
  printf '%-6s %16s %16s %10s %26s\n' batch edgetrain PyTorch ratio "PyTorch steps min..max"
  for batch in $batches; do
    f="$work/torch-$batch.txt"
    printf '%-6s %16s %16s %9sx %26s\n' "$batch" "${ips_of[$batch]}" "${torch_of[$batch]}" \
      "$(awk -v t="${torch_of[$batch]}" -v e="${ips_of[$batch]}" 'BEGIN { printf "%.2f", t / e }')" \
      "$(sed -n 's/^step_min //p' "$f")..$(sed -n 's/^step_max //p' "$f")"
  done
  echo
  echo "by part of the step (edgetrain: its layer phases summed; PyTorch: between its marks):"
  # input = edgetrain's compute_gradient up to conv1 (pixels to standardized floats), PyTorch's
  # zero_grad and the same standardization; forward includes the loss; sgd is the update and,
  # for edgetrain, kernel_bench's loop, for PyTorch loss.item().
  for batch in $batches; do
    awk -v batch="$batch" '
      FNR == 1 { f++ }
      $1 == "phase" {
        part = $3
        if (part == "step") part = "input"
        else if (part ~ /_fwd$/) part = "forward"
        else if (part ~ /_bwd$/) part = "backward"
        v[f, part] += $4
      }
      END {
        printf "batch %-4s %-10s %14s %14s %8s\n", batch, "part", "edgetrain", "PyTorch", "ratio"
        n = split("input forward backward sgd", P, " ")
        for (i = 1; i <= n; i++)
          printf "%-10s %-10s %14d %14d %7.2fx\n", "", P[i], v[1, P[i]], v[2, P[i]], v[1, P[i]] ? v[2, P[i]] / v[1, P[i]] : 0
      }' "$work/phase-$batch.txt" "$work/torch-$batch.txt"
  done
fi
say "done (figures are per training step, start-up differenced out)"
