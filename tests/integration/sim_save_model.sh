#!/usr/bin/env bash
# edgetrain-sim --save-model writes the server's checkpoint format (sim/README.md): the file
# is sealed, `edgetrain-server evaluate` takes it and gives the test accuracy the simulator
# recorded in its metadata, and a flipped byte is refused as damage. (experiments/train-classifier.sh,
# MD-GAN's classifier, relies on this; its 5-minute run itself is not a test.)
# usage: sim_save_model.sh EDGETRAIN_SIM EDGETRAIN_SERVER
sim="$1"; server="$2"
source "$(dirname "$0")/process_test_lib.sh"
require_mnist
data="$(basename "$mnist_dir")"

"$sim" --data "$data" --model mlp --workers 1 --compressor none --updates 150 --eval-every 150 --seed 3 --quiet \
  --out "$work/run" --save-model "$work/model.safetensors" >"$work/sim.log" 2>&1 || fail "edgetrain-sim: $(tail -3 "$work/sim.log")"
"$server" evaluate "$work/model.safetensors" --data "$data" --json >"$work/evaluate.json" 2>"$work/evaluate.log" ||
  fail "edgetrain-server evaluate refused the simulator's model: $(cat "$work/evaluate.log")"
recorded=$(python3 -c '
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n))["__metadata__"]["edgetrain.sim.final_test_accuracy"])' "$work/model.safetensors")
evaluated=$(json_get "$work/evaluate.json" accuracy)
python3 -c 'import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > 1e-4)' "$recorded" "$evaluated" ||
  fail "evaluate gives $evaluated, the simulator recorded $recorded"
[ "$(json_get "$work/evaluate.json" version)" = 150 ] || fail "the checkpoint's version is not the 150 updates applied"
echo "ok: the simulator's model: evaluate gives $evaluated (recorded $recorded), version 150"

size=$(stat -c %s "$work/model.safetensors")
printf '\x55' | dd of="$work/model.safetensors" bs=1 seek=$((size - 7)) conv=notrunc status=none
status=0
"$server" evaluate "$work/model.safetensors" --data "$data" --json >/dev/null 2>"$work/damaged.log" || status=$?
[ "$status" -ne 0 ] && grep -q "damaged" "$work/damaged.log" || fail "a flipped byte was not refused (status $status): $(cat "$work/damaged.log")"
echo "ok: a flipped byte in it is refused: $(head -c 150 "$work/damaged.log")"
