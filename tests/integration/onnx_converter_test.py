#!/usr/bin/python3
"""The PyTorch round trip (issue 35 part 4): a small CNN written here in PyTorch (conv, ReLU,
a residual add, a depthwise conv, max and average pooling, two fc layers), exported with
torch.onnx.export and converted by tools/onnx_to_edgetrain.py, gives PyTorch's logits in
edgetrain (reference and XNNPACK kernels, within 1e-5) before training; edgetrain-sim trains it
from the converted weights (--init-from, AdaComp, 4 workers) on a data set made here, and the
final checkpoint, loaded back into PyTorch by server/checkpoint_to_torch.py, scores the same
test accuracy (within 0.1 point) and the same logits as edgetrain, and its ONNX export
(checkpoint_to_torch.py --onnx) converts back to the same spec and tensors bit for bit. A 1-D
CNN on sensor windows (conv1d) gives PyTorch's logits too, and so does a CNN with nn.GroupNorm
(torch's export pattern and opset 18's GroupNormalization both convert to 'groupnorm G', and
back through checkpoint_to_torch.py). Then the refusals: an
unsupported operator (Sigmoid), a padding mode (reflect, exported as a Pad node) and dilated
and grouped convolutions are refused by name, with the node's name, and nothing is written.

usage: onnx_converter_test.py EDGETRAIN_MODEL_LOGITS EDGETRAIN_SIM
       onnx_converter_test.py --prepare DIR   (DIR/data, DIR/cnn.spec, DIR/cnn.safetensors, for
                                               integration/onnx_fleet.sh's server and workers)
Exit 77 without Debian's python3-torch or python3-onnx, except under CI=true."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"onnx_converter: needs python3-torch, python3-onnx, python3-numpy: {e}")
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
converter = os.path.join(repo, "tools", "onnx_to_edgetrain.py")
sys.path.insert(0, os.path.join(repo, "server"))
sys.path.insert(0, os.path.join(repo, "tests", "support"))
from model_logits import edgetrain_logits  # noqa: E402
import checkpoint_to_torch  # noqa: E402

failures = []
torch.set_num_threads(1)
H, W, C, CLASSES = 12, 12, 2, 4


def check(condition, what):
    print(("ok:   " if condition else "FAIL: ") + what)
    if not condition:
        failures.append(what)


class SmallResidualCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(C, 8, 3, padding=1)
        self.block_a = nn.Conv2d(8, 8, 3, padding=1)
        self.block_b = nn.Conv2d(8, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.hidden = nn.Linear(3 * 3 * 8, 16)
        self.out = nn.Linear(16, CLASSES)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.relu(self.block_b(F.relu(self.block_a(x))) + x)  # the residual add
        x = F.max_pool2d(x, 2)                                 # 6 x 6
        x = F.avg_pool2d(F.relu(self.depthwise(x)), 2)         # 3 x 3 x 8
        return self.out(F.relu(self.hidden(torch.flatten(x, 1))))


def write_data(directory, seed=3):
    """Gaussian blobs of H x W x C (channels last, float32), one class per fixed pattern; the
    description says scaling none, so edgetrain feeds the network what PyTorch is fed."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(0, 1, (CLASSES, H, W, C)).astype(np.float32)

    def blobs(n):
        labels = rng.integers(0, CLASSES, n)
        return (patterns[labels] + rng.normal(0, 1.0, (n, H, W, C))).astype(np.float32), labels.astype(np.int64)

    x_train, y_train = blobs(1200)
    x_test, y_test = blobs(300)
    np.savez(os.path.join(directory, "blobs.npz"), x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    with open(os.path.join(directory, "edgetrain-data.toml"), "w") as f:
        f.write(f'num_classes = {CLASSES}\nexample_shape = [{H}, {W}, {C}]\nscaling = "none"\n')
        for split in ("train", "test"):
            f.write(f'[{split}]\nfeatures = "blobs.npz"\nfeatures_array = "x_{split}"\n'
                    f'labels = "blobs.npz"\nlabels_array = "y_{split}"\n')
    return x_test, y_test


def torch_logits(module, x_nhwc):
    with torch.no_grad():
        return module(torch.from_numpy(x_nhwc).permute(0, 3, 1, 2).contiguous()).double().numpy()


def convert(module, tmp, stem):
    path = os.path.join(tmp, stem + ".onnx")
    torch.onnx.export(module.eval(), torch.zeros(1, C, H, W), path, input_names=["images"],
                      output_names=["logits"], opset_version=13)
    return subprocess.run([sys.executable, converter, path, "--out", os.path.join(tmp, stem)],
                          capture_output=True, text=True)


if sys.argv[1] == "--prepare":
    prepared = sys.argv[2]
    os.makedirs(os.path.join(prepared, "data"), exist_ok=True)
    write_data(os.path.join(prepared, "data"))
    torch.manual_seed(1)
    run = convert(SmallResidualCnn().eval(), prepared, "cnn")
    print(run.stdout + run.stderr, end="")
    sys.exit(run.returncode)

logits_program, sim_program = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as tmp:
    data = os.path.join(tmp, "data")
    os.mkdir(data)
    x_test, y_test = write_data(data)
    torch.manual_seed(1)
    net = SmallResidualCnn().eval()

    run = convert(net, tmp, "cnn")
    check(run.returncode == 0, f"the converter converts the CNN (exit {run.returncode}; {run.stderr.strip()})")
    spec, weights = os.path.join(tmp, "cnn.spec"), os.path.join(tmp, "cnn.safetensors")
    spec_text = open(spec).read() if os.path.exists(spec) else ""
    print(spec_text)
    for statement in ("dwconv 3x3 same relu", "add t", "maxpool 2", "avgpool 2", "fc 16 relu", "fc 4"):
        check(statement in spec_text, f"the spec holds '{statement}'")

    # Before training: the same logits.
    count = 64
    expected = torch_logits(net, x_test[:count])
    got = edgetrain_logits(logits_program, spec, weights, data, count)
    for backend in ("reference", "xnnpack"):
        difference = float(np.abs(got[backend] - expected).max())
        check(got[backend].shape == expected.shape and difference <= 1e-5,
              f"{backend} logits equal PyTorch's on {count} test examples (max |difference| {difference:.2e})")

    # Training: edgetrain-sim from the converted weights.
    checkpoint = os.path.join(tmp, "trained.safetensors")
    run = subprocess.run([sim_program, "--data", data, "--model", spec, "--init-from", weights,
                          "--compressor", "adacomp", "--workers", "4", "--batch", "10", "--lr", "0.1",
                          "--updates", "1000", "--eval-every", "100", "--save-model", checkpoint,
                          "--out", os.path.join(tmp, "sim"), "--quiet", "--seed", "5"],
                         capture_output=True, text=True)
    check(run.returncode == 0, f"edgetrain-sim trains the converted model (exit {run.returncode}; "
                               f"{run.stderr.strip()[-500:]})")
    print(run.stdout[-600:])
    trained, metadata = checkpoint_to_torch.load_checkpoint(checkpoint, scaling="none")
    before = float((expected.argmax(1) == y_test[:count]).mean())
    torch_trained = torch_logits(trained, x_test)
    torch_accuracy = float((torch_trained.argmax(1) == y_test).mean())
    edgetrain_trained = edgetrain_logits(logits_program, spec, checkpoint, data, len(y_test))["xnnpack"]
    edgetrain_accuracy = float((edgetrain_trained.argmax(1) == y_test).mean())
    sim_accuracy = float(metadata.get("edgetrain.sim.final_test_accuracy", -1))
    print(f"accuracy before training {before:.4f} (first {count}); after 1000 updates: edgetrain-sim "
          f"{sim_accuracy:.4f}, edgetrain {edgetrain_accuracy:.4f}, PyTorch {torch_accuracy:.4f}")
    check(edgetrain_accuracy >= 0.8 and edgetrain_accuracy > before + 0.1,
          f"training raised the test accuracy ({before:.3f} -> {edgetrain_accuracy:.3f})")
    check(abs(sim_accuracy - edgetrain_accuracy) <= 0.001,
          f"edgetrain-sim's final accuracy {sim_accuracy:.4f} is the logits' {edgetrain_accuracy:.4f}")
    check(abs(torch_accuracy - edgetrain_accuracy) <= 0.001,
          f"PyTorch's accuracy {torch_accuracy:.4f} equals edgetrain's {edgetrain_accuracy:.4f} within 0.1 point")
    difference = float(np.abs(torch_trained - edgetrain_trained).max())
    check(difference <= 1e-4, f"the trained model's logits agree (max |difference| {difference:.2e})")

    # And around again: the trained checkpoint exported to ONNX by checkpoint_to_torch.py
    # converts back to the same spec statements and the same tensors, bit for bit.
    exported = os.path.join(tmp, "trained.onnx")
    run = subprocess.run([sys.executable, os.path.join(repo, "server", "checkpoint_to_torch.py"), checkpoint,
                          "--scaling", "none", "--onnx", exported], capture_output=True, text=True)
    check(run.returncode == 0, f"checkpoint_to_torch.py --onnx exports the trained model (exit {run.returncode})")
    run = subprocess.run([sys.executable, converter, exported, "--out", os.path.join(tmp, "again")],
                         capture_output=True, text=True)
    check(run.returncode == 0, f"its export converts (exit {run.returncode}; {run.stderr.strip()})")
    if run.returncode == 0:
        again, _ = checkpoint_to_torch.read_safetensors(os.path.join(tmp, "again.safetensors"))
        original, _ = checkpoint_to_torch.read_safetensors(checkpoint)
        same = sorted(again) == sorted(original) and all(np.array_equal(again[k], original[k]) for k in original)
        check(same, "the re-converted tensors equal the trained checkpoint's")
        statements = [l for l in open(os.path.join(tmp, "again.spec")).read().splitlines() if not l.startswith("#")]
        check(statements == [l for l in spec_text.splitlines() if not l.startswith("#")],
              "the re-converted spec equals the first conversion's")

    # A 1-D CNN for sensor windows (N x C x L: 'input LxC sequence', conv1d): the same logits.
    class SensorCnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv1d(3, 8, 5)
            self.b = nn.Conv1d(8, 8, 3, stride=2)
            self.fc = nn.Linear(8 * 13, CLASSES)

        def forward(self, x):
            return self.fc(torch.flatten(F.relu(self.b(F.relu(self.a(x)))), 1))

    sequences = os.path.join(tmp, "sequences")
    os.mkdir(sequences)
    rng = np.random.default_rng(4)
    windows = rng.normal(0, 1, (32, 32, 3)).astype(np.float32)  # N x L x C, channels last
    np.savez(os.path.join(sequences, "w.npz"), x=windows, y=np.arange(32) % CLASSES)
    with open(os.path.join(sequences, "edgetrain-data.toml"), "w") as f:
        f.write(f'num_classes = {CLASSES}\nsequence = [32, 3]\nscaling = "none"\n')
        for split in ("train", "test"):
            f.write(f'[{split}]\nfeatures = "w.npz"\nfeatures_array = "x"\nlabels = "w.npz"\nlabels_array = "y"\n')
    sensor = SensorCnn().eval()
    path = os.path.join(tmp, "sensor.onnx")
    torch.onnx.export(sensor, torch.zeros(1, 3, 32), path, opset_version=13)
    run = subprocess.run([sys.executable, converter, path, "--out", os.path.join(tmp, "sensor"), "--print"],
                         capture_output=True, text=True)
    check(run.returncode == 0 and "input 32x3 sequence; conv1d 8 5 valid relu; conv1d 8 3 stride 2 valid relu; fc 4"
          in run.stdout, f"the 1-D CNN converts to conv1d layers ({run.stdout.strip()} {run.stderr.strip()})")
    if run.returncode == 0:
        with torch.no_grad():
            expected = sensor(torch.from_numpy(windows).permute(0, 2, 1).contiguous()).double().numpy()
        got = edgetrain_logits(logits_program, os.path.join(tmp, "sensor.spec"), os.path.join(tmp, "sensor.safetensors"), sequences, 32)
        difference = float(np.abs(got["xnnpack"] - expected).max())
        check(difference <= 1e-5, f"the 1-D CNN's logits equal PyTorch's (max |difference| {difference:.2e})")

    # Group norm: nn.GroupNorm, which torch 1.13 exports as Reshape + InstanceNormalization +
    # Reshape + Mul + Add (it has no opset 18), converts to 'groupnorm G' with PyTorch's logits;
    # opset 18's GroupNormalization node of the same weights (scale per channel as opset 21
    # has it, or per group as opset 18 does) converts to the same spec and tensors; and the way
    # back (checkpoint_to_torch.py --onnx of the converted weights) converts again bit for bit.
    class GroupNormCnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(C, 8, 3, padding=1)
            self.norm = nn.GroupNorm(2, 8)
            self.fc = nn.Linear(8 * (H // 2) * (W // 2), CLASSES)

        def forward(self, x):
            return self.fc(torch.flatten(F.max_pool2d(F.relu(self.norm(self.conv(x))), 2), 1))

    grouped = GroupNormCnn().eval()
    with torch.no_grad():  # away from PyTorch's initial 1 and 0, so a lost or swapped affine part shows
        grouped.norm.weight.uniform_(0.5, 1.5)
        grouped.norm.bias.uniform_(-0.5, 0.5)
    run = convert(grouped, tmp, "groupnorm")
    gn_spec = open(os.path.join(tmp, "groupnorm.spec")).read() if run.returncode == 0 else ""
    check(run.returncode == 0 and "groupnorm 2 relu" in gn_spec,
          f"nn.GroupNorm converts to 'groupnorm 2 relu' (exit {run.returncode}; {run.stderr.strip()})")
    if run.returncode == 0:
        expected = torch_logits(grouped, x_test[:count])
        got = edgetrain_logits(logits_program, os.path.join(tmp, "groupnorm.spec"),
                               os.path.join(tmp, "groupnorm.safetensors"), data, count)
        for backend in ("reference", "xnnpack"):
            difference = float(np.abs(got[backend] - expected).max())
            check(difference <= 1e-5, f"group norm: {backend} logits equal PyTorch's (max |difference| {difference:.2e})")
        converted, _ = checkpoint_to_torch.read_safetensors(os.path.join(tmp, "groupnorm.safetensors"))

        def statements_of(path):
            return [l for l in open(path).read().splitlines() if not l.startswith("#")]

        def same_conversion(stem, tensors=None):
            again, _ = checkpoint_to_torch.read_safetensors(os.path.join(tmp, stem + ".safetensors"))
            tensors = tensors or converted
            return (statements_of(os.path.join(tmp, stem + ".spec")) == statements_of(os.path.join(tmp, "groupnorm.spec"))
                    and sorted(again) == sorted(tensors) and all(np.array_equal(again[k], tensors[k]) for k in tensors))

        from onnx import TensorProto, helper, numpy_helper
        weights = {k: v.detach().numpy() for k, v in grouped.state_dict().items()}
        per_group = {"norm.weight": np.array([0.75, 1.25], np.float32), "norm.bias": np.array([-0.2, 0.3], np.float32)}
        for stem, opset, scale, bias in (("gn-opset21", 21, weights["norm.weight"], weights["norm.bias"]),
                                         ("gn-opset18", 18, per_group["norm.weight"], per_group["norm.bias"])):
            initializers = [numpy_helper.from_array(v, k) for k, v in dict(
                weights, **{"norm.weight": scale, "norm.bias": bias}).items()]
            nodes = [helper.make_node("Conv", ["images", "conv.weight", "conv.bias"], ["c"], name="/conv/Conv",
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                     helper.make_node("GroupNormalization", ["c", "norm.weight", "norm.bias"], ["n"],
                                      name="/norm/GroupNormalization", num_groups=2, epsilon=1e-5),
                     helper.make_node("Relu", ["n"], ["r"]),
                     helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                     helper.make_node("Flatten", ["p"], ["f"], axis=1),
                     helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1)]
            graph = helper.make_graph(nodes, stem, [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, C, H, W])],
                                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
                                      initializers)
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
                      os.path.join(tmp, stem + ".onnx"))
            run = subprocess.run([sys.executable, converter, os.path.join(tmp, stem + ".onnx"), "--out",
                                  os.path.join(tmp, stem)], capture_output=True, text=True)
            wanted = converted if opset == 21 else dict(converted, **{"gn1.weight": np.repeat(scale, 4),
                                                                      "gn1.bias": np.repeat(bias, 4)})
            check(run.returncode == 0 and same_conversion(stem, wanted),
                  f"opset {opset}'s GroupNormalization (scale per {'channel' if opset == 21 else 'group'}) converts "
                  f"to the same spec and tensors (exit {run.returncode}; {run.stderr.strip()})")
        back = os.path.join(tmp, "gn-back.onnx")
        run = subprocess.run([sys.executable, os.path.join(repo, "server", "checkpoint_to_torch.py"),
                              os.path.join(tmp, "groupnorm.safetensors"), "--scaling", "none", "--onnx", back],
                             capture_output=True, text=True)
        run2 = subprocess.run([sys.executable, converter, back, "--out", os.path.join(tmp, "gn-back")],
                              capture_output=True, text=True) if run.returncode == 0 else run
        check(run.returncode == 0 and run2.returncode == 0 and same_conversion("gn-back"),
              f"group norm's way back (checkpoint_to_torch.py --onnx, then the converter) gives the same spec and "
              f"tensors (exit {run.returncode}, {run2.returncode}; {run2.stderr.strip()[-300:]})")

    # Refusals, each by name, nothing written.
    class WithSigmoid(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.Sigmoid()
            self.fc = nn.Linear(C * H * W, CLASSES)

        def forward(self, x):
            return self.fc(torch.flatten(self.act(x), 1))

    class OneConv(nn.Module):
        def __init__(self, **conv):
            super().__init__()
            self.conv = nn.Conv2d(C, 4, 3, **conv)
            self.fc = nn.Linear(4 * (H - 2 * conv.get("dilation", 1) + (2 if "padding" in conv else 0)) ** 2, CLASSES)

        def forward(self, x):
            return self.fc(torch.flatten(self.conv(x), 1))

    class WithInstanceNorm(WithSigmoid):  # edgetrain has no instance norm apart from group norm's pattern
        def __init__(self):
            super().__init__()
            self.act = nn.InstanceNorm2d(C)

    cases = [("sigmoid", WithSigmoid(), ["unsupported ONNX operator 'Sigmoid'", "/act/Sigmoid"]),
             ("instancenorm", WithInstanceNorm(), ["unsupported ONNX operator 'InstanceNormalization'"]),
             ("reflect", OneConv(padding=1, padding_mode="reflect"), ["mode=reflect", "'Pad'", "/conv/Pad"]),
             ("dilated", OneConv(dilation=2), ["dilations", "'Conv'", "/conv/Conv"]),
             ("grouped", OneConv(groups=2), ["group", "'Conv'"])]
    for stem, module, words in cases:
        run = convert(module, tmp, stem)
        check(run.returncode == 2 and all(w in run.stderr for w in words) and "Traceback" not in run.stderr,
              f"{stem}: refused naming {words} (exit {run.returncode}: {run.stderr.strip()})")
        check(not os.path.exists(os.path.join(tmp, stem + ".spec")), f"{stem}: no spec written")

print("onnx_converter:", "failed" if failures else "ok")
sys.exit(1 if failures else 0)
