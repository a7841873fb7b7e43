#!/usr/bin/env bash
# The worker program taken out of the board's .deb runs under qemu-aarch64 with the sysroot:
# --version, then a short training against the host tree's edgetrain-server
# (cross/qemu_worker_to_host_server.sh: every update accepted, versions 1..12 in order).
# usage: worker_deb_under_qemu.sh BOARD_TREE HOST_SERVER EMULATOR...
source "$(dirname "$0")/package_lib.sh"
tree="$1" server="$2"; shift 2
[ -x "$server" ] || fail "host server $server not built: build the host preset's edgetrain-server first"
make_package "$tree"
dpkg-deb -x "$deb" "$work/root"
worker="$work/root/usr/bin/edgetrain-worker"
version=$("$@" "$worker" --version) || fail "--version under $* failed"
[ "$version" = "edgetrain-worker $(field "$deb" Version)" ] || fail "--version printed '$version'"
echo "$version (from $(basename "$deb"), under $1)"
status=0
bash "$(dirname "$0")/../cross/qemu_worker_to_host_server.sh" "$server" "$worker" "$@" || status=$?
exit "$status"
