# Sourced by tests/boards/worker_in_vm.sh: boots the Debian arm64 image of boards/vm-image.sh
# under qemu-system-aarch64 as one Raspberry Pi board and drives it over ssh.
#
# A board's disk is a copy-on-write overlay of the cached image (the cache stays pristine),
# plus a FAT "boot partition" image (label bootfs, mounted at /boot/firmware as on Raspberry
# Pi OS) made from a directory. QEMU's direct kernel boot plays the Pi firmware: the kernel
# command line is the boot partition's cmdline.txt, read again at every power-on.
# Expects $work (private directory), fail (common/processes.sh) and $vm_dir (the image).

# Per board: QEMU CPU, memory (MiB) and cores of the real board.
vm_board_cpu() { case "$1" in rpi3|rpi-zero2w) echo cortex-a53 ;; rpi4) echo cortex-a72 ;; rpi5) echo cortex-a76 ;; *) return 1 ;; esac; }
vm_board_memory() { case "$1" in rpi-zero2w) echo 512 ;; *) echo 1024 ;; esac; }

vm_pid="" vm_ssh_port="" vm_console=""

# vm_new_disk NAME: a fresh overlay $work/NAME.qcow2 over the image (a new card, flashed).
vm_new_disk() {
  qemu-img create -q -f qcow2 -F raw -b "$vm_dir/rootfs.img" "$work/$1.qcow2" ||
    fail "qemu-img create of $work/$1.qcow2 failed"
}

# vm_bootfs_dir DIR: what a freshly flashed Raspberry Pi OS bookworm card has on its boot
# partition (the parts provision-sd.sh checks), with the virt machine's devices.
vm_bootfs_dir() {
  mkdir -p "$1"
  echo "console=ttyAMA0 root=/dev/vda rootfstype=ext4 fsck.repair=yes rootwait" > "$1/cmdline.txt"
  printf '# stand-in for the Pi firmware settings\narm_64bit=1\n' > "$1/config.txt"
  cp "$vm_dir/vmlinuz" "$1/kernel8.img"
}

# vm_bootfs_image DIR IMAGE: a FAT image (label bootfs) with DIR's files (no mounting).
vm_bootfs_image() {
  rm -f "$2"
  mkfs.vfat -C -n bootfs "$2" 131072 >/dev/null 2>&1 || fail "mkfs.vfat $2 failed"
  mcopy -s -i "$2" "$1"/* ::/ || fail "mcopy into $2 failed"
}

# vm_bootfs_read IMAGE DIR: the FAT image's files back into DIR (a card reader).
vm_bootfs_read() {
  rm -rf "$2"; mkdir -p "$2"
  mcopy -s -n -i "$1" '::/*' "$2"/ || fail "mcopy from $1 failed"
}

vm_free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    ss -Htln "sport = :$port" | grep -q . || { echo "$port"; return; }
  done
}

# vm_boot BOARD DISK BOOT_IMAGE LOG: powers the board on (in the background; sets $vm_pid,
# $vm_ssh_port); the kernel command line is cmdline.txt of the boot image, plus the test's
# ssh key. The guest reaches the host's 127.0.0.1 as 10.0.2.2 (QEMU user networking).
# QEMU exits when the guest powers off or reboots (-no-reboot): a reboot is a new vm_boot.
vm_boot() {
  local board="$1" disk="$2" boot="$3" log="$4" cmdline
  vm_bootfs_read "$boot" "$work/bootfs-now"
  cmdline=$(head -n1 "$work/bootfs-now/cmdline.txt")
  [ -f "$work/id_vm.pub" ] || ssh-keygen -q -t ed25519 -N '' -C vm-test -f "$work/id_vm" || fail "ssh-keygen failed"
  vm_ssh_port=$(vm_free_port)
  vm_console="$log"
  start_program "$log" qemu-system-aarch64 -M virt -cpu "$(vm_board_cpu "$board")" -smp 4 \
    -m "$(vm_board_memory "$board")" -no-reboot -display none -monitor none -serial stdio \
    -kernel "$vm_dir/vmlinuz" -initrd "$vm_dir/initrd.img" \
    -append "$cmdline edgetrain_vm.ssh_key=$(cut -d' ' -f2 "$work/id_vm.pub")" \
    -drive "file=$disk,format=qcow2,if=virtio,cache=unsafe" -drive "file=$boot,format=raw,if=virtio,cache=unsafe" \
    -netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$vm_ssh_port-:22" -device virtio-net-pci,netdev=net0,romfile=
  vm_pid=$last_pid
}

vm_running() { kill -0 "$vm_pid" 2>/dev/null && ! is_zombie "$vm_pid"; }

# vm_ssh COMMAND...: runs COMMAND on the board as the user pi (sudo without a password).
vm_ssh() {
  ssh -q -i "$work/id_vm" -p "$vm_ssh_port" -o BatchMode=yes -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null -o ConnectTimeout=20 -o ServerAliveInterval=15 pi@127.0.0.1 "$@"
}

# vm_copy FILE... : copies files into pi's home directory.
vm_copy() {
  scp -q -i "$work/id_vm" -P "$vm_ssh_port" -o BatchMode=yes -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null "$@" pi@127.0.0.1: || fail "scp $* failed"
}

# vm_wait_ssh SECONDS: waits until the board accepts ssh and systemd finished starting up.
vm_wait_ssh() {
  local deadline=$((SECONDS + $1))
  until vm_ssh true 2>/dev/null; do
    vm_running || fail "the board powered off while booting (console: $vm_console)"
    [ "$SECONDS" -lt "$deadline" ] || fail "no ssh into the board within $1 s (console: $vm_console)"
    sleep 3
  done
  vm_ssh 'systemctl is-system-running --wait >/dev/null; true'
}

# vm_wait_off SECONDS: waits until QEMU exited (the guest powered off or rebooted).
vm_wait_off() {
  local deadline=$((SECONDS + $1))
  while vm_running; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the board still runs after $1 s (console: $vm_console)"
    sleep 1
  done
  wait "$vm_pid" 2>/dev/null || true
}

# vm_poweroff: a clean shutdown.
vm_poweroff() {
  vm_ssh 'sudo systemctl poweroff' 2>/dev/null || true
  vm_wait_off 180
}
