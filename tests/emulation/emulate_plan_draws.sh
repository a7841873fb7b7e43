#!/usr/bin/env bash
# `edgetrain-emulation-report plan` draws the same link profiles and slowdowns for a seed as
# the bash splitmix64 that edgetrain-emulate used before the draws moved into the report
# program: the expected rows below were printed by that bash code (draw() of
# emulation/edgetrain-emulate up to the commit that removed it), so an experiment rerun with
# a seed gets the devices it always had. Also: the address plan, and refused profiles.
# usage: emulate_plan_draws.sh REPORT_PROGRAM
set -euo pipefail
report="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

expect_plan() {  # DESCRIPTION EXPECTED_ROWS ARGS...
  local what="$1" expected="$2"; shift 2
  local got
  got=$("$report" plan "$@" | cut -d, -f1,4-9) || fail "$what: plan failed"  # the drawn columns
  [ "$got" = "$(printf 'worker,delay_ms,jitter_ms,loss,bandwidth_kbps,slowdown,link_seed\n%s' "$expected")" ] ||
    fail "$what: draws differ from the bash ones:
$got
expected:
$expected"
  echo "ok: $what"
}

expect_plan "seed 1, 4 workers, 3 impaired, every key a range" "0,30.8634,2,0.0073866,21286.7,2.42077,100003
1,25.6885,2,0.00266251,33306.9,0.686615,100004
2,12.9517,2,0.00720545,27413.7,0.317676,100005
3,0,0,0,0,0.849759,100006" \
  --seed 1 --workers 4 --impaired 3 --link delay=5:40,jitter=2,loss=0.001:0.01,bandwidth=5000:50000 --slowdown 0:3

expect_plan "seed 42, 3 workers, 1 impaired, fixed values (emulate_small's setting)" "0,2,2,0.005,20000,200,4200126
1,0,0,0,0,200,4200127
2,0,0,0,0,200,4200128" \
  --seed 42 --workers 3 --impaired 1 --link delay=2,jitter=2,loss=0.005,bandwidth=20000 --slowdown 200

expect_plan "seed 7, 5 workers, all impaired (run-experiments.sh's heterogeneous setting)" "0,8.45124,2,0.001,14715.8,1.85778,700021
1,13.914,2,0.001,48518.9,1.62755,700022
2,3.57027,2,0.001,49908.9,0.809411,700023
3,17.939,2,0.001,28141.7,0.308035,700024
4,13.6266,2,0.001,39242.8,2.1071,700025" \
  --seed 7 --workers 5 --link delay=1:20,jitter=2,loss=0.001,bandwidth=5000:50000 --slowdown 0:3

# Single draws of the bash code for other seeds and workers (seed worker key range value).
while read -r seed worker key range value; do
  row=$("$report" plan --seed "$seed" --workers $((worker + 1)) --link "delay=$range,jitter=$range,loss=$range,bandwidth=$range" \
          --slowdown "$range" | sed -n "$((worker + 2))p")
  column=$(case "$key" in delay) echo 4 ;; jitter) echo 5 ;; loss) echo 6 ;; bandwidth) echo 7 ;; slowdown) echo 8 ;; esac)
  [ "$(cut -d, -f"$column" <<<"$row")" = "$value" ] || fail "seed $seed worker $worker $key $range: $(cut -d, -f"$column" <<<"$row"), bash drew $value"
done <<'EOF'
1 0 delay 5:40 30.8634
1 0 jitter 0:5 0.892382
1 0 loss 0.001:0.01 0.0073866
1 0 bandwidth 5000:50000 21286.7
1 0 slowdown 0:3 2.42077
1 0 delay 20 20
1 1 delay 5:40 25.6885
1 1 jitter 0:5 3.46386
1 1 loss 0.001:0.01 0.00266251
1 1 bandwidth 5000:50000 33306.9
1 1 slowdown 0:3 0.686615
1 1 delay 20 20
1 2 delay 5:40 12.9517
1 2 jitter 0:5 1.66223
1 2 loss 0.001:0.01 0.00720545
1 2 bandwidth 5000:50000 27413.7
1 2 slowdown 0:3 0.317676
1 2 delay 20 20
1 99 delay 5:40 33.6054
1 99 jitter 0:5 1.62449
1 99 loss 0.001:0.01 0.00199862
1 99 bandwidth 5000:50000 18600.1
1 99 slowdown 0:3 1.45196
1 99 delay 20 20
7 0 delay 5:40 18.726
7 0 jitter 0:5 2.88086
7 0 loss 0.001:0.01 0.00130821
7 0 bandwidth 5000:50000 14715.8
7 0 slowdown 0:3 1.85778
7 0 delay 20 20
7 1 delay 5:40 28.7889
7 1 jitter 0:5 4.89566
7 1 loss 0.001:0.01 0.00375643
7 1 bandwidth 5000:50000 48518.9
7 1 slowdown 0:3 1.62755
7 1 delay 20 20
7 2 delay 5:40 9.7347
7 2 jitter 0:5 1.79612
7 2 loss 0.001:0.01 0.00740364
7 2 bandwidth 5000:50000 49908.9
7 2 slowdown 0:3 0.809411
7 2 delay 20 20
7 99 delay 5:40 27.6049
7 99 jitter 0:5 0.547713
7 99 loss 0.001:0.01 0.00292926
7 99 bandwidth 5000:50000 30172.4
7 99 slowdown 0:3 0.315364
7 99 delay 20 20
12345 0 delay 5:40 37.4574
12345 0 jitter 0:5 3.06099
12345 0 loss 0.001:0.01 0.00406723
12345 0 bandwidth 5000:50000 14889.4
12345 0 slowdown 0:3 0.424988
12345 0 delay 20 20
12345 1 delay 5:40 19.5793
12345 1 jitter 0:5 3.42893
12345 1 loss 0.001:0.01 0.00216176
12345 1 bandwidth 5000:50000 38873.8
12345 1 slowdown 0:3 0.40049
12345 1 delay 20 20
12345 2 delay 5:40 26.0229
12345 2 jitter 0:5 0.462587
12345 2 loss 0.001:0.01 0.00575935
12345 2 bandwidth 5000:50000 17033.6
12345 2 slowdown 0:3 0.620738
12345 2 delay 20 20
12345 99 delay 5:40 14.2715
12345 99 jitter 0:5 1.54239
12345 99 loss 0.001:0.01 0.00204544
12345 99 bandwidth 5000:50000 11012.3
12345 99 slowdown 0:3 2.79949
12345 99 delay 20 20
EOF
echo "ok: single draws for seeds 1, 7, 12345 and workers 0, 1, 2, 99"

# Addresses: loopback, and a /30 per worker in 10.S.0.0/16 in namespaces.
[ "$("$report" plan --workers 2 | cut -d, -f2,3 | tail -n +2 | tr '\n' ' ')" = "127.0.0.1,127.0.0.1:0 127.0.0.1,127.0.0.1:0 " ] ||
  fail "loopback addresses"
[ "$("$report" plan --workers 65 --network netns --subnet 123 | sed -n '2p;66p' | cut -d, -f2,3 | tr '\n' ' ')" = \
  "10.123.0.2,10.123.0.1:5684 10.123.1.2,10.123.1.1:5684 " ] || fail "namespace addresses"
echo "ok: address plan"

for bad in "--link delay=fast" "--link speed=3" "--slowdown 1:x" "--workers 0"; do
  # shellcheck disable=SC2086
  if "$report" plan --workers 2 $bad >/dev/null 2>"${TMPDIR:-/tmp}/plan-refused.$$"; then fail "'$bad' was accepted"; fi
  grep -qE "link|slowdown|workers" "${TMPDIR:-/tmp}/plan-refused.$$" || fail "'$bad': no clear error"
  rm -f "${TMPDIR:-/tmp}/plan-refused.$$"
done
echo "ok: bad profiles refused"
