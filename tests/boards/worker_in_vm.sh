#!/usr/bin/env bash
# System test of a board's worker package in a real operating system: Debian bookworm arm64
# (boards/vm-image.sh) booted under qemu-system-aarch64 with the board's CPU and memory,
# set up exactly the two ways boards/README.md tells a user, against the host tree's
# edgetrain-server on 127.0.0.1 (the guest reaches it as 10.0.2.2).
#
#   1. "Without a card reader": the .deb copied in, `sudo apt install ./…deb` (apt fetches the
#      libraries from the Debian mirror), identity/server/shard set in worker.toml, the key
#      written with `install -m 0600`, the data copied, `systemctl start`. Checks: the unit runs
#      as edgetrain with its hardening; the key arrives as a credential that no other user can
#      read; updates are acknowledged (the server's version grows); `systemctl restart` and a
#      server restart recover; the cgroup's MemoryMax= is the board's and holds (memory.peak,
#      VmHWM recorded); `dpkg --purge` leaves no file behind.
#   2. The SD card: boards/provision-sd.sh writes a fresh card's boot partition (a FAT image),
#      the first boot runs the hook from cmdline.txt and reboots, the next boot trains.
#
# usage: worker_in_vm.sh BOARD_TREE HOST_SERVER   (e.g. build/rpi4 build/host/edgetrain-server)
# Figures (boot times, memory) are printed as "figure:" lines and written to
# $EDGETRAIN_VM_FIGURES (JSON) when set. Times under TCG emulation are not board speeds.
tree="$1" server="$2"
source "$(dirname "$0")/package_lib.sh"
source "$(dirname "$0")/vm_lib.sh"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$here/../.."
test_started=$SECONDS
deps="${EDGETRAIN_DEPS:-/var/cache/edgetrain}"
vm_dir=$(bash "$repo/boards/vm-image.sh" --print-dir)

for tool in qemu-system-aarch64 qemu-img mkfs.vfat mcopy ssh scp ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool missing (toolchains/setup-deps.sh --only board-vm)"; exit 77; }
done
[ -f "$vm_dir/rootfs.img" ] || fail "no board image in $vm_dir: run boards/vm-image.sh (or ./build.sh board-test)"
[ -x "$server" ] || fail "host server $server not built"
# The training data provision-sd.sh puts on a card by default (full MNIST), both ways.
data="$deps/mnist-full"
[ -f "$data/train-images-idx3-ubyte" ] && [ -f "$data/train-labels-idx1-ubyte" ] ||
  fail "no MNIST in $data (toolchains/setup-deps.sh)"

make_package "$tree"
board=$(field "$deb" Package); board=${board#edgetrain-worker-}
vm_board_cpu "$board" >/dev/null || fail "no VM settings for board '$board'"
dpkg-deb -x "$deb" "$work/pkgroot"
memory_max=$(sed -n 's/^MemoryMax=//p' "$work/pkgroot/lib/systemd/system/edgetrain-worker.service")
memory_max_bytes=$(numfmt --from=iec "$memory_max")
echo "board $board: -cpu $(vm_board_cpu "$board"), $(vm_board_memory "$board") MiB; MemoryMax=$memory_max"

figures="{}"
figure() { # figure KEY VALUE [UNIT TEXT]
  echo "figure: $1 = $2${3:+ $3}"
  figures=$(jq -c --arg k "$1" --argjson v "$2" '. + {($k): $v}' <<< "$figures")
}
phase() { echo "== $* ($((SECONDS - test_started)) s)"; }

# ---- the server (README step 2's role; here the host tree's program on loopback) --------
state="$work/state" keys="$work/keys.toml"
# The keystore as the server package's postinst makes it; devices are added while it runs.
"$server" add-device bootstrap --keystore "$keys" > /dev/null || fail "add-device failed"
start_server "$server" "$work/server.log" --port 0 --state-dir "$state" --keystore "$keys" --model paper-cnn
port=$server_port
server_version() { json_get "$server_stats" version; }
# wait_for_updates N SECONDS: the server's version grows by N (from this call on).
wait_for_updates() {
  local target=$(( $(server_version) + $1 ))
  wait_for_json "$server_stats" version -ge "$target" "$2" "$server_pid" ||
    fail "the server's version did not reach $target within $2 s (now $(server_version))"
}
add_board() { # add_board NAME: README step 4, the server's address as the board sees it
  "$server" add-device "$1" --keystore "$keys" --server-uri "coaps://10.0.2.2:$port" > "$work/$1.toml" ||
    fail "add-device $1 failed"
}
toml_value() { sed -nE "s/^$1 = '([^']*)'$/\1/p" "$2"; }

# ---- checks shared by both ways ------------------------------------------------------------
# check_service: runs as edgetrain with its hardening; the key is a credential only it reads.
check_service() {
  vm_ssh 'pid=$(systemctl show -p MainPID --value edgetrain-worker)
    echo "active=$(systemctl is-active edgetrain-worker)"
    echo "user=$(stat -c %U "/proc/$pid")"
    sudo grep -E "^(NoNewPrivs|CapEff|CapBnd|Seccomp):" "/proc/$pid/status" | tr -d "\t " | tr : =
    echo "own_mount_ns=$([ "$(sudo readlink "/proc/$pid/ns/mnt")" != "$(sudo readlink /proc/1/ns/mnt)" ] && echo yes || echo no)"
    echo "psk=$(sudo stat -c "%U:%a" /etc/edgetrain/worker.psk)"
    echo "credential=$(sudo stat -c "%U:%a" /run/credentials/edgetrain-worker.service/worker.psk)"
    echo "credential_group_other=$(sudo stat -c "%a" /run/credentials/edgetrain-worker.service/worker.psk | cut -c2-)"
    echo "pi_reads_psk=$(cat /etc/edgetrain/worker.psk >/dev/null 2>&1 && echo yes || echo no)"
    echo "pi_reads_credential=$(cat /run/credentials/edgetrain-worker.service/worker.psk >/dev/null 2>&1 && echo yes || echo no)"
    echo "nobody_reads_credential=$(sudo -u nobody cat /run/credentials/edgetrain-worker.service/worker.psk >/dev/null 2>&1 && echo yes || echo no)"
    echo "exposure=$(sudo systemd-analyze security edgetrain-worker.service 2>/dev/null | sed -n "s/.*Overall exposure level for edgetrain-worker.service: \([0-9.]*\).*/\1/p")"' \
    > "$work/service.txt" || fail "ssh to the board failed"
  cat "$work/service.txt"
  local expect
  for expect in active=active user=edgetrain NoNewPrivs=1 CapEff=0000000000000000 CapBnd=0000000000000000 \
      Seccomp=2 own_mount_ns=yes psk=root:600 credential_group_other=00 pi_reads_psk=no pi_reads_credential=no \
      nobody_reads_credential=no; do
    grep -qx "$expect" "$work/service.txt" || fail "on the board: expected $expect"
  done
  awk -F= '$1 == "exposure" { exit !($2 != "" && $2 <= 2.0) }' "$work/service.txt" || fail "systemd-analyze security exposure above 2.0"
}
# memory_figures PREFIX: the cgroup's MemoryMax= is the board's, nothing was OOM-killed;
# records memory.peak and the process's VmHWM.
memory_figures() {
  vm_ssh 'cg=/sys/fs/cgroup$(systemctl show -p ControlGroup --value edgetrain-worker)
    pid=$(systemctl show -p MainPID --value edgetrain-worker)
    echo "max=$(cat "$cg/memory.max")"; echo "peak=$(cat "$cg/memory.peak")"
    echo "oom_kill=$(sed -n "s/^oom_kill //p" "$cg/memory.events")"
    echo "hwm_kib=$(sudo sed -n "s/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$pid/status")"' > "$work/memory.txt" ||
    fail "ssh to the board failed"
  cat "$work/memory.txt"
  grep -qx "max=$memory_max_bytes" "$work/memory.txt" || fail "the cgroup's memory.max is not MemoryMax=$memory_max"
  grep -qx "oom_kill=0" "$work/memory.txt" || fail "the worker was OOM-killed inside MemoryMax=$memory_max"
  local peak hwm
  peak=$(sed -n 's/^peak=//p' "$work/memory.txt") hwm=$(sed -n 's/^hwm_kib=//p' "$work/memory.txt")
  [ -n "$peak" ] && [ "$peak" -gt 0 ] && [ "$peak" -le "$memory_max_bytes" ] || fail "memory.peak '$peak' not within MemoryMax"
  [ -n "$hwm" ] && [ "$hwm" -gt 0 ] || fail "no VmHWM of the worker process"
  figure "$1_cgroup_memory_peak_mib" "$(awk -v b="$peak" 'BEGIN { printf "%.1f", b / 1048576 }')" MiB
  figure "$1_worker_vmhwm_mib" "$(awk -v k="$hwm" 'BEGIN { printf "%.1f", k / 1024 }')" MiB
}
c_sort() { LC_ALL=C sort -u; }
main_pid() { vm_ssh 'systemctl show -p MainPID --value edgetrain-worker'; }

# Every file outside the volatile trees, for the purge check.
file_list='sudo find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp -o -path /var/tmp \
  -o -path /var/log -o -path /var/cache -o -path /var/lib/apt -o -path /var/lib/dpkg -o -path /home \
  -o -path /var/lib/systemd/timers -o -path /var/lib/systemd/random-seed -o -path /var/lib/systemd/catalog \) -prune -o -print'

# ==== 1. apt install on a running board (boards/README.md, "Without a card reader") ========
phase "1: a freshly flashed board, packages installed by hand"
add_board pi-01
vm_new_disk apt
vm_bootfs_dir "$work/bootfs-apt"; vm_bootfs_image "$work/bootfs-apt" "$work/bootfs-apt.img"
boot_started=$SECONDS
vm_boot "$board" "$work/apt.qcow2" "$work/bootfs-apt.img" "$work/console-apt.log"
vm_wait_ssh 900
figure apt_boot_to_ssh_s $((SECONDS - boot_started)) s
vm_ssh "$file_list" | c_sort > "$work/files-before" || fail "listing the board's files failed"
vm_ssh "dpkg-query -W -f '\${Package}\n'" | c_sort > "$work/packages-before"
cp "$data"/train-images-idx3-ubyte "$data"/train-labels-idx1-ubyte "$work/"
vm_copy "$deb" "$work/train-images-idx3-ubyte" "$work/train-labels-idx1-ubyte"
identity=$(toml_value identity "$work/pi-01.toml") key_hex=$(toml_value key_hex "$work/pi-01.toml")
uri=$(toml_value server "$work/pi-01.toml")
install_started=$SECONDS
vm_ssh "sudo apt update && sudo DEBIAN_FRONTEND=noninteractive apt install -y ./$(basename "$deb")" \
  > "$work/apt-install.log" 2>&1 || { tail -n 20 "$work/apt-install.log"; fail "apt install of $(basename "$deb") on the board failed"; }
figure apt_install_s $((SECONDS - install_started)) s
vm_ssh "systemctl is-enabled edgetrain-worker; systemctl is-active edgetrain-worker" > "$work/state-after-install" || true
grep -qx enabled "$work/state-after-install" || fail "the postinst did not enable edgetrain-worker.service"
grep -qx inactive "$work/state-after-install" || fail "the worker runs before it has a key"
vm_ssh "sudo sed -i -e 's|^identity = .*|identity = \"$identity\"|' -e 's|^server = .*|server = \"$uri\"|' \
          -e 's|^worker_id = .*|worker_id = 0|' -e 's|^workers = .*|workers = 2|' /etc/edgetrain/worker.toml &&
        sudo install -m 0600 /dev/stdin /etc/edgetrain/worker.psk <<< $key_hex &&
        sudo install -d /var/lib/edgetrain/data && sudo cp train-images-idx3-ubyte train-labels-idx1-ubyte /var/lib/edgetrain/data/ &&
        rm train-images-idx3-ubyte train-labels-idx1-ubyte && sudo systemctl start edgetrain-worker" ||
  fail "configuring and starting the worker on the board failed"
start_time=$SECONDS
wait_for_updates 1 600
figure apt_start_to_first_update_s $((SECONDS - start_time)) s
wait_for_updates 3 300
check_service

phase "1: systemctl restart"
pid_before=$(main_pid)
vm_ssh 'sudo systemctl restart edgetrain-worker' || fail "systemctl restart failed"
[ "$(main_pid)" != "$pid_before" ] && [ "$(main_pid)" != 0 ] || fail "systemctl restart did not start a new worker"
wait_for_updates 2 600

phase "1: server restart"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 60 || fail "the server exited with status $?"
version_at_stop=$(server_version)
start_server "$server" "$work/server.log" --port "$port" --state-dir "$state" --keystore "$keys" --model paper-cnn
[ "$(server_version)" = "$version_at_stop" ] || fail "the server did not recover its version $version_at_stop"
wait_for_updates 2 600
[ "$(main_pid)" != 0 ] || fail "the worker is not running after the server restart"
memory_figures apt

phase "1: dpkg --purge"
vm_ssh "sudo dpkg --purge edgetrain-worker-$board" > "$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "dpkg --purge failed"; }
vm_ssh "dpkg-query -W -f '\${Package}\n'" | c_sort > "$work/packages-after"
# The libraries apt installed for the worker stay (apt autoremove's business); their files
# are not the worker package's leftovers.
vm_ssh "for p in $(LC_ALL=C comm -13 "$work/packages-before" "$work/packages-after" | tr '\n' ' '); do dpkg -L \$p; done" |
  c_sort > "$work/dependency-files"
vm_ssh "$file_list" | c_sort > "$work/files-after"
LC_ALL=C comm -13 "$work/files-before" "$work/files-after" | LC_ALL=C comm -23 - "$work/dependency-files" > "$work/left-behind"
[ ! -s "$work/left-behind" ] || fail "dpkg --purge left behind: $(tr '\n' ' ' < "$work/left-behind")"
vm_ssh 'systemctl list-unit-files edgetrain-worker.service | grep -q edgetrain' && fail "the unit is still known to systemd"
echo "dpkg --purge left no file behind"
vm_poweroff

# ==== 2. the SD card (boards/README.md, "SD-card provisioning") ==============================
phase "2: a fresh card provisioned with provision-sd.sh"
add_board pi-02
vm_new_disk sd
vm_bootfs_dir "$work/bootfs-sd"
bash "$repo/boards/provision-sd.sh" --boot "$work/bootfs-sd" --package "$deb" \
  --worker-config "$work/pi-02.toml" --worker-id 1 --workers 2 || fail "provision-sd.sh failed"
vm_bootfs_image "$work/bootfs-sd" "$work/bootfs-sd.img"
power_on=$SECONDS
vm_boot "$board" "$work/sd.qcow2" "$work/bootfs-sd.img" "$work/console-sd-1.log"
vm_wait_off 900   # the hook runs, then systemd.run_success_action=reboot
figure sd_first_boot_s $((SECONDS - power_on)) s
vm_bootfs_read "$work/bootfs-sd.img" "$work/card"
cat "$work/card/edgetrain/firstboot.log"
grep -q '^done: ' "$work/card/edgetrain/firstboot.log" || fail "the first-boot hook did not finish"
[ ! -e "$work/card/edgetrain/worker.psk" ] && [ ! -e "$work/card/edgetrain/firstboot.sh" ] ||
  fail "the key or the hook is still on the boot partition"
grep -q systemd.run "$work/card/cmdline.txt" && fail "cmdline.txt still starts the hook"
cmp -s "$work/card/cmdline.txt" "$work/card/cmdline.txt.orig-edgetrain" || fail "cmdline.txt is not as it was before provisioning"
version_before=$(server_version)
boot_started=$SECONDS
vm_boot "$board" "$work/sd.qcow2" "$work/bootfs-sd.img" "$work/console-sd-2.log"
wait_for_updates 1 900
figure sd_boot_to_first_update_s $((SECONDS - boot_started)) s
figure sd_power_on_to_first_update_s $((SECONDS - power_on)) s
vm_wait_ssh 600
wait_for_updates 3 300
check_service
memory_figures sd
vm_poweroff
[ "$(server_version)" -gt "$version_before" ] || fail "no update from the provisioned board"

kill -TERM "$server_pid"
wait_for_exit "$server_pid" 60 || fail "the server exited with status $?"
figure total_test_s $((SECONDS - test_started)) s
[ -z "${EDGETRAIN_VM_FIGURES:-}" ] || jq --arg board "$board" '. + {board: $board}' <<< "$figures" > "$EDGETRAIN_VM_FIGURES"
echo "worker_in_vm $board: both ways installed, trained, restarted, purged (times under TCG emulation are not board speeds)"
