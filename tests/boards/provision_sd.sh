#!/usr/bin/env bash
# boards/provision-sd.sh against a directory standing in for the boot partition of a freshly
# flashed Raspberry Pi OS bookworm card: every file it writes (content, mode), cmdline.txt
# (one line, the hook appended once, also when run twice), the variant of a card customised
# with Raspberry Pi Imager (hook called from its firstrun.sh instead), refusals that leave the
# card untouched; then the first-boot hook itself, run against a directory standing in for
# the board's root file system, with dpkg and systemctl replaced by recorders on PATH.
# usage: provision_sd.sh BOARD_TREE PROVISION_SCRIPT SERVER
source "$(dirname "$0")/package_lib.sh"
tree="$1" provision="$2" server="$3"
make_package "$tree"
deps="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
libraries="$deps/apt-arm64/debs"
ls "$libraries"/libxnnpack0_*.deb >/dev/null 2>&1 || { echo "SKIP: no arm64 packages in $libraries"; exit 77; }

# Training data: two small IDX files (the hook copies whatever the card carries).
mkdir -p "$work/data"
printf '\x00\x00\x08\x03\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x02abcd' > "$work/data/train-images-idx3-ubyte"
printf '\x00\x00\x08\x01\x00\x00\x00\x01\x07' > "$work/data/train-labels-idx1-ubyte"

fresh_card() { # fresh_card DIR: what a freshly flashed bookworm arm64 card's boot partition holds
  rm -rf "$1"; mkdir -p "$1/overlays"
  printf 'console=serial0,115200 console=tty1 root=PARTUUID=4e639091-02 rootfstype=ext4 fsck.repair=yes rootwait quiet init=/usr/lib/raspberrypi-sys-mods/firstboot\n' > "$1/cmdline.txt"
  printf '# For more options and information see\n# http://rptl.io/configtxt\ndtparam=audio=on\narm_64bit=1\n' > "$1/config.txt"
  : > "$1/kernel8.img"; : > "$1/kernel_2712.img"; : > "$1/bcm2711-rpi-4-b.dtb"; : > "$1/overlays/README"
}
snapshot() { (cd "$1" && find . -type f -printf '%p %m %s\n' | sort && cat cmdline.txt) | sha256sum; }

"$server" add-device pi-07 --keystore "$work/keys.toml" --server-uri coaps://192.0.2.10:5684 >"$work/pi-07.toml" 2>/dev/null
key=$(sed -nE "s/^key_hex = '(.*)'/\1/p" "$work/pi-07.toml")
[[ "$key" =~ ^[0-9a-f]{64}$ ]] || fail "add-device printed no key"
card="$work/card"; fresh_card "$card"
original_cmdline=$(cat "$card/cmdline.txt")
run() { bash "$provision" --boot "$card" --package "$deb" --worker-config "$work/pi-07.toml" --data "$work/data" \
          --libraries "$libraries" "$@"; }
run --worker-id 2 --workers 5 >"$work/provision.log" 2>&1 || { cat "$work/provision.log" >&2; fail "provisioning failed"; }
cat "$work/provision.log"

# Every file written, and nothing else.
expected=$(cd "$card" && find . -type f | sort)
written=$(printf '%s\n' ./cmdline.txt.orig-edgetrain ./edgetrain/firstboot.sh ./edgetrain/worker.toml ./edgetrain/worker.psk \
  ./edgetrain/data/train-images-idx3-ubyte ./edgetrain/data/train-labels-idx1-ubyte "./edgetrain/packages/$(basename "$deb")")
for d in "$card"/edgetrain/packages/lib*.deb; do written=$(printf '%s\n%s' "$written" "./edgetrain/packages/$(basename "$d")"); done
untouched=$'./bcm2711-rpi-4-b.dtb\n./cmdline.txt\n./config.txt\n./kernel8.img\n./kernel_2712.img\n./overlays/README'
[ "$expected" = "$(printf '%s\n%s\n' "$written" "$untouched" | sort)" ] || fail "unexpected set of files on the card:
$expected"
cmp -s "$deb" "$card/edgetrain/packages/$(basename "$deb")" || fail "the package on the card differs"
# The libraries: exactly the Depends closure minus Raspberry Pi OS's own (C/C++ runtime, zlib, systemd).
libs=$(cd "$card/edgetrain/packages" && ls lib*.deb | sed 's/_.*//' | sort | tr '\n' ' ')
[ "$libs" = "libcpuinfo0 libmbedcrypto7 libmbedtls14 libmbedx509-1 libpthreadpool0 libtomlplusplus3 libxnnpack0 " ] ||
  fail "libraries on the card: $libs"
for d in "$card"/edgetrain/packages/lib*.deb; do cmp -s "$d" "$libraries/$(basename "$d")" || fail "$d differs from $libraries"; done
cmp -s "$work/data/train-images-idx3-ubyte" "$card/edgetrain/data/train-images-idx3-ubyte" || fail "images differ"
cmp -s "$work/data/train-labels-idx1-ubyte" "$card/edgetrain/data/train-labels-idx1-ubyte" || fail "labels differ"
cmp -s "$(dirname "$provision")/packaging/firstboot.sh" "$card/edgetrain/firstboot.sh" || fail "firstboot.sh differs"
[ "$(cat "$card/edgetrain/worker.psk")" = "$key" ] || fail "worker.psk does not hold the key"
[ "$(stat -c %a "$card/edgetrain/worker.psk")" = 600 ] || fail "worker.psk is not mode 0600"
[ "$(cat "$card/cmdline.txt.orig-edgetrain")" = "$original_cmdline" ] || fail "the cmdline.txt backup differs"
# worker.toml: the package's board defaults with this board's identity, server and shard.
dpkg-deb --fsys-tarfile "$deb" | tar -xO ./etc/edgetrain/worker.toml > "$work/default.toml"
diff "$work/default.toml" "$card/edgetrain/worker.toml" > "$work/toml.diff" || true
[ "$(grep -c '^>' "$work/toml.diff")" = 4 ] || fail "worker.toml changes other lines: $(cat "$work/toml.diff")"
for line in 'identity = "pi-07"' 'server = "coaps://192.0.2.10:5684"' 'worker_id = 2' 'workers = 5'; do
  grep -qxF "$line" "$card/edgetrain/worker.toml" || fail "worker.toml lacks: $line"
done
! grep -q "$key" "$card/edgetrain/worker.toml" || fail "the key leaked into worker.toml"
hook="systemd.run=/boot/firmware/edgetrain/firstboot.sh systemd.run_success_action=reboot systemd.unit=kernel-command-line.target"
[ "$(cat "$card/cmdline.txt")" = "$original_cmdline $hook" ] || fail "cmdline.txt is: $(cat "$card/cmdline.txt")"
[ "$(wc -l < "$card/cmdline.txt")" = 1 ] || fail "cmdline.txt is not one line"
echo "card: every file checked"

# Again, for another board and shard: same files, the hook still once.
"$server" add-device pi-08 --keystore "$work/keys.toml" --server-uri coaps://192.0.2.10:5684 >"$work/pi-08.toml" 2>/dev/null
key=$(sed -nE "s/^key_hex = '(.*)'/\1/p" "$work/pi-08.toml")
bash "$provision" --boot "$card" --package "$deb" --worker-config "$work/pi-08.toml" --worker-id 3 --workers 5 \
  --data "$work/data" --libraries "$libraries" >/dev/null 2>&1 || fail "provisioning the same card again failed"
[ "$(cat "$card/cmdline.txt")" = "$original_cmdline $hook" ] || fail "a second run changed cmdline.txt to: $(cat "$card/cmdline.txt")"
grep -qxF 'identity = "pi-08"' "$card/edgetrain/worker.toml" && grep -qx 'worker_id = 3' "$card/edgetrain/worker.toml" ||
  fail "a second run did not replace worker.toml"
[ "$(cat "$card/cmdline.txt.orig-edgetrain")" = "$original_cmdline" ] || fail "a second run overwrote the backup"
echo "card provisioned twice: hook once, files replaced"

# Bad input: a clear error, and the card exactly as it was.
before=$(snapshot "$card")
refuse() { # refuse WHAT ARGS...: provisioning must fail with a message and change nothing
  local what="$1"; shift
  if bash "$provision" "$@" >"$work/refused.log" 2>&1; then fail "accepted $what"; fi
  grep -q '^provision-sd: ' "$work/refused.log" || { cat "$work/refused.log" >&2; fail "no clear error for $what"; }
  [ "$(snapshot "$card")" = "$before" ] || fail "the card changed although $what was refused"
  echo "refused $what: $(grep '^provision-sd: ' "$work/refused.log" | head -n1)"
}
args=(--package "$deb" --data "$work/data" --libraries "$libraries")
refuse "a shard id not below the count" --boot "$card" "${args[@]}" --worker-config "$work/pi-07.toml" --worker-id 5 --workers 5
refuse "a non-numeric shard count" --boot "$card" "${args[@]}" --worker-config "$work/pi-07.toml" --worker-id 0 --workers x
grep -v key_hex "$work/pi-07.toml" > "$work/nokey.toml"
refuse "a configuration without key" --boot "$card" "${args[@]}" --worker-config "$work/nokey.toml" --worker-id 0 --workers 5
sed "s/^identity = .*/identity = 'a b'/" "$work/pi-07.toml" > "$work/badid.toml"
refuse "a bad identity" --boot "$card" "${args[@]}" --worker-config "$work/badid.toml" --worker-id 0 --workers 5
refuse "a directory that is not a boot partition" --boot "$work/data" "${args[@]}" --worker-config "$work/pi-07.toml" --worker-id 0 --workers 5
refuse "a package file that is not a .deb" --boot "$card" --package "$work/data/train-images-idx3-ubyte" \
  --data "$work/data" --libraries "$libraries" --worker-config "$work/pi-07.toml" --worker-id 0 --workers 5
refuse "missing training data" --boot "$card" --package "$deb" --data "$work/nothing" --libraries "$libraries" \
  --worker-config "$work/pi-07.toml" --worker-id 0 --workers 5
refuse "an unknown option" --boot "$card" "${args[@]}" --worker-config "$work/pi-07.toml" --worker-id 0 --workers 5 --force

# A card customised with Raspberry Pi Imager: its firstrun.sh (and systemd.run=) already runs
# at first boot; the hook is called from it, before its self-removal, and cmdline.txt stays.
imager="$work/imager-card"; fresh_card "$imager"
sed -i 's/$/ systemd.run=\/boot\/firstrun.sh systemd.run_success_action=reboot systemd.unit=kernel-command-line.target/' "$imager/cmdline.txt"
printf '#!/bin/bash\n\nset +e\n\necho pi-07 >/etc/hostname\nrm -f /boot/firstrun.sh\nsed -i '"'"'s| systemd.run.*||g'"'"' /boot/cmdline.txt\nexit 0\n' > "$imager/firstrun.sh"
imager_cmdline=$(cat "$imager/cmdline.txt")
for _ in 1 2; do
  bash "$provision" --boot "$imager" "${args[@]}" --worker-config "$work/pi-07.toml" --worker-id 0 --workers 5 >/dev/null 2>&1 ||
    fail "provisioning an Imager-customised card failed"
done
[ "$(cat "$imager/cmdline.txt")" = "$imager_cmdline" ] || fail "cmdline.txt of an Imager card was changed"
[ "$(grep -n . "$imager/firstrun.sh" | sed -n 's/^\([0-9]*\):bash \/boot\/firmware\/edgetrain\/firstboot.sh$/\1/p')" = 6 ] ||
  fail "the hook is not called once, right before firstrun.sh removes itself: $(cat "$imager/firstrun.sh")"
bash -n "$imager/firstrun.sh" || fail "firstrun.sh no longer parses"
echo "Imager-customised card: hook called from firstrun.sh line 6, before its rm line, cmdline.txt unchanged"

# The hook on the board: a stand-in root file system with the card at /boot/firmware;
# dpkg and systemctl record their calls instead of installing.
root="$work/rootfs"; mkdir -p "$root/boot" "$work/bin"
cp -a "$card" "$root/boot/firmware"
for tool in dpkg systemctl; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\n' "$tool" "$work" > "$work/bin/$tool"; chmod +x "$work/bin/$tool"
done
PATH="$work/bin:$PATH" EDGETRAIN_FIRSTBOOT_ROOT="$root" bash "$root/boot/firmware/edgetrain/firstboot.sh" ||
  fail "the first-boot hook failed"
log="$root/boot/firmware/edgetrain/firstboot.log"
cat "$log"
cmp -s "$card/edgetrain/worker.toml" "$root/etc/edgetrain/worker.toml" || fail "hook: worker.toml not installed"
[ "$(cat "$root/etc/edgetrain/worker.psk")" = "$key" ] && [ "$(stat -c %a "$root/etc/edgetrain/worker.psk")" = 600 ] ||
  fail "hook: worker.psk not installed with mode 0600"
cmp -s "$work/data/train-images-idx3-ubyte" "$root/var/lib/edgetrain/data/train-images-idx3-ubyte" || fail "hook: data not installed"
grep -q "^dpkg --force-confold -i .*/edgetrain/packages/edgetrain-worker-.*_arm64.deb" "$work/calls" ||
  fail "hook: the packages were not installed with dpkg: $(cat "$work/calls")"
[ "$(grep -o 'packages/[^ ]*\.deb' "$work/calls" | wc -l)" = 8 ] || fail "hook: dpkg was not given all eight packages"
grep -qx "systemctl enable edgetrain-worker.service" "$work/calls" || fail "hook: the service was not enabled"
[ ! -e "$root/boot/firmware/edgetrain/worker.psk" ] || fail "hook: the key is still on the boot partition"
[ ! -e "$root/boot/firmware/edgetrain/firstboot.sh" ] || fail "hook: it would run again"
[ ! -e "$root/boot/firmware/edgetrain/packages" ] || fail "hook: packages left on the card after success"
[ "$(cat "$root/boot/firmware/cmdline.txt")" = "$original_cmdline" ] || fail "hook: cmdline.txt not restored: $(cat "$root/boot/firmware/cmdline.txt")"
grep -q '^done: ' "$log" || fail "hook: the log does not say it is done"
echo "first-boot hook: configuration, key (0600), data installed; 8 packages to dpkg; service enabled; key, hook and cmdline arguments removed"
echo "provisioning: all checks passed"
