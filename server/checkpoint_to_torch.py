#!/usr/bin/python3
"""Load an edgetrain-server checkpoint (checkpoint.safetensors, best.safetensors) into PyTorch.

Reads the safetensors file with json + numpy alone (no `safetensors` package), rebuilds the
model the checkpoint names (paper-cnn, mlp, or a spec given with --model) as a torch.nn
module with the weights permuted from edgetrain's layout to PyTorch's, and evaluates it on
a data set's IDX test files, exactly as `edgetrain-server evaluate` does (each image
standardised on its own; see server/README.md, "The checkpoint's tensor layout").

    python3 server/checkpoint_to_torch.py STATE/best.safetensors --data mnist [--json]
    python3 server/checkpoint_to_torch.py CKPT --onnx model.onnx   # also export ONNX

As a library: `model, metadata = load_checkpoint(path)` gives an nn.Module in eval mode
that takes float images N x C x H x W with values 0..255 (it standardises them itself;
`load_checkpoint(path, scaling="none")`: the values as they are, for data described with
scaling = "none", e.g. a model converted by tools/onnx_to_edgetrain.py). Residual graphs
(name/from/add), dwconv, avgpool and globalavgpool are rebuilt; groupnorm, batchnorm and
conv1d are refused by name.
Needs Debian's python3-torch and python3-numpy (toolchains/setup-deps.sh installs both)."""
import argparse
import gzip
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# model/model.cc's built-in specs.
BUILTIN_SPECS = {
    "paper-cnn": "input 28x28x1; conv 32 3x3 same relu; maxpool 2; conv 64 3x3 same relu; maxpool 2; fc 128 relu; fc 10",
    "mlp": "input 28x28x1; fc 128 relu; fc 10",
    "mobilenet-mini": "input 28x28x1; init he; conv 32 3x3 stride 2 same relu; dwconv 3x3 same relu; "
                      "conv 64 1x1 relu; dwconv 3x3 stride 2 same relu; conv 128 1x1 relu; "
                      "dwconv 3x3 same relu; conv 128 1x1 relu; globalavgpool; fc 10",
}
_RESNET8_BODY = ("init he; conv 16 3x3 same relu; name s0; conv 16 3x3 same relu; conv 16 3x3 same; "
                 "add s0 relu; name s1; conv 32 3x3 stride 2 same relu; conv 32 3x3 same; name b2; "
                 "from s1; conv 32 1x1 stride 2 valid; add b2 relu; name s2; "
                 "conv 64 3x3 stride 2 same relu; conv 64 3x3 same; name b3; "
                 "from s2; conv 64 1x1 stride 2 valid; add b3 relu; globalavgpool; fc 10")
BUILTIN_SPECS.update({
    "resnet-8": "input 28x28x1; " + _RESNET8_BODY,
    "resnet-8-32x32x3": "input 32x32x3; " + _RESNET8_BODY,
    "ds-cnn": "input 49x10x1; init he; conv 64 3x3 stride 2 same relu; "
              + "dwconv 3x3 same relu; conv 64 1x1 relu; " * 4 + "globalavgpool; fc 12",
    "cnn1d": "input 128x9 sequence; init he; conv1d 32 5 relu; conv1d 32 5 stride 2 relu; "
             "conv1d 64 5 relu; conv1d 64 5 stride 2 relu; globalavgpool; fc 6",
})

# Layers of model/model.h's language that this loader does not rebuild yet (issue 35): it
# refuses a model holding one, by name, rather than building a network that differs from
# the one the checkpoint was trained as. (Normalization: edgetrain's running statistics
# live outside the checkpoint, model/README.md "Normalization state".)
NOT_YET_SUPPORTED = ("groupnorm", "batchnorm", "conv1d")

def read_safetensors(path):
    """{name: numpy array} and the __metadata__ dict of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {info['dtype']}, not F32")
        start, end = info["data_offsets"]
        tensors[name] = np.frombuffer(body[start:end], dtype="<f4").reshape(info["shape"]).copy()
    return tensors, metadata


class Standardize(nn.Module):
    """Per-image standardisation (model/trainer.cc, kernels::standardize_per_image):
    (x - mean) / max(stddev, 1/sqrt(N)) over all N values of one image."""

    def __init__(self, values_per_image):
        super().__init__()
        self.min_std = 1.0 / math.sqrt(values_per_image)

    def forward(self, x):
        flat = x.flatten(1).double()
        mean = flat.mean(dim=1, keepdim=True)
        std = ((flat - mean) ** 2).mean(dim=1, keepdim=True).sqrt()
        scale = 1.0 / torch.clamp(std, min=self.min_std)
        return ((flat - mean) * scale).float().reshape(x.shape)


def parse_spec(text):
    """[(verb, words)] of a model spec (model/model.h's language)."""
    statements = []
    for line in text.replace(";", "\n").splitlines():
        line = line.split("#")[0].strip()
        if line:
            words = line.split()
            statements.append((words[0], words[1:]))
    return statements


class SpecNetwork(nn.Module):
    """The spec's layers in order, each reading the tensor it names (a residual graph:
    'name', 'from', 'add'); `steps` are (layer key or None, input slot, added slot, relu)."""

    def __init__(self, layers, steps, standardize, input_hwc):
        super().__init__()
        self.input_hwc = input_hwc  # the spec's 'input HxWxC', for an export's dummy input
        self.standardize = standardize
        self.layers = nn.ModuleDict(layers)
        self.steps = steps

    def forward(self, x):
        values = [self.standardize(x) if self.standardize is not None else x]
        for key, source, added, relu in self.steps:
            y = values[source]
            if key == "add":
                y = y + values[added]
            elif key is not None:
                y = self.layers[key](y)
            values.append(F.relu(y) if relu else y)
        return values[-1]


def build_module(spec_text, tensors, scaling="per-example-standardize"):
    """nn.Module for the spec, its parameters set from edgetrain's tensors. `scaling` is how
    edgetrain scaled the examples before the first layer (the data description's scaling:
    'per-example-standardize', IDX data's, or 'none')."""
    statements = parse_spec(spec_text)
    verb, words = statements[0]
    if verb != "input":
        raise ValueError("a model spec starts with 'input HxWxC'")
    if "sequence" in words:
        raise ValueError("a sequence input ('input LxC sequence') is not supported by "
                         "checkpoint_to_torch.py yet")
    if scaling not in ("per-example-standardize", "none"):
        raise ValueError(f"scaling '{scaling}' is not supported (per-example-standardize or none)")
    H, W, C = (int(v) for v in words[0].split("x"))
    standardize = Standardize(H * W * C) if scaling == "per-example-standardize" else None
    # Refused before anything is built, so the error names the layer, not a missing tensor.
    for verb, _ in statements[1:]:
        if verb in NOT_YET_SUPPORTED:
            raise ValueError(f"layer '{verb}' is not supported by checkpoint_to_torch.py yet, so this "
                             f"model can be neither rebuilt in PyTorch nor exported to ONNX "
                             f"(supported: conv, dwconv, maxpool, avgpool, globalavgpool, fc, relu, "
                             f"dropout, name/from/add)")
    layers, steps, counts = {}, [], {}
    shapes = [(H, W, C)]          # per slot: (H, W, C) of the tensor, slot 0 the input
    named = {}                    # spec name -> slot
    current, pending_from = 0, None
    flat = [False]                # per slot: an fc's output (already flat)

    def number(kind):
        counts[kind] = counts.get(kind, 0) + 1
        return counts[kind]

    def push(key, source, added, relu, shape, is_flat=False):
        steps.append((key, source, added, relu))
        shapes.append(shape)
        flat.append(is_flat)
        return len(shapes) - 1

    for verb, words in statements[1:]:
        if verb in ("init",):  # how edgetrain drew the initial weights; nothing to rebuild
            continue
        if verb == "name":
            named[words[0]] = current
            continue
        if verb == "from":
            pending_from = named[words[0]]
            continue
        source = current if pending_from is None else pending_from
        pending_from = None
        h, w, c = shapes[source]
        relu = "relu" in words
        if verb == "dropout":  # the identity outside training, as edgetrain evaluates
            current = push(None, source, None, False, (h, w, c), flat[source])
        elif verb in ("conv", "dwconv"):
            depthwise = verb == "dwconv"
            n = number(verb)
            oc = c if depthwise else int(words[0])
            k = int(words[1 if not depthwise else 0].split("x")[0])
            stride = int(words[words.index("stride") + 1]) if "stride" in words else 1
            pad = (k - 1) // 2 if "valid" not in words else 0
            conv = nn.Conv2d(c, oc, k, stride=stride, padding=pad, groups=c if depthwise else 1)
            wt = tensors[f"{verb}{n}.weight"]  # [OC][KH][KW][C] -> [OC][C][KH][KW]
            conv.weight.data = torch.from_numpy(np.ascontiguousarray(wt.transpose(0, 3, 1, 2)))
            conv.bias.data = torch.from_numpy(tensors[f"{verb}{n}.bias"])
            layers[f"{verb}{n}"] = conv
            current = push(f"{verb}{n}", source, None, relu,
                           ((h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1, oc))
        elif verb in ("maxpool", "avgpool"):
            k = 2 if verb == "maxpool" else int(words[0])
            key = f"pool{len(steps)}"
            layers[key] = nn.MaxPool2d(2) if verb == "maxpool" else nn.AvgPool2d(k)
            current = push(key, source, None, False, (h // k, w // k, c))
        elif verb == "globalavgpool":
            layers[f"pool{len(steps)}"] = nn.AdaptiveAvgPool2d(1)
            current = push(f"pool{len(steps)}", source, None, False, (1, 1, c))
        elif verb == "fc":
            n = number("fc")
            out = int(words[0])
            wt = tensors[f"fc{n}.weight"]  # [OUT][IN], IN in NHWC flatten order
            if not flat[source]:
                # PyTorch flattens N x C x H x W as (C, H, W); edgetrain as (H, W, C).
                wt = wt.reshape(out, h, w, c).transpose(0, 3, 1, 2).reshape(out, c * h * w)
            fc = nn.Linear(wt.shape[1], out)
            fc.weight.data = torch.from_numpy(np.ascontiguousarray(wt))
            fc.bias.data = torch.from_numpy(tensors[f"fc{n}.bias"])
            layers[f"fc{n}"] = nn.Sequential(nn.Flatten(), fc)
            current = push(f"fc{n}", source, None, relu, (1, 1, out), True)
        elif verb == "relu":
            current = push(None, source, None, True, (h, w, c), flat[source])
        elif verb == "add":
            current = push("add", source, named[words[0]], relu, (h, w, c), flat[source])
        else:
            raise ValueError(f"unknown layer '{verb}'")
    return SpecNetwork(layers, steps, standardize, (H, W, C)).eval()


def load_checkpoint(path, model=None, scaling="per-example-standardize"):
    """(nn.Module, metadata) for a checkpoint; `model` is a built-in name, a spec or a spec
    file; `scaling` as build_module's."""
    tensors, metadata = read_safetensors(path)
    name = model or metadata.get("edgetrain.model")
    if not name:
        raise ValueError(f"{path} does not name its model: give --model")
    spec = BUILTIN_SPECS.get(name, name)
    if ";" not in spec and "\n" not in spec and os.path.isfile(spec):  # a spec file, as --model takes
        with open(spec) as f:
            spec = f.read()
    if "input" not in spec:
        raise ValueError(f"unknown model '{name}' (built in: {', '.join(BUILTIN_SPECS)}; or a spec)")
    return build_module(spec, tensors, scaling), metadata


def read_idx(path):
    """numpy array of an IDX file, raw or gzipped (the .gz one when the raw one is missing)."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def test_files(name):
    """runtime::dataset_files(name, test): where a named data set's test files are."""
    deps = os.environ.get("EDGETRAIN_DEPS") or "/var/cache/edgetrain"
    directory = {"mnist": os.path.join(deps, "mnist-full"), "mnist-small": os.path.join(deps, "mnist-small"),
                 "fashion-mnist": "/usr/share/datasets/fashion-mnist"}.get(name, name)
    return (os.path.join(directory, "t10k-images-idx3-ubyte"), os.path.join(directory, "t10k-labels-idx1-ubyte"))


def evaluate(module, images, labels, batch=100):
    """(accuracy, mean cross-entropy loss) of `module` on uint8 NHWC (or NHW) images."""
    if images.ndim == 3:
        images = images[..., None]
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(labels), batch):
            x = torch.from_numpy(images[start:start + batch].astype(np.float32)).permute(0, 3, 1, 2)
            y = torch.from_numpy(labels[start:start + batch].astype(np.int64))
            logits = module(x)
            correct += int((logits.argmax(dim=1) == y).sum())
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
    return correct / len(labels), loss_sum / len(labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint.safetensors or best.safetensors of edgetrain-server")
    parser.add_argument("--model", help="built-in model name or spec (default: the one the checkpoint names)")
    parser.add_argument("--data", help="test set to evaluate on: mnist, mnist-small, fashion-mnist or a directory "
                        "of IDX files (t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, raw or .gz)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a line")
    parser.add_argument("--scaling", default="per-example-standardize", choices=["per-example-standardize", "none"],
                        help="how edgetrain scaled the examples (the data description's scaling; IDX data: "
                             "per-example-standardize, the default): none for a model converted by "
                             "tools/onnx_to_edgetrain.py and trained on data described with scaling = \"none\"")
    parser.add_argument("--onnx", metavar="FILE", help="also write the model as ONNX (torch.onnx.export) to FILE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        module, metadata = load_checkpoint(args.checkpoint, args.model, args.scaling)
    except ValueError as e:  # a model this loader cannot rebuild: say which and why, no traceback
        print(f"checkpoint_to_torch.py: {args.checkpoint}: {e}", file=sys.stderr)
        return 2
    result = {"checkpoint": args.checkpoint, "model": args.model or metadata.get("edgetrain.model"),
              "version": int(metadata.get("edgetrain.version", 0))}
    if args.onnx:
        H, W, C = module.input_hwc
        torch.onnx.export(module, torch.zeros(1, C, H, W), args.onnx, input_names=["images"], output_names=["logits"],
                          dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
        result["onnx"] = args.onnx
    if args.data:
        images_path, labels_path = test_files(args.data)
        images, labels = read_idx(images_path), read_idx(labels_path)
        accuracy, loss = evaluate(module, images, labels)
        result.update({"data": args.data, "images": int(len(labels)), "accuracy": accuracy, "loss": loss})
    if args.json:
        print(json.dumps(result))
    elif "accuracy" in result:
        print(f"test accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f} on {result['images']} images of "
              f"{args.data} (model {result['model']}, version {result['version']}; PyTorch)")
    else:
        print(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
