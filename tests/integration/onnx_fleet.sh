#!/usr/bin/env bash
# The PyTorch round trip on a real fleet (issue 35 part 4; tools/README.md): the CNN of
# onnx_converter_test.py, converted from its ONNX export, trained by edgetrain-server
# (--model the spec file, --init-from the converted weights) and two edgetrain-workers over
# loopback DTLS; then best.safetensors, loaded into PyTorch by server/checkpoint_to_torch.py
# (--scaling none), scores the server's recorded test accuracy (within 0.1 point).
# The fleet must reach a test accuracy above 0.8 within 30 s.
# Exit 77 without Debian's python3-torch or python3-onnx, except under CI=true.
server="$1"; worker="$2"
source "$(dirname "$0")/process_test_lib.sh"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
/usr/bin/python3 "$repo/tests/integration/onnx_converter_test.py" --prepare "$work" >"$work/prepare.log" 2>&1 || {
  status=$?
  [ "$status" -eq 77 ] && { cat "$work/prepare.log"; exit 77; }
  fail "converting the CNN failed: $(tail -5 "$work/prepare.log")"
}
spec="$work/cnn.spec"; weights="$work/cnn.safetensors"; data="$work/data"

for i in 0 1; do add_device "$server" "$work/keys.toml" "w$i" "$work/w$i.toml"; done
start_server "$server" "$work/server.log" --port 0 --state-dir "$work/state" --keystore "$work/keys.toml" \
  --model "$spec" --init-from "$weights" --eval-data "$data" --eval-interval 0.5 --lr 0.1
worker_pids=()
for i in 0 1; do
  start_worker "$work/w$i.log" "$work/w$i.stats.json" "$worker" --config "$work/w$i.toml" \
    --server "coaps://127.0.0.1:$server_port" --model "$spec" --data "$data" --worker-id "$i" --workers 2
  worker_pids+=("$last_pid")
done
wait_for_json "$server_stats" last_evaluation.accuracy -gt 0.8 30 "$server_pid" ||
  fail "no test accuracy above 0.8 within 30 s (latest: $(json_get "$server_stats" last_evaluation || true))"
echo "ok: server + 2 workers train the converted CNN: $(json_get "$server_stats" last_evaluation | tr '\n' ' ')"
for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
kill -TERM "$server_pid"
wait_for_exit "$server_pid" 30 || fail "the server exited with status $?"

best="$work/state/best.safetensors"
[ -f "$best" ] || fail "no $best"
/usr/bin/python3 - "$repo" "$best" "$data" <<'PY' || fail "PyTorch's accuracy of best.safetensors differs from the server's"
import sys, os, numpy as np, torch
sys.path.insert(0, os.path.join(sys.argv[1], "server"))
import checkpoint_to_torch
module, metadata = checkpoint_to_torch.load_checkpoint(sys.argv[2], scaling="none")
arrays = np.load(os.path.join(sys.argv[3], "blobs.npz"))
with torch.no_grad():
    logits = module(torch.from_numpy(arrays["x_test"]).permute(0, 3, 1, 2).contiguous())
accuracy = float((logits.argmax(1).numpy() == arrays["y_test"]).mean())
recorded = float(metadata["edgetrain.test_accuracy"])
print(f"best.safetensors (version {metadata['edgetrain.version']}): server {recorded:.4f}, PyTorch {accuracy:.4f}")
sys.exit(0 if abs(accuracy - recorded) <= 0.001 else 1)
PY
echo "ok: best.safetensors scores the server's accuracy in PyTorch"
