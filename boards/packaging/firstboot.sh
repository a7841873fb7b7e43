#!/bin/bash
# edgetrain's first-boot hook. boards/provision-sd.sh writes it, with the files it installs,
# to edgetrain/ on the boot partition of a Raspberry Pi OS bookworm card. It runs once, as
# root, early in the first full boot (boot partition mounted at /boot/firmware, no network
# needed), either from the kernel command line (systemd.run=, the mechanism Raspberry Pi
# Imager's firstrun.sh uses) or called from Imager's own firstrun.sh. It installs the worker
# package and the libraries it needs from the card, its configuration and key, and the
# training data, then removes the key and itself from the boot partition. Everything it
# does goes to edgetrain/firstboot.log on the boot partition, readable with a card reader.
# EDGETRAIN_FIRSTBOOT_ROOT (tests only) prefixes every path.
set -u
root="${EDGETRAIN_FIRSTBOOT_ROOT:-}"
boot="$root/boot/firmware"
here="$boot/edgetrain"
exec >>"$here/firstboot.log" 2>&1
echo "$(date -u '+%F %T') edgetrain first boot on $( (tr -d '\0' < "$root/proc/device-tree/model") 2>/dev/null || echo 'an unknown board')"
failed=""
step() { # step DESCRIPTION COMMAND...: runs COMMAND, logs the outcome
  local what="$1"; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what (exit $?)"; failed="$failed; $what"; fi
}

step "configuration to /etc/edgetrain" install -D -m 0644 "$here/worker.toml" "$root/etc/edgetrain/worker.toml"
step "key to /etc/edgetrain/worker.psk (mode 0600)" install -D -m 0600 "$here/worker.psk" "$root/etc/edgetrain/worker.psk"
step "training data to /var/lib/edgetrain/data" \
  bash -c 'install -d -m 0755 "$1" && install -m 0644 "$2"/train-* "$1"/' _ "$root/var/lib/edgetrain/data" "$here/data"
# Offline: the worker package and the libraries Raspberry Pi OS lacks all come from the card.
# --force-confold keeps the worker.toml written above instead of the package's default.
step "packages $(cd "$here/packages" && echo *.deb)" \
  env DEBIAN_FRONTEND=noninteractive dpkg --force-confold -i "$here"/packages/*.deb
step "edgetrain-worker.service enabled" systemctl enable edgetrain-worker.service

# The key is installed (or this boot could not use it anyway): it must not stay on the FAT
# partition, which anyone with the card can read.
rm -f "$here/worker.psk"
if [ -z "$failed" ]; then
  rm -rf "$here/packages" "$here/data"
  echo "done: edgetrain-worker.service starts on every boot"
else
  echo "not finished:${failed#;}. Packages and data stay in $here; on the board run"
  echo "  sudo dpkg --force-confold -i $here/packages/*.deb && sudo systemctl enable --now edgetrain-worker"
fi
# Never run again: drop this hook's kernel command line arguments (when it was started that way).
sed -i 's| systemd\.run=/boot/firmware/edgetrain/firstboot\.sh systemd\.run_success_action=reboot systemd\.unit=kernel-command-line\.target||' "$boot/cmdline.txt"
rm -f "$here/firstboot.sh"
# Exit 0 either way: systemd.run_success_action=reboot then boots the system normally.
exit 0
