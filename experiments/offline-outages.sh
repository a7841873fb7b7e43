#!/usr/bin/env bash
# Devices reachable half of the time (issue 38 part 1): an edgetrain-server and N workers on
# loopback, each worker behind its own edgetrain-link-impairer process, whose link the
# script takes down (SIGSTOP) and up (SIGCONT) in windows of WINDOW seconds after a first
# half window with every link up: even workers down in the first window of every two, odd
# ones in the second, so each device is reachable 50% of the time and half the fleet at
# any time. Run once with
# workers that idle while away (the paper's) and once with --offline-steps; prints the
# server's accuracy against time and bytes for both (its metrics.csv) and a table.
# Not the emulator (no namespaces, no CPU quotas): the link impairer has no down windows
# yet, and the emulator's failure script does not stop links.
#
# usage: experiments/offline-outages.sh BUILD_DIR OUT_DIR [SECONDS [WINDOW [WORKERS]]]
#   extra settings through the environment: MODEL (mlp), DATA (mnist-small), SLOWDOWN (4),
#   OFFLINE_STEPS (2000), MAX_STALENESS (20000), TARGET (0.90), REQUEST_TIMEOUT (3)
set -euo pipefail
build="$1"; out="$2"; seconds="${3:-150}"; window="${4:-30}"; workers="${5:-4}"
model="${MODEL:-mlp}"; data="${DATA:-mnist-small}"; slowdown="${SLOWDOWN:-4}"
offline_steps="${OFFLINE_STEPS:-2000}"; max_staleness="${MAX_STALENESS:-20000}"
target="${TARGET:-0.90}"; request_timeout="${REQUEST_TIMEOUT:-3}"
source "$(dirname "$0")/../common/processes.sh"
trap 'stop_started_programs 2' EXIT
server="$build/programs/edgetrain-server"; worker="$build/programs/edgetrain-worker"
impairer="$build/programs/edgetrain-link-impairer"
mkdir -p "$out"

run() {  # run NAME WORKER_FLAGS...
  local name="$1"; shift
  local dir="$out/$name"
  rm -rf "$dir"; mkdir -p "$dir"
  for i in $(seq 0 $((workers - 1))); do add_device "$server" "$dir/keys.toml" "w$i" "$dir/w$i.toml"; done
  start_server "$server" "$dir/server.log" --port 0 --state-dir "$dir/state" --keystore "$dir/keys.toml" \
    --model "$model" --eval-data "$data" --eval-interval 2 --max-staleness "$max_staleness"
  local impairers=() i
  for i in $(seq 0 $((workers - 1))); do
    printf '[[link]]\nname = "w%d"\nlisten = "127.0.0.1:0"\nupstream = "127.0.0.1:%d"\n' "$i" "$server_port" >"$dir/link$i.toml"
    start_program "$dir/impairer$i.log" "$impairer" --links "$dir/link$i.toml" --port-file "$dir/link$i.json"
    impairers+=("$last_pid")
  done
  for i in $(seq 0 $((workers - 1))); do
    for _ in $(seq 100); do [ -s "$dir/link$i.json" ] && break; sleep 0.1; done
    start_worker "$dir/w$i.log" "$dir/w$i.json" "$worker" --config "$dir/w$i.toml" \
      --server "coaps://$(json_get "$dir/link$i.json" "links.w$i")" --model "$model" --data "$data" \
      --worker-id "$i" --workers "$workers" --slowdown "$slowdown" --request-timeout "$request_timeout" \
      --give-up-after 0 --duration "$seconds" --quiet "$@"
  done
  local start=$SECONDS down=() t phase
  for i in $(seq 0 $((workers - 1))); do down+=(0); done
  while [ $((SECONDS - start)) -lt "$seconds" ]; do
    t=$((SECONDS - start))
    for i in $(seq 0 $((workers - 1))); do
      # Everyone up for the first half window (each worker pulls a model), then windows of
      # WINDOW seconds: even workers down in the first of every two, odd ones in the second.
      want=0
      if [ "$t" -ge $((window / 2)) ]; then
        phase=$(( ((t - window / 2) / window) % 2 ))
        want=$(( (phase + i + 1) % 2 ))
      fi
      if [ "$want" != "${down[$i]}" ]; then
        if [ "$want" = 1 ]; then kill -STOP "${impairers[$i]}"; else kill -CONT "${impairers[$i]}"; fi
        down[$i]=$want
        echo "$t,w$i,$([ "$want" = 1 ] && echo down || echo up)" >>"$dir/links.csv"
      fi
    done
    sleep 0.5
  done
  for i in $(seq 0 $((workers - 1))); do kill -CONT "${impairers[$i]}" 2>/dev/null || true; done
  stop_started_programs 5
}

run idle
run offline --offline-steps "$offline_steps"

python3 - "$out" "$target" "$workers" <<'EOF'
import csv, json, sys
out, target, workers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
print(f"| workers | best test acc | time to {target:.0%} | socket ingress to {target:.0%} | updates | device upload (all) | device download (all) | offline steps | offline updates accepted / refused (steps lost) |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("idle", "offline"):
    rows = list(csv.DictReader(open(f"{out}/{name}/state/metrics.csv")))
    t0 = float(rows[0]["unix_time"])
    best = max(float(r["test_accuracy"]) for r in rows)
    hit = next((r for r in rows if float(r["test_accuracy"]) >= target), None)
    stats = [json.load(open(f"{out}/{name}/w{i}.json")) for i in range(workers)]
    up = sum(s["bytes_sent"] for s in stats); down = sum(s["bytes_received"] for s in stats)
    off = sum(s["offline_steps"] for s in stats)
    acc = sum(s["offline_updates_accepted"] for s in stats); ref = sum(s["offline_updates_refused"] for s in stats)
    lost = sum(s["offline_steps_refused"] for s in stats)
    tt = f"{float(hit['unix_time']) - t0:.0f} s" if hit else "not reached"
    tb = f"{int(hit['ingress_socket_bytes']) / 1e6:.2f} MB" if hit else "—"
    with open(f"{out}/{name}/curve.csv", "w") as f:
        for r in rows:
            f.write(f"{name},{float(r['unix_time']) - t0:.1f},{r['test_accuracy']},{r['ingress_socket_bytes']}\n")
    print(f"| {name} | {best:.2%} | {tt} | {tb} | {rows[-1]['version']} | {up / 1e6:.2f} MB | {down / 1e6:.2f} MB | {off} | {acc} / {ref} ({lost}) |")
EOF
