#!/usr/bin/env bash
# Devices reachable half of the time (issue 38 part 1): an edgetrain-server and N workers on
# loopback, each worker behind its own edgetrain-link-impairer process, whose link the
# script takes down (SIGSTOP) and up (SIGCONT) in windows of WINDOW seconds after a first
# half window with every link up: even workers down in the first window of every two, odd
# ones in the second, so each device is reachable 50% of the time and half the fleet at
# any time. Run once with
# workers that idle while away (the paper's) and once with --offline-steps; prints the
# server's accuracy against time and bytes for both (its metrics.csv) and a table.
# Not the emulator (no namespaces, no CPU quotas): written before the link impairer had down
# windows; experiments/offline-emulated.sh measures the same goal in the emulator.
#
# usage: experiments/offline-outages.sh BUILD_DIR OUT_DIR [SECONDS [WINDOW [WORKERS]]]
#   extra settings through the environment: MODEL (mlp), DATA (mnist-small), SLOWDOWN (4),
#   OFFLINE_STEPS (2000), MAX_STALENESS (20000), TARGET (0.90) or TARGETS (several, with
#   spaces), REQUEST_TIMEOUT (3); SUMMARIZE_ONLY=1 prints the table of OUT_DIR again
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

# SUMMARIZE_ONLY=1: the table again from OUT_DIR's files, without running.
if [ -z "${SUMMARIZE_ONLY:-}" ]; then
  run idle
  run offline --offline-steps "$offline_steps"
fi

# The table: per run, the server's best and final test accuracy and updates applied, the
# time (from the first evaluation) and socket ingress to each of TARGETS, what the devices
# sent and pulled (payloads, from their stats files), and their offline counters.
python3 - "$out" "$workers" ${TARGETS:-$target} <<'EOF'
import csv, json, sys
out, workers = sys.argv[1], int(sys.argv[2]); targets = [float(t) for t in sys.argv[3:]]
head = ("| workers | best test acc | final | updates | "
        + " | ".join(f"time to {t:.1%} (socket ingress)" for t in targets)
        + " | device upload + download (all devices) | offline steps | offline updates accepted / refused (steps) | steps buffered at the end |")
print(head)
print("|" + "---|" * (head.count("|") - 1))
for name in ("idle", "offline"):
    rows = list(csv.DictReader(open(f"{out}/{name}/state/metrics.csv")))
    t0 = float(rows[0]["unix_time"])
    best = max(float(r["test_accuracy"]) for r in rows)
    cells = []
    for t in targets:
        hit = next((r for r in rows if float(r["test_accuracy"]) >= t), None)
        cells.append(f"{float(hit['unix_time']) - t0:.0f} s ({int(hit['ingress_socket_bytes']) / 1e6:.1f} MB)"
                     if hit else "not reached")
    stats = [json.load(open(f"{out}/{name}/w{i}.json")) for i in range(workers)]
    total = lambda key: sum(s[key] for s in stats)
    with open(f"{out}/{name}/curve.csv", "w") as f:
        for r in rows:
            f.write(f"{name},{float(r['unix_time']) - t0:.1f},{r['test_accuracy']},{r['ingress_socket_bytes']}\n")
    print(f"| {name} | {best:.2%} | {float(rows[-1]['test_accuracy']):.2%} | {rows[-1]['version']} | "
          + " | ".join(cells)
          + f" | {total('bytes_sent') / 1e6:.1f} + {total('bytes_received') / 1e6:.1f} MB | {total('offline_steps')}"
          + f" | {total('offline_updates_accepted')} / {total('offline_updates_refused')} ({total('offline_steps_refused')})"
          + f" | {total('buffered_steps')} |")
EOF
