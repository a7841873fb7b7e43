#!/usr/bin/env bash
# Builds a bootable Debian bookworm arm64 system for qemu-system-aarch64 (-M virt): the
# stand-in for a Raspberry Pi OS Lite (64-bit) card that tests/boards/worker_in_vm.sh boots.
# Only Debian packages from the machine's own apt sources, nothing of edgetrain's.
#
#   boards/vm-image.sh [--print-dir]
#
# Cached like the sysroot: $EDGETRAIN_DEPS/board-vm/ (default /var/cache/edgetrain) holds
#   rootfs.img   ext4 image of the root file system (raw; runs use a copy-on-write overlay)
#   vmlinuz, initrd.img   the guest's own kernel and initramfs (Debian's linux-image-arm64)
#   stamp        what it was built from; a matching stamp skips the build
# and is rebuilt when this script or its package list changes.
#
# How, without binfmt_misc or loop devices (neither is needed, so it works in containers):
# debootstrap --foreign unpacks the packages here; a throw-away initramfs (busybox-static
# and the kernel's virtio/ext4 modules, all arm64 Debian packages) boots the image once under
# qemu-system-aarch64, where debootstrap's second stage runs the maintainer scripts and
# setup-system below configures it; mkfs.ext4 -d makes the image from the directory.
# Needs root (debootstrap), debootstrap, qemu-system-arm, e2fsprogs, kmod, cpio (setup-deps
# step board-vm installs them).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEPS="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
OUT="$DEPS/board-vm"
[ "${1:-}" = --print-dir ] && { echo "$OUT"; exit 0; }

# What Raspberry Pi OS Lite (bookworm, 64-bit) has that matters here: systemd as init, the
# worker package's Depends that it does not bring itself (libc6, libgcc-s1, libstdc++6,
# zlib1g come with the base system), apt, sudo, ssh, networking. Plus what only a VM needs:
# Debian's arm64 kernel (the Pi's is raspberrypi-kernel) and the test's way in (ssh).
PACKAGES=(systemd systemd-sysv udev dbus kmod iproute2 netbase procps sudo openssh-server
          apt ca-certificates libstdc++6 zlib1g linux-image-arm64 initramfs-tools)
SUITE=bookworm
IMAGE_SIZE=3G

say() { echo "vm-image: $*"; }
die() { echo "vm-image: $*" >&2; exit 1; }

stamp=$( { printf '%s\n' "${PACKAGES[@]}" "$SUITE" "$IMAGE_SIZE"; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)
if [ -f "$OUT/stamp" ] && [ "$(cat "$OUT/stamp")" = "$stamp" ] &&
   [ -f "$OUT/rootfs.img" ] && [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/initrd.img" ]; then
  say "up to date: $OUT"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "needs root (debootstrap); run it with sudo"
for tool in debootstrap qemu-system-aarch64 mkfs.ext4 e2fsck debugfs depmod modprobe cpio; do
  command -v "$tool" >/dev/null || die "$tool is missing: run toolchains/setup-deps.sh --only board-vm"
done

# The machine's own Debian mirror (no mirror name lives in this repository): the first
# deb URI of a source that carries $SUITE.
mirror_uri() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && sed -n "s|^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([a-z]\+://[^[:space:]]*\)[[:space:]]\+$SUITE[[:space:]].*|\2|p" "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && awk -v suite="$SUITE" 'BEGIN { RS = "" } /(^|\n)Types:[^\n]*deb([ \t]|\n|$)/ &&
      match($0, /(^|\n)Suites:[^\n]*/) && (" " substr($0, RSTART, RLENGTH) " ") ~ (" " suite "[ \n]") {
        if (match($0, /(^|\n)URIs:[ \t]*[^ \t\n]+/)) { u = substr($0, RSTART, RLENGTH); sub(/^\n?URIs:[ \t]*/, "", u); print u } }' "$f"
  done
}
MIRROR=$(mirror_uri | head -n1)
[ -n "$MIRROR" ] || die "no deb source for $SUITE in /etc/apt/sources.list*"

work="$OUT.tmp"
rm -rf "$work"; mkdir -p "$work"
LOG="$work/build.log"
root="$work/root"
started=$SECONDS

say "debootstrap --foreign ($SUITE arm64 from $MIRROR; log $LOG)"
debootstrap --foreign --arch=arm64 --variant=minbase --include="$(IFS=,; echo "${PACKAGES[*]}")" \
  "$SUITE" "$root" "$MIRROR" >>"$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; die "debootstrap failed"; }

# The kernel the image will run, unpacked here for the first boot's initramfs.
kdeb=$(ls "$root"/var/cache/apt/archives/linux-image-[0-9]*-arm64_*.deb 2>/dev/null | head -n1)
[ -n "$kdeb" ] || die "debootstrap downloaded no linux-image-*-arm64"
kdir="$work/kernel"; mkdir -p "$kdir"
dpkg-deb -x "$kdeb" "$kdir"
kver=$(ls "$kdir/lib/modules")
depmod -b "$kdir" "$kver"

# busybox-static (arm64) for that initramfs, through a private apt state: the host's
# dpkg architecture list stays untouched.
aptdir="$work/apt"; mkdir -p "$aptdir/lists/partial" "$aptdir/archives/partial"
apt_opts=(-o "Dir::State::Lists=$aptdir/lists" -o "Dir::Cache=$aptdir" -o "Dir::Cache::archives=$aptdir/archives"
          -o "Dir::State::status=/dev/null" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root"
          -o "APT::Architecture=arm64" -o "APT::Architectures::=arm64")
apt-get "${apt_opts[@]}" update >>"$LOG" 2>&1 || die "apt-get update (arm64) failed"
(cd "$work" && apt-get "${apt_opts[@]}" download busybox-static:arm64 >>"$LOG" 2>&1) || die "cannot download busybox-static:arm64"
bdir="$work/busybox"; dpkg-deb -x "$work"/busybox-static_*_arm64.deb "$bdir"

say "first-boot initramfs (busybox, virtio and ext4 modules of $kver)"
ird="$work/initramfs"; mkdir -p "$ird"/{bin,dev,proc,sys,newroot}
cp "$bdir/bin/busybox" "$ird/bin/busybox"
for module in virtio_pci virtio_blk crc32c_generic ext4; do
  modprobe -d "$kdir" -S "$kver" --show-depends "$module" || die "kernel $kver has no module $module"
done | sed -n "s|^insmod $kdir\([^ ]*\).*|\1|p" | awk '!seen[$0]++' > "$ird/modules"
while read -r ko; do install -D -m 0644 "$kdir$ko" "$ird$ko"; done < "$ird/modules"
cat > "$ird/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
while read -r ko; do insmod "$ko"; done < /modules
n=0; until [ -b /dev/vda ] || [ $n -ge 100 ]; do sleep 0.1; n=$((n + 1)); done
mount -t ext4 /dev/vda /newroot || { echo "vm-image: cannot mount /dev/vda"; poweroff -f; }
mount --move /dev /newroot/dev; umount /proc /sys
exec switch_root /newroot /bin/sh /setup-system
INIT
chmod 0755 "$ird/init"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs-firstboot.gz"

# Runs inside the guest as PID 1 on that first boot: debootstrap's second stage (every
# maintainer script, the kernel's initramfs), then the settings of a Raspberry Pi OS card
# that Imager customised (user with sudo, ssh, DHCP on the wired interface), then powers off.
apt_checks=$(apt-config dump | grep -E '^Acquire::Check-(Valid-Until|Date) ' || true)
cat > "$root/setup-system" <<SETUP
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sysfs /sys
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
finish() { echo "vm-image: setup-system \$1"; sync; mount -o remount,ro / ; echo o > /proc/sysrq-trigger; sleep 60; }
/debootstrap/debootstrap --second-stage || { cat /debootstrap/debootstrap.log 2>/dev/null | tail -n 30; finish failed; }
echo raspberrypi > /etc/hostname
printf '127.0.0.1\tlocalhost\n127.0.1.1\traspberrypi\n' > /etc/hosts
# Like Raspberry Pi OS: the boot partition (FAT, label bootfs) at /boot/firmware.
mkdir -p /boot/firmware
printf '/dev/vda\t/\text4\tdefaults,noatime\t0\t1\nLABEL=bootfs\t/boot/firmware\tvfat\tdefaults\t0\t2\n' > /etc/fstab
printf 'deb $MIRROR $SUITE main\ndeb $MIRROR $SUITE-updates main\n' > /etc/apt/sources.list
printf '%s\n' '$apt_checks' > /etc/apt/apt.conf.d/80-machine-checks
printf '[Match]\nName=en*\n\n[Network]\nDHCP=yes\n' > /etc/systemd/network/20-wired.network
printf 'nameserver 10.0.2.3\n' > /etc/resolv.conf
systemctl enable systemd-networkd.service systemd-networkd-wait-online.service ssh.service
# The user Imager creates (Raspberry Pi OS gives it sudo without a password).
useradd -m -s /bin/bash -G sudo pi
echo 'pi ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/010_pi-nopasswd
chmod 0440 /etc/sudoers.d/010_pi-nopasswd
# The test harness's way in, not edgetrain's: pi's ssh key comes from the kernel command
# line (edgetrain_vm.ssh_key=BASE64 of an ed25519 key, a new one each run).
cat > /usr/local/sbin/vm-authorized-key <<'KEY'
#!/bin/sh
key=\$(sed -n 's/.*edgetrain_vm\.ssh_key=\([A-Za-z0-9+\/=]*\).*/\1/p' /proc/cmdline)
[ -n "\$key" ] || exit 0
install -d -o pi -g pi -m 0700 /home/pi/.ssh
echo "ssh-ed25519 \$key vm-test" > /home/pi/.ssh/authorized_keys
chown pi:pi /home/pi/.ssh/authorized_keys
KEY
chmod 0755 /usr/local/sbin/vm-authorized-key
printf '[Unit]\nDescription=ssh key of the VM test harness (kernel command line)\nBefore=ssh.service\n\n[Service]\nType=oneshot\nExecStart=/usr/local/sbin/vm-authorized-key\n\n[Install]\nWantedBy=multi-user.target\n' > /etc/systemd/system/vm-authorized-key.service
systemctl enable vm-authorized-key.service
apt-get clean
rm -rf /debootstrap
ls /boot/vmlinuz-* /boot/initrd.img-* > /etc/edgetrain-vm-image || finish failed
# /setup-system stays until the host removes it: deleting the script sh is reading would
# leave an open, unlinked file, and / could not be remounted read-only (EBUSY).
finish done
SETUP
chmod 0755 "$root/setup-system"

# The guest's initramfs with the modules a virt machine needs to reach its root, not
# initramfs-tools' default MODULES=most: copying hundreds of modules took more than 30
# minutes of the second stage under TCG.
mkdir -p "$root/etc/initramfs-tools/conf.d" "$root/etc/initramfs-tools/hooks"
echo 'MODULES=list' > "$root/etc/initramfs-tools/conf.d/edgetrain-vm.conf"
cat > "$root/etc/initramfs-tools/hooks/edgetrain-vm" <<'HOOK'
#!/bin/sh
# The emulated board's root: virtio block device on QEMU's virt machine, ext4.
case "$1" in prereqs) exit 0 ;; esac
. /usr/share/initramfs-tools/hook-functions
manual_add_modules virtio_pci virtio_blk crc32c_generic ext4
HOOK
chmod 0755 "$root/etc/initramfs-tools/hooks/edgetrain-vm"

say "root file system image ($IMAGE_SIZE, mkfs.ext4 -d)"
mkfs.ext4 -q -F -L rootfs -d "$root" "$work/rootfs.img" "$IMAGE_SIZE" >>"$LOG" 2>&1 || die "mkfs.ext4 failed"
rm -rf "$root"

say "second stage inside qemu-system-aarch64 (TCG: takes minutes; console in $work/console.log)"
stage2=$SECONDS
qemu-system-aarch64 -M virt -cpu cortex-a72 -smp 2 -m 1024 -no-reboot -display none -monitor none \
  -serial "file:$work/console.log" \
  -kernel "$kdir/boot/vmlinuz-$kver" -initrd "$work/initramfs-firstboot.gz" \
  -append "console=ttyAMA0 panic=-1" \
  -drive "file=$work/rootfs.img,format=raw,if=virtio,cache=unsafe" \
  -netdev user,id=net0 -device virtio-net-pci,netdev=net0,romfile= >>"$LOG" 2>&1 || die "qemu-system-aarch64 failed"
grep -q 'vm-image: setup-system done' "$work/console.log" ||
  { tail -n 40 "$work/console.log" >&2; die "the second stage did not finish (console: $work/console.log)"; }
say "second stage: $((SECONDS - stage2)) s"
# The guest powers off right after its last sync: replay the ext4 journal here (debugfs reads
# without replaying it), then remove the script of the first boot.
e2fsck -fy "$work/rootfs.img" >>"$LOG" 2>&1 || [ $? -le 1 ] || die "e2fsck of the image failed (log: $LOG)"
debugfs -w -R "rm /setup-system" "$work/rootfs.img" >>"$LOG" 2>&1 || die "cannot remove /setup-system from the image"

# The guest's own kernel and initramfs, for every later boot.
debugfs -R "cat /etc/edgetrain-vm-image" "$work/rootfs.img" 2>/dev/null > "$work/boot-files"
vmlinuz=$(grep /boot/vmlinuz- "$work/boot-files" | head -n1 || true)
initrd=$(grep /boot/initrd.img- "$work/boot-files" | head -n1 || true)
[ -n "$vmlinuz" ] && [ -n "$initrd" ] || die "the image has no kernel or initramfs in /boot"
debugfs -R "dump $vmlinuz $work/vmlinuz" "$work/rootfs.img" >>"$LOG" 2>&1
debugfs -R "dump $initrd $work/initrd.img" "$work/rootfs.img" >>"$LOG" 2>&1
[ -s "$work/vmlinuz" ] && [ -s "$work/initrd.img" ] || die "cannot read $vmlinuz / $initrd from the image"
rm -rf "$work/kernel" "$work/busybox" "$work/initramfs" "$work/apt" "$work"/busybox-static_*.deb
echo "$stamp" > "$work/stamp"
rm -rf "$OUT"; mv "$work" "$OUT"
say "done in $((SECONDS - started)) s: $OUT"
