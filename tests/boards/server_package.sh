#!/usr/bin/env bash
# The server's package from the host tree: control fields, files, lintian, systemd-analyze
# verify; then the packaged program with the packaged configuration starts on an empty
# keystore made the way the postinst makes it, add-device adds a board to it, and SIGTERM
# stops it cleanly.
# usage: server_package.sh HOST_TREE
source "$(dirname "$0")/package_lib.sh"
make_package "$1"
[ "$(field "$deb" Package)" = edgetrain-server ] || fail "package name $(field "$deb" Package)"
[ "$(field "$deb" Architecture)" = amd64 ] || fail "architecture $(field "$deb" Architecture)"
depends=$(field "$deb" Depends)
echo "Depends: $depends"
for pkg in libmbedtls14 libxnnpack0 libc6 systemd; do [[ "$depends" == *"$pkg"* ]] || fail "Depends lacks $pkg"; done
! grep -qi coap <<<"$depends" || fail "libcoap must be linked statically"
root="$work/root"; dpkg-deb -x "$deb" "$root"
for f in usr/bin/edgetrain-server lib/systemd/system/edgetrain-server.service etc/edgetrain/server.toml \
         usr/lib/sysusers.d/edgetrain-server.conf usr/libexec/edgetrain-server/restart-backoff \
         usr/share/man/man1/edgetrain-server.1.gz usr/share/doc/edgetrain-server/copyright; do
  [ -f "$root/$f" ] || fail "the package has no /$f"
done
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)" = /etc/edgetrain/server.toml ] || fail "conffiles"
file "$root/usr/bin/edgetrain-server" | grep -q ', stripped' || fail "the packaged server is not stripped"
unit="$root/lib/systemd/system/edgetrain-server.service"
for setting in User=edgetrain ProtectSystem=strict Restart=on-failure RestartPreventExitStatus=2 StateDirectory=edgetrain \
               "ExecStart=/usr/bin/edgetrain-server --config /etc/edgetrain/server.toml"; do
  grep -qxF "$setting" "$unit" || fail "the unit lacks $setting"
done
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postinst > "$work/postinst"
sh -n "$work/postinst" || fail "postinst does not parse"
grep -q 'install -o edgetrain -g edgetrain -m 0600 /dev/null /var/lib/edgetrain/keys.toml' "$work/postinst" ||
  fail "postinst does not create the keystore"
lintian_clean "$deb"
units_verify "$root" "$unit"

# The packaged program and configuration; the paths under /var/lib and /etc moved into $work.
server="$root/usr/bin/edgetrain-server"
install -m 0600 /dev/null "$work/keys.toml"
"$server" add-device pi-01 --keystore "$work/keys.toml" --server-uri coaps://192.0.2.10:5684 >"$work/pi-01.toml" 2>/dev/null ||
  fail "add-device on the empty keystore failed"
grep -q "^identity = 'pi-01'" "$work/pi-01.toml" || fail "add-device printed no configuration"
start_server "$server" "$work/server.log" --config "$root/etc/edgetrain/server.toml" --port 0 --state-dir "$work/state" \
  --keystore "$work/keys.toml" --eval-data none
grep -q 'keystore .*: 1 devices' "$work/server.log" || fail "the server did not load the keystore"
grep -q 'model paper-cnn' "$work/server.log" || fail "the packaged server.toml was not used"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "SIGTERM: exit status $?"
# "stopped" is written after the checkpoint at exit.
[ "$(json_get "$server_stats" state)" = stopped ] || fail "no checkpoint and final stats at exit"
echo "server package: all checks passed"
