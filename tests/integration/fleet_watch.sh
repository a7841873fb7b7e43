#!/usr/bin/env bash
# Watching a fleet (server/README.md): Debian's coap-client-openssl reads /status and
# /status?device=NAME over DTLS-PSK, observes /status (RFC 7641) and receives
# notifications, curl scrapes the metrics endpoint (text format checked, 404 elsewhere,
# listening on 127.0.0.1 only, and nowhere without --metrics-listen), a silent device is
# reported after --silent-after, and a flood of refusals is collapsed in the log.
# usage: fleet_watch.sh SERVER [COAP_CLIENT]
server="$1"; client="${2:-coap-client-openssl}"
source "$(dirname "$0")/process_test_lib.sh"
for tool in "$client" curl python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (toolchains/setup-deps.sh installs it)"; exit 77; }
done

# Printable keys (coap-client takes -k as literal text), in the keystore's format (hex).
hex() { printf '%s' "$1" | od -An -tx1 | tr -d ' \n'; }
watcher_key=watcher-key-0123456789abcdef; poster_key=poster-key-0123456789abcdefg
(umask 077 && printf '[devices]\nwatcher = "%s"\nposter = "%s"\n' "$(hex "$watcher_key")" "$(hex "$poster_key")" \
  >"$work/keys.toml")

# The server without --metrics-listen listens on no TCP port.
start_server "$server" "$work/plain.log" --port 0 --state-dir "$work/plain-state" --keystore "$work/keys.toml" --model mlp
[ "$(json_get "$server_stats" metrics_port)" = null ] || fail "metrics_port is set without --metrics-listen"
if command -v ss >/dev/null && ss -Htlnp 2>/dev/null | grep -q "pid=$server_pid,"; then
  fail "the server listens on a TCP port without --metrics-listen: $(ss -Htlnp | grep "pid=$server_pid,")"
fi
kill -TERM "$server_pid"; wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"

start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" --model mlp \
  --metrics-listen 127.0.0.1:0 --observe-interval 1 --silent-after 3 --log-repeat-burst 3 --log-repeat-interval 60
uri="coaps://127.0.0.1:$server_port"
coap() {  # coap IDENTITY KEY ARGS...: one request with coap-client, its payload on stdout
  local identity="$1" key="$2"; shift 2
  timeout 30 "$client" -B 10 -v 4 -u "$identity" -k "$key" "$@"
}
post_junk() { coap poster "$poster_key" -m post -e junk "$uri/update" >/dev/null 2>&1 || true; }

# Observe: subscribe for 8 s while the poster's refused updates change the status.
timeout 40 "$client" -B 20 -v 4 -w -s 8 -u watcher -k "$watcher_key" "$uri/status" >"$work/observed.txt" \
  2>"$work/observe.log" &
observer=$!
sleep 1
for _ in $(seq 1 12); do post_junk; sleep 0.4; done
wait "$observer" || true
notifications=$(grep -c '"uptime_seconds"' "$work/observed.txt" || true)
echo "Observe: $notifications answers to one subscription (the first response and its notifications)"
[ "$notifications" -ge 3 ] || { cat "$work/observe.log" >&2; fail "fewer than two notifications ($notifications answers)"; }

# The poster is a worker with refusals; the watcher only read /status: a monitor.
coap watcher "$watcher_key" -m get "$uri/status" >"$work/status.json" 2>"$work/client.log" ||
  { cat "$work/client.log" >&2; fail "GET /status failed"; }
python3 - "$work/status.json" <<'PY' || fail "the per-device section is not as expected"
import json, sys
status = json.load(open(sys.argv[1]))
assert status["workers_seen"] == ["poster"], status["workers_seen"]
assert status["monitors"] == ["watcher"], status["monitors"]
poster = status["devices"]["poster"]
assert poster["refused"]["malformed"] >= 10, poster
assert poster["updates_accepted"] == 0 and poster["silent"] is False, poster
assert poster["request_payload_bytes"] == 4 * poster["requests"], poster
for key in ("last_seen_seconds_ago", "last_seen", "mean_staleness", "step_rate_per_second", "answer_payload_bytes"):
    assert key in poster, key
PY
coap watcher "$watcher_key" -m get "$uri/status?device=poster" >"$work/poster.json" 2>>"$work/client.log" ||
  fail "GET /status?device=poster failed"
[ "$(json_get "$work/poster.json" role)" = worker ] || fail "poster is not a worker: $(cat "$work/poster.json")"
# An unknown and a malformed name: 4.04 and 4.00 (coap-client prints the code), nothing changes.
version_before=$(json_get "$server_stats" version)
coap watcher "$watcher_key" -m get "$uri/status?device=nobody" >"$work/unknown.txt" 2>&1 || true
grep -q "4.04" "$work/unknown.txt" || fail "an unknown device did not get 4.04: $(cat "$work/unknown.txt")"
coap watcher "$watcher_key" -m get "$uri/status?device=bad%20name" >"$work/bad.txt" 2>&1 || true
grep -q "4.00" "$work/bad.txt" || fail "a malformed device name did not get 4.00: $(cat "$work/bad.txt")"
[ "$(json_get "$server_stats" version)" = "$version_before" ] || fail "a monitoring request changed the version"

# Metrics over plain HTTP, on 127.0.0.1 only.
wait_for_json "$server_stats" metrics_port -gt 0 10 "$server_pid" || fail "no metrics_port in the stats file"
metrics_port=$(json_get "$server_stats" metrics_port)
sleep 1.2  # the exposition is refreshed every second
curl -fsS "http://127.0.0.1:$metrics_port/metrics" -D "$work/headers.txt" -o "$work/metrics.txt" || fail "curl /metrics failed"
grep -qi '^content-type: text/plain; version=0.0.4' "$work/headers.txt" || fail "wrong content type: $(cat "$work/headers.txt")"
python3 - "$work/metrics.txt" <<'PY' || fail "the metrics are not in the text exposition format"
import re, sys
sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\\n])*",?)*\})? (-?[0-9.eE+-]+|NaN|[+-]Inf)$')
typed, values = set(), {}
for line in open(sys.argv[1]).read().splitlines():
    if line.startswith("# TYPE "):
        name, kind = line.split()[2:4]
        assert kind in ("counter", "gauge"), line
        typed.add(name)
        continue
    if line.startswith("# HELP "):
        continue
    m = sample.match(line)
    assert m, "not a sample line: %r" % line
    assert m.group(1) in typed, "sample before its TYPE: %r" % line
    values[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
assert values["edgetrain_model_version"] == 0, values
assert values['edgetrain_updates_refused_total{reason="malformed"}'] >= 10, values
assert values['edgetrain_device_updates_refused_total{device="poster",reason="malformed"}'] >= 10, values
assert values['edgetrain_device_updates_accepted_total{device="poster"}'] == 0, values
assert values["edgetrain_workers"] == 1, values
assert values["edgetrain_ingress_socket_bytes_total"] > values["edgetrain_ingress_payload_bytes_total"] > 0, values
PY
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$metrics_port/status")
[ "$code" = 404 ] || fail "GET /status over HTTP gave $code, not 404"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$metrics_port/metrics")
[ "$code" = 405 ] || fail "POST /metrics gave $code, not 405"
if command -v ss >/dev/null; then
  listening=$(ss -Htln "sport = :$metrics_port" | awk '{print $4}')
  [ "$listening" = "127.0.0.1:$metrics_port" ] || fail "the metrics endpoint listens on '$listening'"
fi

# Silent after --silent-after 3 s without a request from the poster.
sleep 3.5
coap watcher "$watcher_key" -m get "$uri/status?device=poster" >"$work/poster.json" 2>>"$work/client.log" ||
  fail "GET /status?device=poster failed"
[ "$(json_get "$work/poster.json" silent)" = true ] || fail "the poster is not reported silent: $(cat "$work/poster.json")"
wait_for_json "$server_stats" devices_silent -eq 1 5 "$server_pid" || fail "the stats file does not count the silent device"
[ "$(json_get "$server_stats" devices.poster.silent)" = true ] || fail "the stats file does not show the poster silent"

kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"
# 12 refusals within one 60 s interval, 3 shown: the burst, and one counted line at exit.
refusal_lines=$(grep -c "refused an update from 'poster'" "$work/server.log" || true)
summaries=$(grep -c "(9 more in the last" "$work/server.log" || true)
echo "log: $refusal_lines refusal lines for 12 refused updates, $summaries of them counted"
[ "$summaries" = 1 ] || fail "no line counting the 9 collapsed refusals"
[ "$refusal_lines" = 4 ] || fail "repeated refusals were not collapsed to 3 + 1 lines ($refusal_lines lines)"
echo "fleet watching: Observe, per-device status, metrics, silent devices and collapsed logs work"
