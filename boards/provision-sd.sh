#!/usr/bin/env bash
# Prepares a freshly flashed Raspberry Pi OS bookworm (64-bit) card to become an edgetrain
# worker on its first boot: writes the worker package, the libraries it needs, its
# configuration and key, the training data and a first-boot hook to the card's boot
# partition. See boards/README.md ("From a box of Raspberry Pis to a trained model").
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: boards/provision-sd.sh --boot DIR --package DEB --worker-config FILE --worker-id N --workers M
                              [--data DIR] [--libraries DIR]

  --boot DIR            the mounted boot partition of the card (volume "bootfs"; on the
                        board it becomes /boot/firmware)
  --package DEB         the worker package for this board, edgetrain-worker-<board>_*_arm64.deb
                        (./build.sh package <board> writes it to build/<board>/packages/)
  --worker-config FILE  what `edgetrain-server add-device NAME` printed for this board
                        (identity, key_hex, server)
  --worker-id N         this board's data shard, 0 <= N < M, a different one per board
  --workers M           the number of shards (boards) of the run
  --data DIR            training data: train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz]
                        (default: full MNIST, $EDGETRAIN_DEPS/mnist-full, set up by toolchains/setup-deps.sh)
  --libraries DIR       Debian arm64 packages the worker's Depends come from
                        (default: $EDGETRAIN_DEPS/apt-arm64/debs, the sysroot's downloads)

Writes under DIR: edgetrain/{firstboot.sh,worker.toml,worker.psk,packages/,data/} and
cmdline.txt.orig-edgetrain (the untouched cmdline.txt); then either adds one call line to
Raspberry Pi Imager's firstrun.sh (when the card was customised with Imager) or appends
  systemd.run=/boot/firmware/edgetrain/firstboot.sh systemd.run_success_action=reboot systemd.unit=kernel-command-line.target
to cmdline.txt. Running it again on the same card replaces the edgetrain files only.
USAGE
}

die() { echo "provision-sd: $*" >&2; exit 1; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deps="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
boot="" package="" worker_config="" worker_id="" workers="" data="$deps/mnist-full" libraries="$deps/apt-arm64/debs"
while [ $# -gt 0 ]; do
  case "$1" in
    --boot|--package|--worker-config|--worker-id|--workers|--data|--libraries)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --boot) boot="$2" ;; --package) package="$2" ;; --worker-config) worker_config="$2" ;;
        --worker-id) worker_id="$2" ;; --workers) workers="$2" ;; --data) data="$2" ;; --libraries) libraries="$2" ;;
      esac
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[ -n "$boot" ] && [ -n "$package" ] && [ -n "$worker_config" ] && [ -n "$worker_id" ] && [ -n "$workers" ] ||
  { usage >&2; die "--boot, --package, --worker-config, --worker-id and --workers are required"; }

# ---- check everything before writing anything -------------------------------------------
[ -d "$boot" ] || die "$boot is not a directory (mount the card's boot partition first)"
[ -f "$boot/cmdline.txt" ] && [ -f "$boot/config.txt" ] ||
  die "$boot has no cmdline.txt and config.txt: not the boot partition of a Raspberry Pi OS card"
[ "$(wc -l < "$boot/cmdline.txt")" -le 1 ] && grep -q 'root=' "$boot/cmdline.txt" ||
  die "$boot/cmdline.txt is not a one-line kernel command line with root=: refusing to edit it"
[ -f "$boot/kernel8.img" ] || die "$boot has no kernel8.img: flash a 64-bit Raspberry Pi OS (bookworm) image"
[ -w "$boot" ] || die "$boot is not writable"

[ -f "$package" ] || die "no package $package (./build.sh package BOARD builds it)"
pkg_name=$(dpkg-deb -f "$package" Package 2>/dev/null) || die "$package is not a Debian package"
[[ "$pkg_name" == edgetrain-worker-* ]] || die "$package is $pkg_name, not an edgetrain-worker-<board> package"
[ "$(dpkg-deb -f "$package" Architecture)" = arm64 ] || die "$package is not an arm64 package"
template=$(dpkg-deb --fsys-tarfile "$package" | tar -xO ./etc/edgetrain/worker.toml 2>/dev/null) ||
  die "$package has no /etc/edgetrain/worker.toml"

[[ "$workers" =~ ^[1-9][0-9]{0,5}$ ]] || die "--workers must be a positive number, not '$workers'"
[[ "$worker_id" =~ ^[0-9]{1,6}$ ]] && [ "$worker_id" -lt "$workers" ] ||
  die "--worker-id must be a number below --workers ($workers), not '$worker_id'"

[ -f "$worker_config" ] || die "no worker configuration $worker_config (edgetrain-server add-device NAME prints it)"
# add-device prints `key = 'value'` lines (TOML literal strings); basic strings are accepted too.
toml_value() {
  sed -nE "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*(\"([^\"]*)\"|'([^']*)')[[:space:]]*(#.*)?$/\2\3/p" "$worker_config" | tail -n1
}
identity=$(toml_value identity) key_hex=$(toml_value key_hex) server=$(toml_value server)
[[ "$identity" =~ ^[A-Za-z0-9._-]{1,64}$ ]] || die "$worker_config: identity must be 1-64 of [A-Za-z0-9._-], not '$identity'"
[[ "$key_hex" =~ ^([0-9a-fA-F]{2}){1,64}$ ]] || die "$worker_config: key_hex must be 1-64 bytes of hex"
[[ "$server" =~ ^coaps://[^[:space:]\'\"]+$ ]] || die "$worker_config: server must be a coaps:// URI, not '$server'"
[[ "$server" =~ ^coaps://(127\.|localhost|\[::1\])|:0$ ]] &&
  echo "provision-sd: warning: server $server is this machine's loopback or port 0; the board needs the server's LAN address (add-device --server-uri)" >&2

images=$(ls "$data"/train-images-idx3-ubyte "$data"/train-images-idx3-ubyte.gz 2>/dev/null | head -n1 || true)
labels=$(ls "$data"/train-labels-idx1-ubyte "$data"/train-labels-idx1-ubyte.gz 2>/dev/null | head -n1 || true)
[ -n "$images" ] && [ -n "$labels" ] || die "$data has no train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz]"

# The libraries to install from the card: the package's Depends and their Depends, found
# among the arm64 packages, minus what every Raspberry Pi OS image has (and must not be
# replaced by Debian's build): the C and C++ runtimes, zlib, systemd.
base_system=" libc6 libgcc-s1 libstdc++6 zlib1g systemd gcc-12-base libcrypt1 "
ls "$libraries"/*.deb >/dev/null 2>&1 || die "no .deb files in $libraries (toolchains/setup-deps.sh --only sysroot)"
depends_of() { dpkg-deb -f "$1" Depends | tr ',' '\n' | sed -E 's/^ *([^ (|]+).*/\1/' | grep -v '^$' || true; }
deb_of() { local f; for f in "$libraries/$1"_*_arm64.deb "$libraries/$1"_*_all.deb; do [ -f "$f" ] && { echo "$f"; return; }; done; }
wanted=() queue=($(depends_of "$package")) seen=" "
while [ ${#queue[@]} -gt 0 ]; do
  dep=${queue[0]}; queue=("${queue[@]:1}")
  [[ "$seen" == *" $dep "* || "$base_system" == *" $dep "* ]] && continue
  seen="$seen$dep "
  deb=$(deb_of "$dep")
  [ -n "$deb" ] || die "$package needs $dep, which is neither in $libraries nor part of Raspberry Pi OS"
  wanted+=("$deb"); queue+=($(depends_of "$deb"))
done

# ---- write -------------------------------------------------------------------------------
out="$boot/edgetrain"
rm -rf "$out.new"; mkdir -p "$out.new/packages" "$out.new/data"
cp "$package" "${wanted[@]}" "$out.new/packages/"
cp "$images" "$labels" "$out.new/data/"
cp "$here/packaging/firstboot.sh" "$out.new/firstboot.sh"
chmod 0755 "$out.new/firstboot.sh"
# The package's own worker.toml (the board's defaults) with this board's identity, server and shard.
printf '%s\n' "$template" | sed -E \
  -e "s|^identity = .*|identity = \"$identity\"|" -e "s|^server = .*|server = \"$server\"|" \
  -e "s|^worker_id = .*|worker_id = $worker_id|" -e "s|^workers = .*|workers = $workers|" > "$out.new/worker.toml"
printf '%s\n' "$key_hex" > "$out.new/worker.psk"
chmod 0600 "$out.new/worker.psk"
rm -rf "$out"; mv "$out.new" "$out"

[ -f "$boot/cmdline.txt.orig-edgetrain" ] || cp "$boot/cmdline.txt" "$boot/cmdline.txt.orig-edgetrain"
call="bash /boot/firmware/edgetrain/firstboot.sh"
if [ -f "$boot/firstrun.sh" ]; then
  # Customised with Raspberry Pi Imager: its firstrun.sh already runs once at first boot (and
  # raspberrypi-sys-mods' imager_fixup rewrites it for /boot/firmware). Call the hook from
  # it, after Imager's settings (user, network) and before its self-removal at the end.
  if ! grep -qF "$call" "$boot/firstrun.sh"; then
    grep -qE '^rm -f /boot(/firmware)?/firstrun\.sh' "$boot/firstrun.sh" ||
      die "$boot/firstrun.sh does not end the way Raspberry Pi Imager writes it; the edgetrain files are on the card, add the line '$call' to it by hand"
    sed -i -E "0,/^rm -f \/boot(\/firmware)?\/firstrun\.sh/s||$call\n&|" "$boot/firstrun.sh"
  fi
  how="from Raspberry Pi Imager's firstrun.sh"
else
  args="systemd.run=/boot/firmware/edgetrain/firstboot.sh systemd.run_success_action=reboot systemd.unit=kernel-command-line.target"
  if ! grep -qF "$args" "$boot/cmdline.txt"; then
    line=$(tr -d '\r\n' < "$boot/cmdline.txt" | sed 's/[[:space:]]*$//')
    printf '%s %s\n' "$line" "$args" > "$boot/cmdline.txt"
  fi
  how="from the kernel command line (systemd.run=)"
fi
sync
echo "provision-sd: $boot: $pkg_name for '$identity' (shard $worker_id of $workers) -> $server"
echo "provision-sd: first boot runs edgetrain/firstboot.sh $how; its log is edgetrain/firstboot.log"
