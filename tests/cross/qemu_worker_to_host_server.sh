#!/usr/bin/env bash
# The aarch64 edgetrain-worker, run under qemu-aarch64, trains the MLP against the host
# build's edgetrain-server over DTLS-PSK on loopback: every step's update is accepted (2.04)
# and the server's version grows by as many. Every pull is a model delta whose digest the
# aarch64 worker reproduces, the first one too: the seeded first pull, which holds only if
# the aarch64 build initialises the model from --seed bit for bit as the x86 server does.
# usage: qemu_worker_to_host_server.sh HOST_SERVER CROSS_WORKER EMULATOR...
server="$1"; cross_worker="$2"; shift 2
[ -x "$server" ] || { echo "host server $server not built: build the host preset first" >&2; exit 1; }
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist
steps=12
# e_machine at offset 18 of the ELF header: 183 is aarch64, so QEMU really runs the worker.
[ "$(od -An -tu2 -j18 -N2 "$cross_worker" | tr -d ' ')" = 183 ] || fail "$cross_worker is not an aarch64 program"

add_device "$server" "$work/keys.toml" pi-under-qemu "$work/pi-under-qemu.toml"
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" --model mlp
echo "running: $* $cross_worker ... --steps $steps"
stats="$work/worker.stats.json"
start_worker "$work/worker.log" "$stats" "$@" "$cross_worker" --config "$work/pi-under-qemu.toml" \
  --server "coaps://127.0.0.1:$server_port" --model mlp --data mnist-small --steps "$steps" --quiet
wait_for_exit "$last_pid" 150 || fail "the aarch64 worker exited with status $?"
cat "$work/worker.log"
cat "$stats"

[ "$(json_get "$stats" state)" = stopped ] && [ "$(json_get "$stats" steps)" -eq "$steps" ] &&
  [ "$(json_get "$stats" updates_accepted)" -eq "$steps" ] || fail "not every update was accepted"
# Every pull is a model delta whose digest the aarch64 worker reproduced: the first from the
# model it built from --seed (version 0), which is the x86 server's bit for bit.
[ "$(json_get "$stats" first_pull)" = delta ] && [ "$(json_get "$stats" seeded_first_pull_fallbacks)" -eq 0 ] ||
  fail "the seeded first pull fell back to dense: the aarch64 worker's initial model is not the x86 server's"
[ "$(json_get "$stats" pulls)" -eq "$steps" ] && [ "$(json_get "$stats" delta_pulls)" -eq "$steps" ] &&
  [ "$(json_get "$stats" delta_mismatches)" -eq 0 ] || fail "the pulls were not all model deltas"
# One worker, nothing stale: its updates are versions 1..steps, in order.
[ "$(acknowledged_versions "$stats" | tr '\n' ' ')" = "$(seq -s ' ' 1 "$steps") " ] ||
  fail "acknowledged versions are not 1..$steps"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
[ "$(json_get "$server_stats" state)" = stopped ] && [ "$(json_get "$server_stats" version)" -eq "$steps" ] ||
  fail "the server did not end at version $steps"
grep -q "first request from 'pi-under-qemu'" "$work/server.log" || fail "the server did not see the device"
echo "aarch64 worker under QEMU trained against the host server: versions 1..$steps acknowledged"
