#!/usr/bin/env bash
# Ending a run and keeping the model (issue 12, part 6), on mnist-small:
#   - --stop-at-accuracy (mlp): the server checkpoints, exits 0 and its stats file says why;
#     best.safetensors holds the best evaluation (version and accuracy in its metadata);
#   - --stop-after-updates (paper-cnn): the same, at that version;
#   - `edgetrain-server evaluate` on best.safetensors gives the accuracy its metadata holds;
#   - warm start (--init-from best.safetensors, --stop-after-seconds): the new state
#     directory's first evaluation is that accuracy; a restart with the same --init-from
#     resumes; --init-from into a state directory holding a run, or with another model: exit 2;
#     a plain safetensors file (no edgetrain.crc32) warm starts with a warning, a wrong
#     checksum is refused;
#   - server/checkpoint_to_torch.py (Debian's PyTorch) gives evaluate's accuracy within 0.1
#     points, and its loss, on both models' checkpoints (the paper CNN's conv and FC layouts
#     permuted right).
#   - the loader's --onnx file of both checkpoints passes onnx.checker and, run by
#     tests/support/onnx_numpy_eval.py with NumPy, gives evaluate's accuracy too.
# usage: run_end.sh SERVER WORKER
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
require_mnist
data="$(basename "$mnist_dir")"
keys="$work/keys.toml"
add_device "$server" "$keys" pi-1 "$work/pi-1.toml"
add_device "$server" "$keys" pi-2 "$work/pi-2.toml"

# train NAME MODEL SERVER-FLAGS...: a server with two workers until a stop condition ends it
# (exit 0 within 90 s); the workers are stopped afterwards.
train() {
  local name="$1" model="$2" status=0; shift 2
  start_server "$server" "$work/$name.log" --port 0 --state-dir "$work/$name" --keystore "$keys" --model "$model" \
    --eval-data "$data" --eval-interval 0.5 --checkpoint-every 0 "$@"
  local pids=() i
  for i in 1 2; do
    start_worker "$work/$name-w$i.log" "$work/$name-w$i.json" "$worker" --config "$work/pi-$i.toml" \
      --server "coaps://127.0.0.1:$server_port" --model "$model" --data "$data" --worker-id $((i - 1)) --workers 2 \
      --quiet --give-up-after 5
    pids+=("$last_pid")
  done
  wait_for_exit "$server_pid" 90 || status=$?
  [ "$status" -eq 0 ] || fail "$name: the server exited with status $status"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for i in "${pids[@]}"; do wait_for_exit "$i" 20 || true; done
}

# metadata FILE KEY: a string of a safetensors file's __metadata__.
metadata() {
  python3 -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n))["__metadata__"][sys.argv[2]])' "$1" "$2"
}
close() { awk -v a="$1" -v b="$2" -v e="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= e) }'; }

# ---- stop at accuracy (mlp) ----------------------------------------------------------------
train mlp-run mlp --stop-at-accuracy 0.75
stats="$work/mlp-run.stats.json"
[ "$(json_get "$stats" stop.condition)" = accuracy ] || fail "stop condition: $(json_get "$stats" stop)"
[ "$(json_get "$stats" state)" = stopped ] || fail "the stats file does not say stopped"
best="$work/mlp-run/best.safetensors"
[ -f "$best" ] || fail "no best.safetensors"
best_accuracy=$(metadata "$best" edgetrain.test_accuracy)
close "$best_accuracy" "$(json_get "$stats" best.accuracy)" 0.000001 || fail "best.safetensors and the stats file disagree"
json_compare "$best_accuracy" -ge 0.75 || fail "the best accuracy $best_accuracy is below the stop condition"
[ "$(metadata "$best" edgetrain.version)" = "$(json_get "$stats" best.version)" ] || fail "best version differs"
echo "ok: --stop-at-accuracy 0.75: exit 0, stop: $(json_get "$stats" stop.detail); best.safetensors: accuracy $best_accuracy at version $(metadata "$best" edgetrain.version)"

# ---- evaluate -----------------------------------------------------------------------------------
"$server" evaluate "$best" --data "$data" --json >"$work/evaluate.json"
close "$(json_get "$work/evaluate.json" accuracy)" "$best_accuracy" 0.000001 ||
  fail "evaluate gives $(json_get "$work/evaluate.json" accuracy), best.safetensors says $best_accuracy"
status=0
"$server" evaluate "$best" --data "$data" --model paper-cnn >"$work/evaluate-wrong.out" 2>&1 || status=$?
[ "$status" -ne 0 ] && grep -q "another model" "$work/evaluate-wrong.out" || fail "evaluate with another model: $(cat "$work/evaluate-wrong.out")"
echo "ok: evaluate best.safetensors: $("$server" evaluate "$best" --data "$data")"

# ---- stop after updates (paper-cnn) ----------------------------------------------------------
train cnn-run paper-cnn --stop-after-updates 60
cnn_stats="$work/cnn-run.stats.json"
[ "$(json_get "$cnn_stats" stop.condition)" = updates ] || fail "stop condition: $(json_get "$cnn_stats" stop)"
json_compare "$(json_get "$cnn_stats" version)" -ge 60 || fail "stopped at version $(json_get "$cnn_stats" version)"
[ "$(metadata "$work/cnn-run/checkpoint.safetensors" edgetrain.version)" = "$(json_get "$cnn_stats" version)" ] ||
  fail "the last checkpoint is not at the final version"
echo "ok: --stop-after-updates 60: exit 0 at version $(json_get "$cnn_stats" version), checkpointed"

# ---- warm start --------------------------------------------------------------------------------
start_server "$server" "$work/warm.log" --port 0 --state-dir "$work/warm" --keystore "$keys" --model mlp \
  --eval-data "$data" --eval-interval 0.5 --init-from "$best" --stop-after-seconds 2
wait_for_exit "$server_pid" 30 || fail "the warm-started server exited with status $?"
[ "$(json_get "$work/warm.stats.json" stop.condition)" = seconds ] || fail "warm: $(json_get "$work/warm.stats.json" stop)"
first_accuracy=$(sed -n 2p "$work/warm/metrics.csv" | cut -d, -f7)
close "$first_accuracy" "$best_accuracy" 0.000001 || fail "the warm start evaluated $first_accuracy at version 0, not $best_accuracy"
start_server "$server" "$work/warm.log" --port 0 --state-dir "$work/warm" --keystore "$keys" --model mlp \
  --init-from "$best" --stop-after-seconds 1
wait_for_exit "$server_pid" 30 || fail "the restarted warm run exited with status $?"
grep -q "resuming it" "$work/warm.log" || fail "the restart with the same --init-from did not resume"
for case in "mlp-run mlp holds a run" "fresh paper-cnn another model"; do
  set -- $case
  status=0
  "$server" --listen 127.0.0.1 --port 0 --state-dir "$work/$1" --keystore "$keys" --model "$2" --init-from "$best" \
    >"$work/refused.log" 2>&1 || status=$?
  [ "$status" -eq 2 ] && grep -q "$3 $4" "$work/refused.log" || fail "--init-from ($1, $2): status $status: $(cat "$work/refused.log")"
done
[ ! -e "$work/fresh" ] || fail "a refused --init-from created its state directory"
echo "ok: --init-from: the new run starts at accuracy $first_accuracy (= best), a restart resumes, a run or another model: exit 2"
# A plain safetensors file (best's tensors and metadata without edgetrain.crc32, as another
# tool would write it) warm starts too, with a warning naming what is missing; the same file
# with a wrong checksum is refused as damaged.
/usr/bin/python3 - "$best" "$work/plain.safetensors" "$work/tampered.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
length = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + length])
del header["__metadata__"]["edgetrain.crc32"]
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + length:])
header["__metadata__"]["edgetrain.crc32"] = "0badc0de"
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[3], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + length:])
PY
start_server "$server" "$work/plain.log" --port 0 --state-dir "$work/plain" --keystore "$keys" --model mlp \
  --eval-data "$data" --eval-interval 0.5 --init-from "$work/plain.safetensors" --stop-after-seconds 1
wait_for_exit "$server_pid" 30 || fail "the server warm-started from a plain safetensors file exited with status $?"
grep -q "warning: --init-from .*plain.safetensors has no edgetrain.crc32" "$work/plain.log" ||
  fail "no warning naming the missing edgetrain.crc32: $(cat "$work/plain.log")"
plain_accuracy=$(sed -n 2p "$work/plain/metrics.csv" | cut -d, -f7)
close "$plain_accuracy" "$best_accuracy" 0.000001 || fail "the plain file's warm start evaluated $plain_accuracy, not $best_accuracy"
status=0
"$server" --listen 127.0.0.1 --port 0 --state-dir "$work/tampered" --keystore "$keys" --model mlp \
  --init-from "$work/tampered.safetensors" >"$work/tampered.log" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "damaged: checksum mismatch" "$work/tampered.log" ||
  fail "--init-from with a wrong checksum: status $status: $(cat "$work/tampered.log")"
echo "ok: --init-from a plain safetensors file: warned (no edgetrain.crc32), starts at $plain_accuracy; a wrong checksum: exit 2"

# ---- the PyTorch loader against evaluate ----------------------------------------------------------
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "SKIP: no python3-torch/python3-numpy for /usr/bin/python3 (toolchains/setup-deps.sh installs them)"
  exit 77
fi
for checkpoint in "$best" "$work/cnn-run/checkpoint.safetensors"; do
  "$server" evaluate "$checkpoint" --data "$data" --json >"$work/ours.json"
  /usr/bin/python3 "$repo/server/checkpoint_to_torch.py" "$checkpoint" --data "$data" --json >"$work/torch.json"
  ours=$(json_get "$work/ours.json" accuracy); theirs=$(json_get "$work/torch.json" accuracy)
  close "$ours" "$theirs" 0.001 || fail "$checkpoint: PyTorch accuracy $theirs, edgetrain's $ours"
  close "$(json_get "$work/ours.json" loss)" "$(json_get "$work/torch.json" loss)" 0.001 ||
    fail "$checkpoint: PyTorch loss $(json_get "$work/torch.json" loss), edgetrain's $(json_get "$work/ours.json" loss)"
  echo "ok: $(json_get "$work/ours.json" model) version $(json_get "$work/ours.json" version): accuracy $ours (edgetrain-server evaluate) vs $theirs (PyTorch), loss $(json_get "$work/ours.json" loss) vs $(json_get "$work/torch.json" loss)"
done

# ---- the ONNX export, run by NumPy (bookworm has no ONNX runtime) -----------------------------
/usr/bin/python3 -c 'import onnx' 2>/dev/null || { echo "SKIP: no python3-onnx (toolchains/setup-deps.sh installs it)"; exit 77; }
for checkpoint in "$best" "$work/cnn-run/checkpoint.safetensors"; do
  "$server" evaluate "$checkpoint" --data "$data" --json >"$work/ours.json"
  /usr/bin/python3 "$repo/server/checkpoint_to_torch.py" "$checkpoint" --onnx "$work/model.onnx" --json >/dev/null \
    2>"$work/onnx-export.log" || fail "--onnx failed: $(cat "$work/onnx-export.log")"
  /usr/bin/python3 "$repo/tests/support/onnx_numpy_eval.py" "$work/model.onnx" --data "$data" >"$work/onnx.json" ||
    fail "the ONNX file of $checkpoint did not check or run"
  ours=$(json_get "$work/ours.json" accuracy); theirs=$(json_get "$work/onnx.json" accuracy)
  close "$ours" "$theirs" 0.001 || fail "$checkpoint: the ONNX export's accuracy $theirs, edgetrain's $ours"
  echo "ok: $(json_get "$work/ours.json" model): the ONNX export passes onnx.checker and, run by NumPy, scores $theirs (edgetrain-server evaluate: $ours)"
done
