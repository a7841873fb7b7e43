#!/usr/bin/env bash
# edgetrain's one entry point for people and CI.
#   ./build.sh demo [--duration S]   set everything up, build host and aarch64, run the main job
#   ./build.sh test    set everything up, build, fuzz the codec (60 s), run all tests: host, host-asan, aarch64 (QEMU), rpi4 (packages)
#   ./build.sh setup   only install/build the dependencies (toolchains/setup-deps.sh)
#   ./build.sh build [PRESET...] [-- TARGET...]   configure and build presets (default: host aarch64)
#   ./build.sh package [BOARD...]  the server .deb (amd64) and each board's worker .deb (arm64; default: all boards)
#   ./build.sh board-test [BOARD...]  boot each board's worker .deb in an emulated Debian arm64 board (default: rpi4 rpi3; slow, emulated)
#   ./build.sh clean   remove build/ (dependency caches stay; see toolchains/README.md)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

usage() { sed -n '2,9s/^# \{0,1\}//p' "$0"; }

phase_start=0
phase() { phase_start=$SECONDS; echo "==> $*"; }
phase_done() { echo "    ($((SECONDS - phase_start)) s)"; }

setup() {
  phase "dependencies (toolchains/setup-deps.sh)"
  if [ "$(id -u)" = 0 ]; then
    bash toolchains/setup-deps.sh
  elif command -v sudo >/dev/null; then
    sudo --preserve-env=EDGETRAIN_DEPS bash toolchains/setup-deps.sh
  else
    echo "build.sh: setting up dependencies needs root (apt-get); run as root or install sudo" >&2
    exit 1
  fi
  phase_done
}

# ccache makes rebuilds and fresh clones cheap. CCACHE_BASEDIR and CCACHE_NOHASHDIR let two
# clones in different directories share cached objects. Looked up when a build starts, after
# setup, which installs it on a bare machine.
launcher=()
find_ccache() {
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  fi
}

# build PRESET... [-- TARGET...]: configure and build the presets (all targets by default).
build() {
  local presets=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do presets+=("$1"); shift; done
  [ $# -gt 0 ] && shift && targets=("$@")
  [ ${#presets[@]} -gt 0 ] || presets=(host aarch64)
  find_ccache
  for preset in "${presets[@]}"; do
    phase "configure and build: $preset${targets[*]:+ (${targets[*]})}"
    cmake --preset "$preset" "${launcher[@]}" >/dev/null \
      || { echo "build.sh: cmake configure of preset '$preset' failed" >&2; exit 1; }
    cmake --build --preset "$preset" ${targets[@]:+--target "${targets[@]}"}
    phase_done
  done
}

run_tests() {
  for preset in "$@"; do
    phase "tests: $preset"
    # A test that fails is run once more: the process-level tests time real programs on a
    # shared 2-core machine, and two CI runs were lost to one slow moment each. A retried
    # test still shows its failed attempt (output included) above its passing one.
    # Tests run side by side, one per core, except those marked RUN_SERIAL (the process-level
    # and network tests: they time real programs), which ctest runs alone.
    # No line after ctest's: its summary closes the output.
    ctest --preset "$preset" --output-on-failure --repeat until-pass:2 --parallel "$(nproc)"
  done
}

# The codec's libFuzzer target (clang), before the ctest runs so that their summary stays
# the last output. EDGETRAIN_FUZZ_SECONDS sets the time (default 60).
fuzz() {
  phase "fuzz: transport codec decoders (libFuzzer, ${EDGETRAIN_FUZZ_SECONDS:-60} s)"
  bash tests/fuzz/run-fuzz.sh
  phase_done
}

demo() {
  local qemu=(qemu-aarch64 -L "${EDGETRAIN_DEPS:-/var/cache/edgetrain}/sysroot-aarch64")
  phase "stack check on both targets (edgetrain-smoke)"
  build/host/tests/edgetrain-smoke >/dev/null && "${qemu[@]}" build/aarch64/tests/edgetrain-smoke >/dev/null \
    || { echo "build.sh: the smoke check failed; run build/host/tests/edgetrain-smoke to see why" >&2; exit 1; }
  phase_done
  phase "training: server + 3 host workers + 1 aarch64 worker under QEMU (demo/run-demo.sh)"
  bash demo/run-demo.sh "$@"
}

BOARDS=(rpi3 rpi4 rpi5 rpi-zero2w)

# Debian packages (boards/README.md): edgetrain-server from the host tree, and per board the
# worker built with that board's CPU flags, each made by cpack into build/<tree>/packages/.
package() {
  local board boards=("$@")
  [ ${#boards[@]} -gt 0 ] || boards=("${BOARDS[@]}")
  for board in "${boards[@]}"; do
    [[ " ${BOARDS[*]} " == *" $board "* ]] || { echo "build.sh: unknown board '$board' (boards: ${BOARDS[*]})" >&2; exit 2; }
  done
  phase "package: edgetrain-server (amd64)"
  find_ccache
  cmake --preset host "${launcher[@]}" >/dev/null || { echo "build.sh: cmake configure of preset 'host' failed" >&2; exit 1; }
  cmake --build --preset host --target edgetrain-server
  (cd build/host && cpack --config CPackConfig.cmake | grep 'generated')
  phase_done
  for board in "${boards[@]}"; do
    build "$board"
    phase "package: edgetrain-worker-$board (arm64)"
    (cd "build/$board" && cpack --config CPackConfig.cmake | grep 'generated')
    phase_done
  done
}

# The system test in an emulated board (tests/boards/worker_in_vm.sh): the board-vm set-up
# step (QEMU, debootstrap), the packages, the Debian arm64 image (boards/vm-image.sh, cached),
# then per board the .deb installed, run under systemd and trained against the host server.
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo --preserve-env=EDGETRAIN_DEPS "$@"
  else echo "build.sh: $* needs root; run as root or install sudo" >&2; exit 1; fi
}
board_test() {
  local board boards=("$@")
  [ ${#boards[@]} -gt 0 ] || boards=(rpi4 rpi3)
  phase "dependencies of the emulated board (toolchains/setup-deps.sh --only board-vm)"
  as_root bash toolchains/setup-deps.sh --only board-vm
  phase_done
  package "${boards[@]}"
  phase "Debian bookworm arm64 board image (boards/vm-image.sh)"
  as_root bash boards/vm-image.sh
  phase_done
  for board in "${boards[@]}"; do
    phase "system test in the emulated board: $board (tests/boards/worker_in_vm.sh)"
    bash tests/boards/worker_in_vm.sh "build/$board" build/host/programs/edgetrain-server
    phase_done
  done
}

case "${1:-help}" in
  # The demo needs only its programs, not the test binaries.
  demo) shift; setup; build host -- edgetrain-server edgetrain-worker edgetrain-smoke
        build aarch64 -- edgetrain-worker edgetrain-smoke; demo "$@" ;;
  test) setup; build host host-asan aarch64 rpi4; fuzz; run_tests host host-asan aarch64 rpi4 ;;
  setup) setup ;;
  build) shift; setup; if [ $# -eq 0 ]; then build host aarch64; else build "$@"; fi ;;
  package) shift; setup; package "$@" ;;
  board-test) shift; setup; board_test "$@" ;;
  clean) rm -rf build ;;
  help|-h|--help) usage ;;
  *) echo "build.sh: unknown command '$1'" >&2; usage >&2; exit 2 ;;
esac
