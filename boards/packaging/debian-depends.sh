#!/usr/bin/env bash
# Prints the Debian Depends of an aarch64 ELF program, e.g.
#   libc6 (>= 2.36), libxnnpack0 (>= 0.0~git20220216.ae108ef), ...
# from its DT_NEEDED entries and the shlibs control files of the Debian arm64 packages that
# toolchains/setup-deps.sh downloaded for the sysroot. (dpkg-shlibdeps cannot be used: it
# looks libraries up in the host's dpkg database, which has no arm64 packages.) Versions
# are the shlibs minimums, which are at least as strict as symbols-file minimums.
# usage: debian-depends.sh PROGRAM DEBS_DIR
set -euo pipefail
program="${1:?usage: debian-depends.sh PROGRAM DEBS_DIR}"
debs="${2:?usage: debian-depends.sh PROGRAM DEBS_DIR}"
[ -f "$program" ] || { echo "debian-depends: no program $program" >&2; exit 1; }
ls "$debs"/*.deb >/dev/null 2>&1 || {
  echo "debian-depends: no .deb files in $debs (toolchains/setup-deps.sh --only sysroot downloads them)" >&2; exit 1; }

# "libname soversion dependency" lines of every runtime package's shlibs file.
shlibs=$(for deb in "$debs"/*.deb; do
  dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./shlibs 2>/dev/null || true
done | grep -v '^udeb:' || true)

needed=$(readelf -d "$program" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || { echo "debian-depends: $program has no DT_NEEDED entries" >&2; exit 1; }
depends=()
for soname in $needed; do
  # libfoo.so.N -> "libfoo N"; libfoo-1.2.so -> "libfoo 1.2"
  if [[ "$soname" =~ ^(.*)\.so\.([0-9.]+)$ ]]; then name=${BASH_REMATCH[1]} version=${BASH_REMATCH[2]}
  elif [[ "$soname" =~ ^(.*)-([0-9.]+)\.so$ ]]; then name=${BASH_REMATCH[1]} version=${BASH_REMATCH[2]}
  else echo "debian-depends: cannot parse soname $soname" >&2; exit 1; fi
  dep=$(awk -v n="$name" -v v="$version" '$1 == n && $2 == v { $1 = ""; $2 = ""; sub(/^ +/, ""); print; exit }' <<<"$shlibs")
  [ -n "$dep" ] || { echo "debian-depends: no package in $debs provides $soname (add it to SYSROOT_PACKAGES)" >&2; exit 1; }
  depends+=("$dep")
done
printf '%s\n' "${depends[@]}" | sort -u | paste -sd, - | sed 's/,/, /g'
