#!/usr/bin/env bash
# Start-up validation (issue 12, part 5): every bad setting, data path or file ends
# edgetrain-server with exit status 2 and a message naming it, before the state directory is
# created and before the port is bound (no state directory, no port file); and the packaged
# server.toml starts on a machine without the data sets (EDGETRAIN_DEPS pointing at an empty
# directory): evaluation off, said in the log.
# usage: startup_validation.sh SERVER
server="$1"
source "$(dirname "$0")/process_test_lib.sh"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
keys="$work/keys.toml"
add_device "$server" "$keys" pi-1 "$work/pi-1.toml"

# refused NAME PATTERN ARGS...: the server with ARGS exits 2 with PATTERN in its message,
# leaving neither $work/NAME-state nor $work/NAME.port behind.
refused() {
  local name="$1" pattern="$2" status=0; shift 2
  timeout 30 "$server" --listen 127.0.0.1 --port 0 --state-dir "$work/$name-state" --port-file "$work/$name.port" \
    "$@" >"$work/$name.log" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "$name: exit status $status, not 2: $(cat "$work/$name.log")"
  grep -qE -- "$pattern" "$work/$name.log" || fail "$name: no '$pattern' in: $(cat "$work/$name.log")"
  [ ! -e "$work/$name-state" ] || fail "$name: the state directory was created"
  [ ! -e "$work/$name.port" ] || fail "$name: the port file was written (the socket was opened)"
  echo "ok: $name: exit 2, nothing created: $(grep -m1 -oE 'error: .{0,110}' "$work/$name.log")"
}

mkdir -p "$work/bad-data"
head -c 100 /dev/zero >"$work/bad-data/t10k-images-idx3-ubyte"
head -c 100 /dev/zero >"$work/bad-data/t10k-labels-idx1-ubyte"
refused missing-data "eval-data $work/no-such-dir.*not there" --keystore "$keys" --eval-data "$work/no-such-dir"
refused bad-data-file "eval-data $work/bad-data: .*t10k-" --keystore "$keys" --eval-data "$work/bad-data"
refused no-keystore "keystore: no keystore at" --keystore "$work/missing.toml"
cp "$keys" "$work/open-keys.toml" && chmod 644 "$work/open-keys.toml"
refused open-keystore "mode 0644" --keystore "$work/open-keys.toml"
refused bad-model "--model: " --keystore "$keys" --model "resnet"
refused missing-cert "--cert .*no readable file" --cert "$work/none.pem" --cert-key "$work/none.key" --ca "$work/none.ca"
refused accuracy-without-data "stop-at-accuracy needs evaluation" --keystore "$keys" --stop-at-accuracy 0.9
refused stats-dir "stats-file .*not a directory" --keystore "$keys" --stats-file "$work/no-such-dir/stats.json"
refused init-from-missing "init-from: no checkpoint file" --keystore "$keys" --init-from "$work/none.safetensors"
# --shard I/N (a sharded server): malformed, more shards than parameters, and the modes and
# settings a shard cannot serve.
refused shard-malformed "--shard 3/3: give I/N" --keystore "$keys" --model mlp --shard 3/3
refused shard-too-many "--shard 0/2000000: .*at most one shard per parameter" --keystore "$keys" --model mlp --shard 0/2000000
refused shard-rounds "--shard works with --mode async only" --keystore "$keys" --model mlp --shard 0/2 --mode rounds
refused subset-without-secure "--secagg-subset needs --mode rounds --secure-aggregation" --keystore "$keys" --model mlp --mode rounds \
  --secagg-subset 0.1
refused signed-keys-without-ca "--secagg-signed-keys needs --mode rounds --secure-aggregation and --ca" --keystore "$keys" \
  --model mlp --mode rounds --secure-aggregation --round-clip-norm 1 --secagg-signed-keys
refused neighbours-without-secure "--secagg-neighbours needs --mode rounds --secure-aggregation" --keystore "$keys" \
  --model mlp --mode rounds --secagg-neighbours 4
refused neighbours-odd "--secagg-neighbours 5: an even number" --keystore "$keys" --model mlp --mode rounds \
  --secure-aggregation --round-clip-norm 1 --secagg-neighbours 5
refused signed-neighbours "--secagg-signed-keys with --secagg-neighbours is not built yet" --keystore "$keys" \
  --model mlp --mode rounds --secure-aggregation --round-clip-norm 1 --secagg-signed-keys --ca "$work/ca.crt" --cert "$work/server.crt" --cert-key "$work/server.key" \
  --secagg-neighbours 4
refused shard-eval "--shard: a shard holds part of the model and cannot evaluate it" --keystore "$keys" --model mlp \
  --shard 0/2 --eval-data mnist
# The cheap pull (--pull-fraction) in what it cannot serve: other modes, with the published
# model.
refused cheap-pull-rounds "--pull-fraction \\(the cheap pull\\) works with --mode async only" --keystore "$keys" \
  --model mlp --mode rounds --pull-fraction 0.01
refused cheap-pull-published "--pull-fraction and --publish-every are two ways" --keystore "$keys" --model mlp \
  --pull-fraction 0.01 --publish-every 10
refused cheap-pull-bound-alone "--pull-max-devices is a setting of the cheap pull" --keystore "$keys" \
  --pull-max-devices 5
refused entry-staleness-alone "--entry-staleness is a setting of the cheap pull" --keystore "$keys" \
  --entry-staleness
# The learning-rate schedule: only where the staleness-aware store applies updates, with
# milestones that make sense, and its factor not alone.
refused lr-decay-rounds "--lr-decay-at works with --mode async only" --keystore "$keys" --model mlp \
  --mode rounds --lr-decay-at 100
refused lr-decay-order "--lr-decay-at '100,50': .*not strictly increasing" --keystore "$keys" --lr-decay-at 100,50
refused lr-decay-factor-alone "--lr-decay-factor needs --lr-decay-at" --keystore "$keys" --lr-decay-factor 0.5
# A state directory that cannot be created (a file stands where its parent should be).
touch "$work/file-in-the-way"
status=0
"$server" --listen 127.0.0.1 --port 0 --state-dir "$work/file-in-the-way/state" --keystore "$keys" \
  >"$work/state-dir.log" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "state-dir .*cannot be created" "$work/state-dir.log" ||
  fail "an impossible state directory: exit status $status: $(cat "$work/state-dir.log")"
echo "ok: state-dir-under-file: exit 2: $(grep -m1 -oE 'error: .{0,110}' "$work/state-dir.log")"

# A state directory of another model's run: refused before recovery touches it.
"$server" --listen 127.0.0.1 --port 0 --state-dir "$work/mlp-state" --keystore "$keys" --model mlp \
  --stop-after-seconds 0.1 >"$work/mlp-state.log" 2>&1 || fail "a short mlp run failed: $(cat "$work/mlp-state.log")"
before=$(cd "$work/mlp-state" && ls -l --time-style=full-iso | md5sum)
status=0
"$server" --listen 127.0.0.1 --port 0 --state-dir "$work/mlp-state" --keystore "$keys" --model paper-cnn \
  >"$work/other-model.log" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "holds a run of another model ('mlp')" "$work/other-model.log" ||
  fail "another model's state directory: exit status $status: $(cat "$work/other-model.log")"
[ "$(cd "$work/mlp-state" && ls -l --time-style=full-iso | md5sum)" = "$before" ] || fail "the state directory changed"
echo "ok: another model's state directory: exit 2, untouched: $(grep -m1 -oE 'error: .{0,110}' "$work/other-model.log")"

# The same state directory with another learning rate, staleness bound or learning-rate
# schedule (kept in the WAL header): its log cannot be replayed with them, so it is refused
# here too, before the keystore and data are read.
for changed in "--lr 0.2" "--max-staleness 7" "--lr-decay-at 100"; do
  status=0
  # shellcheck disable=SC2086  # $changed is a flag and its value
  rm -f "$work/changed-setting.port"
  "$server" --listen 127.0.0.1 --port 0 --port-file "$work/changed-setting.port" --state-dir "$work/mlp-state" \
    --keystore "$keys" --model mlp $changed >"$work/changed-setting.log" 2>&1 || status=$?
  [ "$status" -eq 2 ] && grep -q "was trained with ${changed%% *} " "$work/changed-setting.log" ||
    fail "$changed on an existing state directory: exit status $status: $(cat "$work/changed-setting.log")"
  [ "$(cd "$work/mlp-state" && ls -l --time-style=full-iso | md5sum)" = "$before" ] || fail "$changed: the state directory changed"
  [ ! -e "$work/changed-setting.port" ] || fail "$changed: the server listened (wrote its port file) before refusing"
  echo "ok: $changed on an existing state directory: exit 2, untouched: $(grep -m1 -oE 'error: .{0,140}' "$work/changed-setting.log")"
done

# ---- the packaged configuration on a machine without data -------------------------------
mkdir "$work/empty-deps"
EDGETRAIN_DEPS="$work/empty-deps" start_server "$server" "$work/packaged.log" \
  --config "$repo/boards/packaging/server.toml" --port 0 --state-dir "$work/packaged-state" --keystore "$keys"
grep -q "evaluation off: the test set of --eval-data mnist is not there" "$work/packaged.log" ||
  fail "the packaged server did not say that evaluation is off"
[ "$(json_get "$server_stats" last_evaluation)" = null ] || fail "an evaluation ran without data"
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the packaged server exited with status $?"
echo "ok: the packaged server.toml starts without the data sets (evaluation off, said in the log) and stops with 0"

# eval_data_optional does not hide damaged data: present but bad is still refused.
refused optional-bad-data "eval-data $work/bad-data: " --keystore "$keys" --eval-data "$work/bad-data" --eval-data-optional
