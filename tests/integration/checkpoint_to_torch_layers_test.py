#!/usr/bin/python3
"""server/checkpoint_to_torch.py and issue 35's layers: checkpoints of models with conv1d on a
sequence input (and a conv, a dwconv and a residual add over it), groupnorm and batchnorm
rebuild in PyTorch with the logits edgetrain computes (edgetrain-model-logits, reference and
XNNPACK kernels, within 1e-5), batchnorm's running statistics recalibrated on the examples
scored in both; the built-in cnn1d too. As a program, a batchnorm model is refused without
--data (exit 2, 'batchnorm' named, no traceback, no ONNX file) and with an IDX --data it
scores the accuracy edgetrain's logits give and writes --onnx's file, and so with --data of a
directory with edgetrain-data.toml (uint8 .npy; CSV with scaling = "scale"), a missing file and
a --scaling against the description's refused by name; the built-ins with dwconv, pools and residual connections
get past the refusal checks; an 'init he' statement (how edgetrain drew the first weights)
and a dropout layer (the identity when evaluating) rebuild like the same spec without them.

With EDGETRAIN_SIM, a model given as inline spec text (batchnorm included) is trained by
edgetrain-sim, and its checkpoint, naming the spec, is read back without --model and scores
the sim's final accuracy in PyTorch.

usage: checkpoint_to_torch_layers_test.py EDGETRAIN_MODEL_LOGITS [EDGETRAIN_SIM]
Needs Debian's python3-torch and python3-numpy (exit 77 without, except under CI=true)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"checkpoint_to_torch_layers: needs python3-torch and python3-numpy: {e}")
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(repo, "server"))
sys.path.insert(0, os.path.join(repo, "tests", "support"))
from model_logits import edgetrain_logits  # noqa: E402
import checkpoint_to_torch as loader  # noqa: E402

failures = []
logits_program = sys.argv[1]
sim_program = sys.argv[2] if len(sys.argv) > 2 else None


def check(condition, what):
    print(("ok:   " if condition else "FAIL: ") + what)
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


def random_tensors(shapes, seed):
    """Random weights of edgetrain's layout, scaled by 1/sqrt(fan-in) so the logits stay near 1
    (an absolute 1e-5 then means what it says); normalization gammas near 1, betas near 0."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 10
        values = rng.normal(0, 1 / np.sqrt(fan_in), shape)
        if name.startswith(("gn", "bn")) and name.endswith(".weight"):
            values = 1 + values
        tensors[name] = values.astype(np.float32)
    return tensors


def write_npz_data(directory, x, labels, classes, shape_line):
    os.makedirs(directory)
    np.savez(os.path.join(directory, "d.npz"), x=x, y=labels)
    with open(os.path.join(directory, "edgetrain-data.toml"), "w") as f:
        f.write(f'num_classes = {classes}\n{shape_line}\nscaling = "none"\n')
        for split in ("train", "test"):
            f.write(f'[{split}]\nfeatures = "d.npz"\nfeatures_array = "x"\nlabels = "d.npz"\nlabels_array = "y"\n')


def write_idx(path, array):
    dims = array.shape
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]) + struct.pack(">" + "I" * len(dims), *dims) + array.astype(np.uint8).tobytes())


def compare(label, spec, tensors, data, x, count, scaling="none"):
    """edgetrain's logits of `spec` with `tensors` on `data` against the rebuilt module's on x."""
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, "best.safetensors")
        write_safetensors(checkpoint, tensors, {"edgetrain.model": spec})
        module, _ = loader.load_checkpoint(checkpoint, scaling=scaling)
        loader.calibrate(module, x[:count])
        with torch.no_grad():
            expected = module(loader.module_input(module, x[:count])).double().numpy()
        got = edgetrain_logits(logits_program, spec, checkpoint, data, count)
    for backend in ("reference", "xnnpack"):
        difference = float(np.abs(got[backend] - expected).max()) if got[backend].shape == expected.shape else 1e9
        check(difference <= 1e-5, f"{label}: {backend} logits equal PyTorch's on {count} examples "
                                  f"(max |difference| {difference:.2e})")
    return module


torch.set_num_threads(1)
rng = np.random.default_rng(11)
with tempfile.TemporaryDirectory() as tmp:
    # A sequence model: conv1d (valid, strided), groupnorm, a 3x3 dwconv and conv over the
    # sequence (only their middle rows meet it), batchnorm, a residual add, fc on the flatten.
    sequence_spec = ("input 32x3 sequence; conv1d 8 5 relu; groupnorm 2; conv1d 8 3 stride 2 relu; name a; "
                     "dwconv 3x3 same; batchnorm relu; conv 8 3x3 same; add a relu; fc 3")
    windows = rng.normal(0, 1, (40, 32, 3)).astype(np.float32)  # N x L x C
    write_npz_data(os.path.join(tmp, "seq"), windows, np.arange(40) % 3, 3, "sequence = [32, 3]")
    shapes = {"conv1.weight": (8, 1, 5, 3), "conv1.bias": (8,), "gn1.weight": (8,), "gn1.bias": (8,),
              "conv2.weight": (8, 1, 3, 8), "conv2.bias": (8,), "dwconv1.weight": (8, 3, 3, 1),
              "dwconv1.bias": (8,), "bn1.weight": (8,), "bn1.bias": (8,), "conv3.weight": (8, 3, 3, 8),
              "conv3.bias": (8,), "fc1.weight": (3, 13 * 8), "fc1.bias": (3,)}
    module = compare("conv1d/groupnorm/batchnorm sequence model", sequence_spec, random_tensors(shapes, 1),
                     os.path.join(tmp, "seq"), windows, 40)
    check(isinstance(module.layers["conv1"], torch.nn.Conv1d) and isinstance(module.layers["gn1"], torch.nn.GroupNorm)
          and module.layers["gn1"].num_groups == 2, "conv1d is an nn.Conv1d, groupnorm an nn.GroupNorm of 2 groups")

    # The built-in cnn1d (globalavgpool over a sequence), per-example standardised.
    har = rng.normal(0, 1, (20, 128, 9)).astype(np.float32)
    os.makedirs(os.path.join(tmp, "har"))
    np.savez(os.path.join(tmp, "har", "d.npz"), x=har, y=np.arange(20) % 6)
    with open(os.path.join(tmp, "har", "edgetrain-data.toml"), "w") as f:
        f.write('num_classes = 6\nsequence = [128, 9]\n')
        for split in ("train", "test"):
            f.write(f'[{split}]\nfeatures = "d.npz"\nfeatures_array = "x"\nlabels = "d.npz"\nlabels_array = "y"\n')
    shapes = {"conv1.weight": (32, 1, 5, 9), "conv1.bias": (32,), "conv2.weight": (32, 1, 5, 32),
              "conv2.bias": (32,), "conv3.weight": (64, 1, 5, 32), "conv3.bias": (64,),
              "conv4.weight": (64, 1, 5, 64), "conv4.bias": (64,), "fc1.weight": (6, 64), "fc1.bias": (6,)}
    compare("built-in cnn1d", "cnn1d", random_tensors(shapes, 2), os.path.join(tmp, "har"), har, 20,
            scaling="per-example-standardize")

    # An image model with both normalizations and global pooling, on IDX files (150 images:
    # calibrated in batches of 100 and 50 by both).
    image_spec = ("input 8x8x1; conv 8 3x3 same; groupnorm 4 relu; conv 8 3x3 stride 2 same; batchnorm relu; "
                  "globalavgpool; fc 3")
    images = rng.integers(0, 256, (150, 8, 8))
    labels = rng.integers(0, 3, 150)
    idx = os.path.join(tmp, "idx")
    os.makedirs(idx)
    write_idx(os.path.join(idx, "t10k-images-idx3-ubyte"), images)
    write_idx(os.path.join(idx, "t10k-labels-idx1-ubyte"), labels)
    shapes = {"conv1.weight": (8, 3, 3, 1), "conv1.bias": (8,), "gn1.weight": (8,), "gn1.bias": (8,),
              "conv2.weight": (8, 3, 3, 8), "conv2.bias": (8,), "bn1.weight": (8,), "bn1.bias": (8,),
              "fc1.weight": (3, 8), "fc1.bias": (3,)}
    tensors = random_tensors(shapes, 3)
    compare("groupnorm/batchnorm image model", image_spec, tensors, idx, images.astype(np.float32), 150,
            scaling="per-example-standardize")

    checkpoint = os.path.join(tmp, "best.safetensors")
    write_safetensors(checkpoint, tensors, {"edgetrain.model": image_spec})
    program = [sys.executable, os.path.join(repo, "server", "checkpoint_to_torch.py"), checkpoint]
    run = subprocess.run(program + ["--onnx", os.path.join(tmp, "model.onnx")], capture_output=True, text=True)
    check(run.returncode == 2 and "'batchnorm'" in run.stderr and "--data" in run.stderr
          and "Traceback" not in run.stderr, f"batchnorm without --data: exit {run.returncode}, {run.stderr!r}")
    check(not os.path.exists(os.path.join(tmp, "model.onnx")), "batchnorm without --data: no ONNX file written")
    onnx_file = os.path.join(tmp, "calibrated.onnx")
    run = subprocess.run(program + ["--data", idx, "--json", "--onnx", onnx_file], capture_output=True, text=True)
    check(run.returncode == 0, f"batchnorm with --data: exit {run.returncode}, {run.stderr[-400:]!r}")
    check(os.path.exists(onnx_file), "batchnorm with --data: the ONNX file (calibrated statistics) is written")
    if run.returncode == 0:
        accuracy = json.loads(run.stdout)["accuracy"]
        expected = float((edgetrain_logits(logits_program, image_spec, checkpoint, idx, 150)["xnnpack"].argmax(1) == labels).mean())
        check(accuracy == expected, f"checkpoint_to_torch.py --data scores {accuracy} as edgetrain's logits {expected}")

    # --data of a directory with edgetrain-data.toml: the same images as uint8 .npy files (the
    # default scaling, per-example-standardize), as a CSV with the label in its second column
    # and with scaling = "scale", each scored as edgetrain's logits score that directory.
    formats = {"npy": ('features = "x.npy"\nlabels = "y.npy"\n', ""),
               "csv": ('features = "t.csv"\nlabel_column = "label"\n', 'scaling = "scale"\nscale = 0.0125\noffset = -1.5\n')}
    for name, (split_lines, scaling_lines) in formats.items():
        directory = os.path.join(tmp, "user-" + name)
        os.makedirs(directory)
        np.save(os.path.join(directory, "x.npy"), images.astype(np.uint8))
        np.save(os.path.join(directory, "y.npy"), labels.astype(np.int32))
        with open(os.path.join(directory, "t.csv"), "w") as f:
            f.write("p0,label," + ",".join(f"p{i}" for i in range(1, 64)) + "\n")
            for image, label in zip(images.reshape(150, 64), labels):
                f.write(",".join([str(image[0]), str(label)] + [str(v) for v in image[1:]]) + "\n")
        with open(os.path.join(directory, "edgetrain-data.toml"), "w") as f:
            f.write(f"num_classes = 3\nexample_shape = [8, 8, 1]\n{scaling_lines}[train]\n{split_lines}[test]\n{split_lines}")
        run = subprocess.run(program + ["--data", directory, "--json"], capture_output=True, text=True)
        check(run.returncode == 0, f"--data with edgetrain-data.toml ({name}): exit {run.returncode}, {run.stderr[-400:]!r}")
        if run.returncode == 0:
            accuracy = json.loads(run.stdout)["accuracy"]
            expected = float((edgetrain_logits(logits_program, image_spec, checkpoint, directory, 150)["xnnpack"]
                              .argmax(1) == labels).mean())
            check(accuracy == expected, f"--data {name} directory scores {accuracy} as edgetrain's logits {expected}")
    os.remove(os.path.join(tmp, "user-npy", "y.npy"))
    run = subprocess.run(program + ["--data", os.path.join(tmp, "user-npy"), "--json"], capture_output=True, text=True)
    check(run.returncode == 2 and "y.npy" in run.stderr and "Traceback" not in run.stderr,
          f"--data naming a missing labels file: exit 2 naming it ({run.returncode}, {run.stderr.strip()!r})")
    run = subprocess.run(program + ["--data", os.path.join(tmp, "user-csv"), "--scaling", "per-example-standardize", "--json"],
                         capture_output=True, text=True)
    check(run.returncode == 2 and "scaling" in run.stderr and "Traceback" not in run.stderr,
          f"--scaling against the description's: exit 2 ({run.returncode}, {run.stderr.strip()!r})")

# With EDGETRAIN_SIM: a model given as inline spec text, with batchnorm, trained by
# edgetrain-sim on IDX files made here; its checkpoint names the spec, so the program reads it
# without --model and scores the sim's final test accuracy (calibrated alike, batches of 100).
if sim_program:
    with tempfile.TemporaryDirectory() as tmp:
        patterns = rng.integers(0, 256, (3, 8, 8))
        for split, n in (("train", 600), ("t10k", 250)):
            labels = rng.integers(0, 3, n)
            noisy = np.clip(patterns[labels] * 0.2 + rng.integers(0, 220, (n, 8, 8)), 0, 255)  # hard: not 100%
            write_idx(os.path.join(tmp, f"{split}-images-idx3-ubyte"), noisy)
            write_idx(os.path.join(tmp, f"{split}-labels-idx1-ubyte"), labels)
        spec = "input 8x8x1; conv 4 3x3 same; batchnorm relu; maxpool 2; fc 10"  # IDX: 10 classes
        checkpoint = os.path.join(tmp, "trained.safetensors")
        run = subprocess.run([sim_program, "--data", tmp, "--model", spec, "--workers", "2", "--batch", "10",
                              "--lr", "0.05", "--updates", "100", "--eval-every", "50", "--save-model", checkpoint,
                              "--out", os.path.join(tmp, "sim"), "--quiet", "--seed", "3"],
                             capture_output=True, text=True)
        check(run.returncode == 0, f"edgetrain-sim trains an inline spec (exit {run.returncode}; {run.stderr[-400:]})")
        if run.returncode == 0:
            _, metadata = loader.read_safetensors(checkpoint)
            check(metadata.get("edgetrain.model") == spec, f"the sim's checkpoint names the spec: {metadata}")
            run = subprocess.run([sys.executable, os.path.join(repo, "server", "checkpoint_to_torch.py"), checkpoint,
                                  "--data", tmp, "--json"], capture_output=True, text=True)
            check(run.returncode == 0, f"read back without --model (exit {run.returncode}; {run.stderr[-400:]})")
            if run.returncode == 0:
                accuracy = json.loads(run.stdout)["accuracy"]
                sim_accuracy = float(metadata.get("edgetrain.sim.final_test_accuracy", -1))
                check(abs(accuracy - sim_accuracy) < 1e-6,
                      f"PyTorch's accuracy {accuracy} is edgetrain-sim's final {sim_accuracy}")
else:
    print("(no EDGETRAIN_SIM given: the sim's inline-spec round trip is not run)")

# A checkpoint of an inline spec from before it was named by itself says 'custom': refused,
# asking for --model, and read with it.
with tempfile.TemporaryDirectory() as tmp:
    checkpoint = os.path.join(tmp, "old.safetensors")
    old_tensors = {"fc1.weight": np.ones((2, 4), "f4"), "fc1.bias": np.zeros(2, "f4")}
    write_safetensors(checkpoint, old_tensors, {"edgetrain.model": "custom"})
    try:
        loader.load_checkpoint(checkpoint)
        check(False, "a checkpoint naming 'custom' was read without --model")
    except ValueError as e:
        check("'custom'" in str(e) and "--model" in str(e), f"the 'custom' checkpoint's error: {e}")
    module, _ = loader.load_checkpoint(checkpoint, "input 2x2x1; fc 2")
    check(isinstance(module, loader.SpecNetwork), "the 'custom' checkpoint reads with --model")

# The residual and depthwise built-ins are rebuilt (asked for their tensors: no refusal).
for name in ("mobilenet-mini", "resnet-8", "ds-cnn", "cnn1d"):
    try:
        loader.build_module(loader.BUILTIN_SPECS[name], {})
        check(False, f"{name} was rebuilt without its tensors")
    except KeyError:
        pass
    except ValueError as e:
        check(False, f"{name} was refused: {e}")

conv1 = {"conv1.weight": np.ones((4, 3, 3, 1), "f4"), "conv1.bias": np.zeros(4, "f4")}
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
