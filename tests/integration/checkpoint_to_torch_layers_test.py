#!/usr/bin/python3
"""server/checkpoint_to_torch.py and issue 35's layers: a model with groupnorm, batchnorm or
conv1d is refused by name (the loader cannot rebuild it yet, so it cannot export it to ONNX
either), as a library call and as a program (exit 2, the layer named, no traceback); the
built-ins with dwconv, pools and residual connections get past that check (the converter's
test, onnx_converter_test.py, checks such a rebuilt network's logits); an 'init he' statement (how edgetrain drew the first weights) and a dropout
layer (the identity when evaluating) rebuild like the same spec without them. Needs Debian's python3-torch and python3-numpy (exit 77 without)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch  # noqa: F401  (the loader imports it)
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(repo, "server"))
import checkpoint_to_torch as loader  # noqa: E402

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def write_safetensors(path, tensors, metadata):
    header, offset, body = {"__metadata__": metadata}, 0, b""
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        body += data
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)


conv1 = {"conv1.weight": np.ones((4, 3, 3, 1), "f4"), "conv1.bias": np.zeros(4, "f4")}
for layer in ("groupnorm 2", "batchnorm relu", "conv1d 4 3"):
    spec = f"input 8x8x1; conv 4 3x3 same relu; {layer}; fc 2"
    verb = layer.split()[0]
    try:
        loader.build_module(spec, dict(conv1))
        check(False, f"build_module accepted '{layer}'")
    except ValueError as e:
        check(f"'{verb}'" in str(e) and "ONNX" in str(e), f"build_module's error for '{layer}': {e}")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, "best.safetensors")
        write_safetensors(checkpoint, conv1, {"edgetrain.model": spec})
        run = subprocess.run([sys.executable, os.path.join(repo, "server", "checkpoint_to_torch.py"), checkpoint,
                              "--onnx", os.path.join(tmp, "model.onnx")], capture_output=True, text=True)
        check(run.returncode == 2, f"'{layer}': exit {run.returncode}, stderr {run.stderr!r}")
        check(f"'{verb}'" in run.stderr and "Traceback" not in run.stderr, f"'{layer}': stderr {run.stderr!r}")
        check(not os.path.exists(os.path.join(tmp, "model.onnx")), f"'{layer}': an ONNX file was written")

# The residual and depthwise built-ins are rebuilt (asked for their tensors: no refusal);
# the sequence built-in is refused for its input.
for name in ("mobilenet-mini", "resnet-8", "ds-cnn"):
    try:
        loader.build_module(loader.BUILTIN_SPECS[name], {})
        check(False, f"{name} was rebuilt without its tensors")
    except KeyError:
        pass
    except ValueError as e:
        check(False, f"{name} was refused: {e}")
try:
    loader.build_module(loader.BUILTIN_SPECS["cnn1d"], {})
    check(False, "cnn1d was rebuilt")
except ValueError as e:
    check("sequence" in str(e), f"cnn1d's error: {e}")

# 'init he' and 'dropout P' (the identity when evaluating) change nothing the loader rebuilds.
tensors = dict(conv1, **{"fc1.weight": np.arange(2 * 256, dtype="f4").reshape(2, 256) / 256,
                         "fc1.bias": np.zeros(2, "f4")})
with_init = loader.build_module("input 8x8x1; init he; conv 4 3x3 same relu; fc 2", dict(tensors))
without = loader.build_module("input 8x8x1; conv 4 3x3 same relu; fc 2", dict(tensors))
x = torch.arange(64, dtype=torch.float32).reshape(1, 1, 8, 8)
check(torch.equal(with_init(x), without(x)), "'init he' changed the rebuilt network")
with_dropout = loader.build_module("input 8x8x1; conv 4 3x3 same relu; dropout 0.5; fc 2", dict(tensors))
check(torch.equal(with_dropout(x), without(x)), "'dropout 0.5' changed the evaluated network")

for f in failures:
    print("FAIL:", f)
print("checkpoint_to_torch_layers:", "failed" if failures else "ok")
sys.exit(1 if failures else 0)
