#!/usr/bin/env bash
# Compression that follows the link (issue 38 part 2; worker/README.md, "A metered or slow
# link"), as processes on loopback: edgetrain-server and three edgetrain-workers, each
# through a link of edgetrain-link-impairer, whose byte counters are the measure (not the
# workers' own reports). Checks that
#   - with --send-share, the worker behind a slow uplink (10 kB/s) lowers c to a third of its
#     --rate or less, the one behind an unlimited link raises it, and the server accepts every
#     update whatever its c (k is per tensor in the body);
#   - with --byte-budget (both directions counted), what crossed the worker's link in every
#     window of the budget's period (sampled every 0.25 s from the impairer's counters)
#     stays within the budget, the worker spends a good part of it, waits when it is
#     spent, and trains offline meanwhile (--offline-steps), its accumulated update accepted;
#   - bad budgets and the settings outside async mode are refused (status 2) with the text.
# No time is asserted: every wait is for a state the programs write, with a bound.
# usage: worker_link_adaptation.sh SERVER WORKER LINK_IMPAIRER
server="$1"; worker="$2"; impairer="$3"
source "$(dirname "$0")/process_test_lib.sh"

key=(--identity w --key-hex 00112233445566778899aabbccddeeff)
for refused in "--byte-budget 50MB" "--byte-budget 50MB/fortnight" "--byte-budget 5MB/hour --mode rounds" \
  "--byte-budget 500kB/day --model mlp" "--send-share 0.2 --compressor none" "--send-share 0.2 --min-compression-rate 0.2 --max-compression-rate 0.1"; do
  status=0
  # shellcheck disable=SC2086 # the flags split on purpose
  "$worker" $refused "${key[@]}" >"$work/refused.log" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "'$refused': status $status, not 2: $(cat "$work/refused.log")"
done
status=0; "$worker" --byte-budget 50MB "${key[@]}" >"$work/refused.log" 2>&1 || status=$?
grep -q "byte budget '50MB'" "$work/refused.log" || fail "the refusal does not name the budget: $(cat "$work/refused.log")"
echo "ok: bad budgets, one too small for the model's dense pulls, --compressor none, rates out of order and --mode rounds refused (status 2)"

require_mnist
data=$(basename "$mnist_dir")
for name in fast slow metered; do add_device "$server" "$work/keys.toml" "$name" "$work/$name.toml"; done
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model mlp --max-staleness 20000 --checkpoint-every 0

# The slow link uploads at 80 kbit/s = 10 kB/s and downloads unlimited (an asymmetric
# link: the pulls are not what is measured here); the others unlimited.
cat >"$work/links.toml" <<LINKS
[[link]]
name = "fast"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:$server_port"
[[link]]
name = "slow"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:$server_port"
bandwidth_kbps = 80
downlink_kbps = 0
[[link]]
name = "metered"
listen = "127.0.0.1:0"
upstream = "127.0.0.1:$server_port"
LINKS
start_program "$work/impairer.log" "$impairer" --links "$work/links.toml" --port-file "$work/impairer.json" \
  --stats "$work/links.csv" --stats-interval 0.25
for _ in $(seq 100); do [ -s "$work/impairer.json" ] && break; sleep 0.1; done
link() { json_get "$work/impairer.json" "links.$1" || fail "the impairer wrote no port file"; }

# mlp: 101,770 parameters, an update of ~6 kB at c = 0.01. --batch 100 --slowdown 100: steps
# of ~1.5 ms become ~150 ms, a slow board's: a send share of 0.2 allows a quarter of that
# and the pull, ~40 ms on the unlimited link, which a busy machine's loopback exchange (a
# few ms) leaves room in.
common=(--model mlp --data "$data" --workers 3 --duration 60 --request-timeout 5 --batch 100 --slowdown 100)
adaptive=(--send-share 0.2 --rate 0.03 --min-compression-rate 0.0005 --max-compression-rate 0.1)
start_worker "$work/fast.log" "$work/fast.json" "$worker" --config "$work/fast.toml" \
  --server "coaps://$(link fast)" --worker-id 0 "${common[@]}" "${adaptive[@]}"
fast_pid=$last_pid
start_worker "$work/slow.log" "$work/slow.json" "$worker" --config "$work/slow.toml" \
  --server "coaps://$(link slow)" --worker-id 1 "${common[@]}" "${adaptive[@]}"
slow_pid=$last_pid
# 1.5 MB per 8 s, both directions: the first (dense) pull is 0.47 MB on the wire, and as
# much is kept free for the next pull until a delta was seen.
budget_bytes=1500000; period=8
start_worker "$work/metered.log" "$work/metered.json" "$worker" --config "$work/metered.toml" \
  --server "coaps://$(link metered)" --worker-id 2 "${common[@]}" --rate 0.05 --byte-budget 1.5MB/8s \
  --max-compression-rate 0.05 --offline-steps 500
metered_pid=$last_pid

# The metered link's counters, both directions, every 0.25 s while the run goes on.
metered_bytes() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
           $1 == "metered" { print $col["to_server_bytes_in"] + $col["to_worker_bytes_in"] }' "$work/links.csv" 2>/dev/null
}
: >"$work/metered.samples"
sample_until=$((SECONDS + 18))
while [ "$SECONDS" -lt "$sample_until" ]; do
  b=$(metered_bytes) && [ -n "$b" ] && echo "$(date +%s.%N) $b" >>"$work/metered.samples"
  sleep 0.25
done

# Each of the slow worker's pulls takes ~1 s: every block of the answer is asked for over
# the slow uplink.
wait_for_json "$work/slow.json" updates_accepted -ge 8 5 "$slow_pid" || fail "the slow worker sent too few updates"
slow_c=$(json_get "$work/slow.json" compression_rate)
fast_c=$(json_get "$work/fast.json" compression_rate)
json_compare "$slow_c" -le 0.01 || fail "behind 10 kB/s the worker kept c = $slow_c (--rate 0.03)"
# The fast worker's c depends on how busy the machine is; it must stay well above the slow one's.
json_compare "$fast_c" -ge "$(awk -v s="$slow_c" 'BEGIN { print 4 * s }')" ||
  fail "behind an unlimited link the worker chose c = $fast_c, behind 10 kB/s c = $slow_c"
for name in fast slow; do
  [ "$(json_get "$work/$name.json" updates_rejected)" -eq 0 ] && [ "$(json_get "$work/$name.json" updates_refused)" -eq 0 ] ||
    fail "the server did not take every update of the $name worker: $(json_get "$work/$name.json" | tr '\n' ' ')"
done
echo "ok: send share 0.2: c = $slow_c behind 10 kB/s (uplink estimate $(json_get "$work/slow.json" uplink_bytes_per_second) B/s), c = $fast_c behind an unlimited link; every update accepted"

# Every window of `period` seconds between two samples carried at most the budget.
python3 - "$work/metered.samples" "$budget_bytes" "$period" <<'PY' || fail "the metered worker passed its byte budget at the link"
import sys
samples = [tuple(map(float, line.split())) for line in open(sys.argv[1]) if line.strip()]
budget, period = int(sys.argv[2]), float(sys.argv[3])
worst = 0
for i, (t0, b0) in enumerate(samples):
    for t1, b1 in samples[i + 1:]:
        if t1 - t0 > period: break
        worst = max(worst, b1 - b0)
first = max((b for t, b in samples if t - samples[0][0] <= period), default=0)
worst = max(worst, first)  # from the start: the counters began at 0
print(f"metered link: most bytes in any {period:.0f} s window {worst:.0f} of {budget} (total {samples[-1][1]:.0f} in {samples[-1][0] - samples[0][0]:.1f} s)")
sys.exit(0 if worst <= budget and worst >= budget / 2 else 1)
PY
wait_for_json "$work/metered.json" budget_waits -ge 1 5 || fail "the metered worker never waited for its budget"
wait_for_json "$work/metered.json" offline_updates_accepted -ge 1 15 "$metered_pid" ||
  fail "no offline update from the metered worker's waits: $(json_get "$work/metered.json" | tr '\n' ' ')"
echo "ok: byte budget kept at the link; $(json_get "$work/metered.json" budget_waits) waits, $(json_get "$work/metered.json" offline_steps) steps trained offline meanwhile"

kill -TERM "$fast_pid" "$slow_pid" "$metered_pid"
for name in fast slow metered; do
  pid_var="${name}_pid"
  wait_for_exit "${!pid_var}" 30 || fail "the $name worker exited with status $?"
  [ "$(json_get "$work/$name.json" state)" = stopped ] || fail "the $name worker wrote no final stats"
done
echo "link-adaptive c follows the link, and the byte budget holds at the link"
