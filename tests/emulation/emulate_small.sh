#!/usr/bin/env bash
# The CI-sized emulation: edgetrain-emulate runs the server and 3 workers (MLP, AdaComp),
# worker 0 behind an impaired link (delay, jitter, loss, bandwidth cap), and kills the
# server with SIGKILL mid-run, restarting it 2 s later on the same state. Checks: the run
# learns (test accuracy reaches FLOOR after the restart), no acknowledged update is lost
# (exit status 0, the restart check in events.log), the restarted server accepts updates,
# the impairer dropped datagrams on the impaired link only, and the server's socket saw more
# bytes than the update payloads. The outcome comes from the run's outcome.json.
# usage: emulate_small.sh BUILD_DIR [FLOOR]
build_dir="$1"; floor="${2:-0.85}"
emulate="$(dirname "$0")/../../emulation/edgetrain-emulate"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist

status=0
# The clean workers are slowed down (--slowdown) and the staleness bound raised: with a fast
# server the two clean workers otherwise reach the floor before the impaired one's first
# update lands, or leave every one of its updates more than D versions behind.
"$emulate" --build-dir "$build_dir" --out "$work/run" --workers 3 --model mlp --data mnist-small --pull-every 8 --request-timeout 30 \
  --slowdown 200 --max-staleness 1000 --link delay=2,jitter=2,loss=0.005,bandwidth=20000 --impaired 1 --fail kill-server@12+2 \
  --duration 110 --target-accuracy "$floor" --eval-interval 1 --quiet >"$work/emulate.log" 2>&1 || status=$?
watched_logs+=("$work/emulate.log" "$work/run/logs/server-1.log" "$work/run/logs/server-2.log" "$work/run/logs/worker-0.log")
[ "$status" -eq 0 ] || fail "edgetrain-emulate exited with status $status"
cat "$work/run/events.log"

outcome="$work/run/outcome.json"
cat "$outcome"
recovered=$(expect_emulated_restarts_lost_nothing "$outcome" "the server")
[ "$(json_get "$outcome" stop)" = target ] && json_compare "$(json_get "$outcome" target_reached.accuracy)" -ge "$floor" ||
  fail "test accuracy never reached $floor"
# Learning continued after the restart: the accuracy row that met the floor comes from a
# version past the recovered one.
reached_version=$(json_get "$outcome" target_reached.version)
[ "$reached_version" -gt "$recovered" ] || fail "the floor was met at version $reached_version, not after the restart ($recovered)"

# links.csv: link, listen, delay, jitter, loss, bandwidth, then 7 counters per direction
# (in, bytes in, out, bytes out, dropped by loss, by a full queue, while down), then down_s.
awk -F, 'NR == 2 { lost = $11 + $18; relayed = $10 } END { exit !(lost > 0 && relayed > 0) }' "$work/run/links.csv" ||
  fail "the impaired link w0 dropped nothing or relayed nothing: $(sed -n 2p "$work/run/links.csv")"
awk -F, 'NR > 2 && $11 + $12 + $13 + $18 + $19 + $20 > 0 { bad = 1 } END { exit bad }' "$work/run/links.csv" ||
  fail "a clean link dropped datagrams: $(cat "$work/run/links.csv")"
awk -F, 'NR > 1 && $9 == 0 { bad = 1 } END { exit bad }' "$work/run/workers.csv" ||
  fail "a worker got no update acknowledged: $(cat "$work/run/workers.csv")"
awk -F, 'END { exit !($5 > $4 && $4 > 0) }' "$work/run/timeline.csv" ||
  fail "socket ingress not above payload ingress: $(tail -n1 "$work/run/timeline.csv")"
for f in accuracy-vs-ingress.svg accuracy-vs-time.svg summary.md; do
  [ -s "$work/run/$f" ] || fail "no $f"
done
echo "3 workers, one impaired link, a server SIGKILL: learned past $floor, no acknowledged update lost"
