#!/usr/bin/env bash
# The user's own data end to end (model/README.md, "Your own data"): NumPy writes a data set of
# three Gaussian blobs of 8x8x1 (tests/support/make_user_data.py) as a deflated and a stored
# .npz, as uint8 .npy files and as CSV, each with its edgetrain-data.toml, and
# - edgetrain-sim trains an MLP on each, i.i.d. and label-skewed, to a test accuracy well above
#   chance (1/3);
# - edgetrain-server (evaluating on the .npz's test split) and two edgetrain-workers (each
#   loading its shard of the deflated or the stored .npz) train the MLP over DTLS to a test
#   accuracy above FLOOR;
# - a data set with a label out of range ends the worker with status 1 and a message naming
#   the file and the label, before it talks to any server; so does a model with fewer outputs
#   than the data's classes.
# usage: user_data.sh SIM SERVER WORKER [FLOOR]
sim="$1"; server="$2"; worker="$3"; floor="${4:-0.75}"
source "$(dirname "$0")/process_test_lib.sh"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  [ -z "${CI:-}" ] || fail "no python3-numpy for /usr/bin/python3 under CI (toolchains/setup-deps.sh installs it)"
  echo "SKIP: no python3-numpy for /usr/bin/python3 (toolchains/setup-deps.sh installs it)"
  exit 77
fi
model="input 8x8x1; fc 32 relu; fc 3"
for format in npz npz-stored npy-uint8 csv; do
  /usr/bin/python3 "$repo/tests/support/make_user_data.py" "$work/$format" --format "$format" ||
    fail "make_user_data.py --format $format failed"
done

# ---- the simulator, on every format --------------------------------------------------------
for format in npz npz-stored npy-uint8 csv; do
  for skew in "" --label-skew; do
    out="$work/sim-$format$skew"
    "$sim" --data "$work/$format" --model "$model" --workers 4 --updates 400 --eval-every 400 --seed 3 \
      $skew --quiet --out "$out" >"$out.log" 2>&1 || fail "edgetrain-sim on $format $skew: $(tail -3 "$out.log")"
    for run in 0 1; do
      accuracy=$(json_get "$out/summary.json" "runs.$run.final_accuracy")
      json_compare "$accuracy" -gt "$floor" ||
        fail "edgetrain-sim on $format $skew, $(json_get "$out/summary.json" "runs.$run.label"): test accuracy $accuracy, not above $floor"
    done
    echo "ok: edgetrain-sim on $format ${skew:-i.i.d.}: test accuracy $(json_get "$out/summary.json" runs.0.final_accuracy) (ASGD), $accuracy (AdaComp)"
  done
done

# ---- a server and two workers, on the .npz ---------------------------------------------
for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model "$model" --eval-data "$work/npz" --eval-interval 1
# The same arrays (one seed), deflated for worker 0 (its rows inflated into memory) and stored
# for worker 1 (its rows read in place, a pread each).
worker_data=(npz npz-stored)
worker_pids=()
for i in 0 1; do
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "$worker" --config "$work/w$i.toml" \
    --server "coaps://127.0.0.1:$server_port" --model "$model" --data "$work/${worker_data[$i]}" --worker-id "$i" --workers 2 \
    --duration 25
  worker_pids+=("$last_pid")
done
wait_for_json "$server_stats" last_evaluation.accuracy -gt "$floor" 20 "$server_pid" ||
  fail "no test accuracy above $floor within 20 s (latest: $(json_get "$server_stats" last_evaluation || true))"
echo "ok: server + 2 workers on the .npz: $(json_get "$server_stats" last_evaluation | tr '\n' ' ')"
for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
for i in 0 1; do
  wait_for_exit "${worker_pids[$i]}" 30 || fail "worker $i exited with status $?"
  [ "$(json_get "$work/w$i.stats.json" updates_accepted)" -gt 0 ] || fail "worker $i got no update accepted"
done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"

# ---- a label out of range: a clean refusal naming the file ---------------------------------
cp -r "$work/csv" "$work/bad"
sed -i '5s/^[0-9]*,/7,/' "$work/bad/train.csv"
status=0
"$worker" --server coaps://127.0.0.1:9 --model "$model" --data "$work/bad" --identity w0 --key-hex 00112233 --quiet \
  >"$work/bad.log" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "bad/train.csv: line 5: label 7 is not in \[0, 3)" "$work/bad.log" ||
  fail "a label out of range: status $status, $(cat "$work/bad.log")"
echo "ok: a label out of range is refused: $(tail -1 "$work/bad.log")"

# ---- a model with fewer outputs than the data's classes: refused, not trained past its logits
status=0
"$worker" --server coaps://127.0.0.1:9 --model "input 8x8x1; fc 32 relu; fc 2" --data "$work/npz" --identity w0 \
  --key-hex 00112233 --quiet >"$work/classes.log" 2>&1 || status=$?
[ "$status" -ne 0 ] && grep -q "model has 2 outputs for the data's 3 classes" "$work/classes.log" ||
  fail "a model of 2 outputs on 3 classes: status $status, $(cat "$work/classes.log")"
echo "ok: a model of 2 outputs on 3 classes is refused: $(tail -1 "$work/classes.log")"
