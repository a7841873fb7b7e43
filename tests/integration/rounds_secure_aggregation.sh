#!/usr/bin/env bash
# Secure aggregation in federated rounds on real processes (issue 39, part 2;
# server/secure_round.h): edgetrain-server --mode rounds --secure-aggregation with six workers
# over DTLS on loopback, the mlp on mnist-small. In round 0, w6 leaves after sharing its keys
# (before its masked input) and w5 right after its masked input (--test-secagg-drop-after), so
# the input step holds five acknowledged masked inputs until its deadline: the server is killed
# with SIGKILL then and restarted on the same port. It resumes the session from secagg.wal (the
# same session, the five inputs), the round closes with U3 = the five, unmasked from the four
# answers (w5's self-mask and w6's mask key reconstructed from their shares), and the model
# after it equals the round's start plus the mean of the five clipped deltas to within half a
# quantization step (secagg_round_check.py, from the files the workers write under
# --test-secagg-dump), and not the mean without w5. The server's state directory (secagg.wal
# with the masked inputs included) and its logs hold 32 bytes of no device's delta.
# With certificate identities (the default, SECAGG_IDENTITIES=certificates; the fleet's tool
# makes them, tests/integration/make_test_certificates.sh) the server runs
# --secagg-signed-keys: every device signs its keys and the survivor list, checks every
# other's, and w5 leaves right after its consistency signature instead (after its masked
# input all the same: it gives no unmasking shares), so that the consistency step closes
# without waiting for its deadline. SECAGG_IDENTITIES=psk runs the semi-honest version with
# PSK identities (a keystore), by hand: ctest runs the signed one.
# usage: [SECAGG_IDENTITIES=certificates|psk] rounds_secure_aggregation.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
here="$(dirname "$0")"
identities="${SECAGG_IDENTITIES:-certificates}"

devices=(w1 w2 w3 w4 w5 w6)
declare -A drop_after=([w5]=input [w6]=shares)
declare -A worker_auth=()
mkdir -p "$work/dump"
server_args=(--state-dir "$work/state" --model mlp --lr 0.05 --mode rounds
             --secure-aggregation --secagg-threshold 0.6 --round-clip-norm 0.5 --round-deadline 8
             --min-clients 6 --local-steps 2 --server-lr 1)
if [ "$identities" = certificates ]; then
  bash "$here/make_test_certificates.sh" "$work/certs" "${devices[@]}" >/dev/null || exit $?
  certs="$work/certs"
  server_args+=(--cert "$certs/server.crt" --cert-key "$certs/server.key" --ca "$certs/ca.crt" --secagg-signed-keys)
  for name in "${devices[@]}"; do
    worker_auth[$name]="--cert $certs/$name.crt --cert-key $certs/$name.key --ca $certs/ca.crt"
  done
  drop_after[w5]=consistency
else
  for name in "${devices[@]}"; do
    add_device "$server" "$work/keys.toml" "$name" "$work/$name.toml"
    worker_auth[$name]="--config $work/$name.toml"
  done
  server_args+=(--keystore "$work/keys.toml")
fi
start_server "$server" "$work/server-1.log" --port 0 "${server_args[@]}"
port=$server_port
for i in "${!devices[@]}"; do
  name=${devices[$i]}
  # shellcheck disable=SC2086  # the auth flags are words
  start_worker "$work/$name.log" "$work/$name.stats.json" "$worker" ${worker_auth[$name]} --mode rounds \
    --server "coaps://127.0.0.1:$port" --model mlp --data mnist-small --worker-id "$i" --workers 6 --lr 0.05 \
    --quiet --duration 60 --give-up-after 20 --test-secagg-dump "$work/dump" \
    --test-secagg-drop-after "${drop_after[$name]:-none}"
done

# The input step waits for w6 until its deadline with five masked inputs acknowledged: kill then.
wait_for_json "$server_stats" rounds.secagg_step = input 20 "$server_pid" || fail "round 0 did not reach its input step"
wait_for_json "$server_stats" rounds.secagg_step_posted -ge 5 10 "$server_pid" || fail "five masked inputs did not arrive"
[ "$(json_get "$server_stats" rounds.secagg_step)" = input ] || fail "the input step closed before the kill"
session=$(json_get "$server_stats" rounds.secagg_session)
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
echo "killed the server (SIGKILL) in secure round 0's input step with 5 masked inputs acknowledged"
# The log as the kill left it (the round's close empties it): it holds the five masked inputs.
cp "$work/state/secagg.wal" "$work/secagg-at-kill.wal"
[ "$(stat -c %s "$work/secagg-at-kill.wal")" -gt $((5 * 4 * 101770)) ] || fail "secagg.wal does not hold the five masked inputs"
left_before_kill=(w5 w6)
[ "$identities" = certificates ] && left_before_kill=(w6)  # w5 waits for U3 to sign it
for name in "${left_before_kill[@]}"; do  # left after their step: the run ended, no unmasking answered
  wait_for_json "$work/$name.stats.json" state = stopped 10 || fail "$name did not leave after its ${drop_after[$name]} step"
  [ "$(json_get "$work/$name.stats.json" rounds_trained)" = 0 ] || fail "$name finished a round"
done

start_server "$server" "$work/server-2.log" --port "$port" "${server_args[@]}"
[ "$(json_get "$server_stats" rounds.secagg_session) $(json_get "$server_stats" rounds.secagg_step) $(json_get "$server_stats" rounds.secagg_step_posted)" = "$session input 5" ] ||
  fail "the restart did not resume session $session's input step with 5 inputs: $(jq -c .rounds "$server_stats")"
wait_for_json "$server_stats" rounds.rounds_closed -ge 1 20 "$server_pid" || fail "round 0 did not close after the restart"
if [ "$identities" = certificates ]; then
  [ "$(json_get "$server_stats" rounds.secagg_signed_keys)" = true ] || fail "the server's secure rounds are not signed"
  wait_for_json "$work/w5.stats.json" state = stopped 10 || fail "w5 did not leave after its consistency signature"
  [ "$(json_get "$work/w5.stats.json" rounds_trained)" = 0 ] || fail "w5 finished a round"
  grep -q "leaving after the consistency signature" "$work/w5.log" || fail "w5 did not sign the survivor list before it left"
  ! grep -q "refused" "$work/server-1.log" "$work/server-2.log" || fail "the server refused a signed message: $(grep refused "$work"/server-*.log | head -3)"
fi
[ "$(json_get "$server_stats" rounds.secagg_last_key_holders) $(json_get "$server_stats" rounds.secagg_last_survivors) $(json_get "$server_stats" rounds.secagg_last_unmasking_senders)" = "6 5 4" ] ||
  fail "round 0 closed with (U1 U3 unmasking) = $(jq -c '.rounds | [.secagg_last_key_holders, .secagg_last_survivors, .secagg_last_unmasking_senders]' "$server_stats"), not 6 5 4"
# Round 1's model, as the four left pull it.
for _ in $(seq 100); do ls "$work"/dump/*.r1.start.f32 >/dev/null 2>&1 && break; sleep 0.1; done
python3 "$here/secagg_round_check.py" model "$work/dump" 0 1 w1 w2 w3 w4 w5 -- w5 ||
  fail "the model after the secure round is not the survivors' mean"

# Nothing of one device's delta in what the server keeps or logs, masked inputs included.
files=("$work/server-1.log" "$work/server-2.log" "$work/secagg-at-kill.wal")
while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$work/state" -type f -print0)
! python3 "$here/secagg_round_check.py" secrets "$work/dump" 0 "$work/dump/w1.r0.quantized.u32" >/dev/null 2>&1 ||
  fail "the leak check does not find a delta in the file it came from"
python3 "$here/secagg_round_check.py" secrets "$work/dump" 0 "${files[@]}" || fail "a delta leaked"
! grep -q ERROR "$work/server-1.log" "$work/server-2.log" || fail "an ERROR in the server's log"
echo "PASS ($identities$([ "$identities" = certificates ] && echo ", keys and survivor list signed")): secure round 0 survived a SIGKILL in its input step (session $session resumed with its 5 inputs), closed without w5 (after its input) and w6 (before it) answering, equals the plain mean of the 5; no delta in the server's state or logs"
