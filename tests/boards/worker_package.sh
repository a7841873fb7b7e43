#!/usr/bin/env bash
# The board's worker package: cpack in the board tree, then its control fields, its
# Depends against what the program links, its files, the board's settings in the unit and
# configuration, the stripped size goal, lintian, systemd-analyze verify, and the unit's
# restart backoff helper.
# usage: worker_package.sh BOARD_TREE BOARD_DIR   (BOARD_DIR: boards/<board> in the sources)
source "$(dirname "$0")/package_lib.sh"
tree="$1" board_dir="$2"
board=$(basename "$board_dir")
threads=$(sed -nE 's/^set\(EDGETRAIN_BOARD_THREADS ([0-9]+)\)/\1/p' "$board_dir/board.cmake")
memory_max=$(sed -nE 's/^set\(EDGETRAIN_BOARD_MEMORY_MAX ([0-9]+[KMG])\)/\1/p' "$board_dir/board.cmake")
[ -n "$threads" ] && [ -n "$memory_max" ] || fail "cannot read threads and memory budget from $board_dir/board.cmake"
make_package "$tree"

[ "$(field "$deb" Package)" = "edgetrain-worker-$board" ] || fail "package name $(field "$deb" Package)"
[ "$(field "$deb" Architecture)" = arm64 ] || fail "architecture $(field "$deb" Architecture)"
for f in Provides Conflicts Replaces; do [ "$(field "$deb" $f)" = edgetrain-worker ] || fail "$f is not edgetrain-worker"; done
depends=$(field "$deb" Depends)
echo "Depends: $depends"
root="$work/root"; dpkg-deb -x "$deb" "$root"
worker="$root/usr/bin/edgetrain-worker"
[ "$(od -An -tu2 -j18 -N2 "$worker" | tr -d ' ')" = 183 ] || fail "the packaged worker is not an aarch64 program"
# Every shared library the program needs is covered by one Depends entry, libcoap is not
# among them (linked statically), and the versions come from the Debian packages.
needed=$(readelf -d "$worker" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
for lib in $needed; do
  case "$lib" in
    libXNNPACK.so.0) pkg=libxnnpack0 ;; libpthreadpool.so.0) pkg=libpthreadpool0 ;;
    libmbedtls.so.14) pkg=libmbedtls14 ;; libmbedx509.so.1) pkg=libmbedx509-1 ;; libmbedcrypto.so.7) pkg=libmbedcrypto7 ;;
    libtomlplusplus.so.3) pkg=libtomlplusplus3 ;; libz.so.1) pkg=zlib1g ;; libstdc++.so.6) pkg=libstdc++6 ;;
    libgcc_s.so.1) pkg=libgcc-s1 ;; libc.so.6|libm.so.6|ld-linux-aarch64.so.1) pkg=libc6 ;;
    *) fail "unexpected shared library $lib: extend this test's table" ;;
  esac
  [[ ", $depends," == *", $pkg "* || ", $depends," == *", $pkg,"* ]] || fail "$lib is needed but $pkg is not in Depends"
done
for lib in libXNNPACK.so.0 libmbedtls.so.14; do grep -qx "$lib" <<<"$needed" || fail "the worker does not link $lib dynamically"; done
! grep -qi coap <<<"$needed$depends" || fail "libcoap must be linked statically, not depended on"
[[ "$depends" == *"libxnnpack0 (>= "* ]] || fail "libxnnpack0 has no version from its shlibs file"

# Files, owners, modes.
for f in usr/bin/edgetrain-worker lib/systemd/system/edgetrain-worker.service etc/edgetrain/worker.toml \
         usr/lib/sysusers.d/edgetrain-worker.conf usr/libexec/edgetrain-worker/restart-backoff \
         usr/share/man/man1/edgetrain-worker.1.gz usr/share/doc/edgetrain-worker-$board/copyright \
         usr/share/doc/edgetrain-worker-$board/changelog.gz usr/share/edgetrain/paper-cnn-dropout-table.json; do
  [ -f "$root/$f" ] || fail "the package has no /$f"
done
! dpkg-deb -c "$deb" | awk '{print $2}' | grep -v '^root/root$' || fail "files not owned by root"
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)" = /etc/edgetrain/worker.toml ] || fail "conffiles"
file "$worker" | grep -q ', stripped' || fail "the packaged worker is not stripped"
size=$(stat -c %s "$worker")
[ "$size" -le 1500000 ] || fail "stripped worker is $size bytes, above the 1.5 MB goal"
echo "stripped worker: $size bytes"

# The board's settings.
unit="$root/lib/systemd/system/edgetrain-worker.service"
grep -qx "MemoryMax=$memory_max" "$unit" || fail "the unit's MemoryMax is not the board's $memory_max"
grep -qx "threads = $threads" "$root/etc/edgetrain/worker.toml" || fail "worker.toml threads is not the board's $threads"
for setting in User=edgetrain ProtectSystem=strict Restart=on-failure NoNewPrivileges=yes \
               LoadCredential=worker.psk:/etc/edgetrain/worker.psk ConditionPathExists=/etc/edgetrain/worker.psk; do
  grep -qx "$setting" "$unit" || fail "the unit lacks $setting"
done
grep -q '^ExecStart=/usr/bin/edgetrain-worker --config /etc/edgetrain/worker.toml --key-file %d/worker.psk$' "$unit" ||
  fail "ExecStart does not read /etc/edgetrain/worker.toml and the credential"
exposure=$(systemd-analyze security --offline=yes --root="$root" edgetrain-worker.service 2>/dev/null |
           sed -nE 's/.*Overall exposure level for edgetrain-worker.service: ([0-9.]+).*/\1/p')
echo "systemd-analyze security: exposure $exposure"
awk -v e="$exposure" 'BEGIN { exit !(e != "" && e + 0 <= 2.0) }' || fail "exposure level '$exposure' above 2.0"

# Maintainer scripts parse; the postinst makes the user and enables the unit.
for s in postinst prerm postrm; do
  dpkg-deb --ctrl-tarfile "$deb" | tar -xO "./$s" > "$work/$s"; sh -n "$work/$s" || fail "$s does not parse"
done
grep -q 'systemd-sysusers edgetrain-worker.conf' "$work/postinst" || fail "postinst does not create the user"
grep -q 'deb-systemd-helper enable "$unit"' "$work/postinst" || fail "postinst does not enable the unit"

lintian_clean "$deb"
units_verify "$root" "$unit"

# restart-backoff: 0 s at first, then 5, 10, 20 ... s after consecutive failures, at most
# 300 s; a clean stop resets it.
backoff="$root/usr/libexec/edgetrain-worker/restart-backoff" state="$work/restarts"
wait_of() { EDGETRAIN_BACKOFF_DRY_RUN=1 sh "$backoff" wait "$state" | sed -n 's/^wait //p'; }
[ "$(wait_of)" = 0 ] || fail "backoff: first start waits"
waits=""
for _ in 1 2 3 4 5 6 7 8; do
  SERVICE_RESULT=exit-code sh "$backoff" record "$state" >/dev/null
  waits="$waits $(wait_of)"
done
[ "$waits" = " 5 10 20 40 80 160 300 300" ] || fail "backoff waits:$waits"
SERVICE_RESULT=success sh "$backoff" record "$state"
[ "$(wait_of)" = 0 ] || fail "backoff: a clean stop does not reset it"
echo "9" > "$state"; echo $(( $(date +%s) - 700 )) > "$state.started"
SERVICE_RESULT=signal sh "$backoff" record "$state" >/dev/null
[ "$(cat "$state")" = 1 ] || fail "backoff: a crash after a long run does not start over"
if sh "$backoff" bogus "$state" 2>/dev/null; then fail "backoff accepts an unknown action"; fi
echo "restart-backoff waits:$waits"
echo "worker package for $board: all checks passed"
