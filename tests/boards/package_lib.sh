# Sourced by the package tests: common/processes.sh (fail, programs started in the
# background, their port and stats files), a private work directory (removed on exit, every
# started program killed), and make_package TREE, which runs cpack in a build tree into
# $work/pkg and sets $deb.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../common/processes.sh"
work=$(mktemp -d)
trap 'stop_started_programs; rm -rf "$work"' EXIT

make_package() {
  [ -f "$1/CPackConfig.cmake" ] || fail "$1 has no CPackConfig.cmake"
  cpack --config "$1/CPackConfig.cmake" -B "$work/pkg" -D CPACK_OUTPUT_FILE_PREFIX="$work/pkg" >"$work/cpack.log" 2>&1 ||
    { cat "$work/cpack.log" >&2; fail "cpack failed in $1"; }
  deb=$(ls "$work"/pkg/*.deb)
  [ "$(echo "$deb" | wc -l)" = 1 ] || fail "cpack made more than one package: $deb"
  echo "package: $(basename "$deb")"
}

# lintian_clean DEB: lintian (pedantic) reports no tag, except the ones listed with a
# reason in boards/packaging/lintian-justified.txt.
lintian_clean() {
  local justified tags
  justified="$(dirname "${BASH_SOURCE[0]}")/../../boards/packaging/lintian-justified.txt"
  command -v lintian >/dev/null || fail "lintian is not installed (toolchains/setup-deps.sh installs it)"
  local out status=0
  out=$(lintian --pedantic --tag-display-limit 0 "$1" 2>"$work/lintian.err") || status=$?
  tags=$(printf '%s\n' "$out" | grep -E '^[EWIPX]: ' || true)
  # bookworm's lintian exits non-zero for error tags too; without any tag it failed itself.
  [ "$status" = 0 ] || [ -n "$tags" ] || fail "lintian failed (exit $status): $(cat "$work/lintian.err")"
  if [ -f "$justified" ]; then
    tags=$(printf '%s\n' "$tags" | grep -vF -f <(sed -n 's/^\([a-z0-9-]*\):.*/\1/p' "$justified" | sed 's/.*/: &/') || true)
  fi
  [ -z "$tags" ] || fail "lintian on $(basename "$1"):
$tags"
  echo "lintian --pedantic: no unjustified tag"
}

# units_verify ROOT UNIT...: systemd-analyze verify of the packaged units in the unpacked
# package ROOT (host units copied beside them for the targets they name); any output fails.
units_verify() {
  local root="$1" out; shift
  cp -rn /lib/systemd/system/. "$root/lib/systemd/system/" 2>/dev/null || true
  out=$(cd "$root" && systemd-analyze verify --root="$root" --man=no "$@" 2>&1) || fail "systemd-analyze verify: $out"
  [ -z "$out" ] || fail "systemd-analyze verify: $out"
  echo "systemd-analyze verify: clean ($*)"
}

# field DEB NAME
field() { dpkg-deb -f "$1" "$2"; }
