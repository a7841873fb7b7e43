#!/usr/bin/python3
"""Load an edgetrain-server checkpoint (checkpoint.safetensors, best.safetensors) into PyTorch.

Reads the safetensors file with json + numpy alone (no `safetensors` package), rebuilds the
model the checkpoint names (paper-cnn, mlp, or a spec given with --model) as a torch.nn
module with the weights permuted from edgetrain's layout to PyTorch's, and evaluates it on
a data set's IDX test files, exactly as `edgetrain-server evaluate` does (each image
standardised on its own; see server/README.md, "The checkpoint's tensor layout"), or on the
[test] split of a directory with edgetrain-data.toml (NumPy or CSV, scaled as it says;
model/README.md, "Your own data").

    python3 server/checkpoint_to_torch.py STATE/best.safetensors --data mnist [--json]
    python3 server/checkpoint_to_torch.py STATE/best.safetensors --data my-data   # edgetrain-data.toml
    python3 server/checkpoint_to_torch.py CKPT --onnx model.onnx   # also export ONNX

As a library: `model, metadata = load_checkpoint(path)` gives an nn.Module in eval mode
that takes float images N x C x H x W with values 0..255 (it standardises them itself;
`load_checkpoint(path, scaling="none")`: the values as they are, for data described with
scaling = "none", e.g. a model converted by tools/onnx_to_edgetrain.py). A sequence model
('input LxC sequence') takes N x C x L, as nn.Conv1d does. Every layer of a classifier's
spec is rebuilt: residual graphs (name/from/add), conv, conv1d, dwconv, the pools, fc,
dropout, groupnorm and batchnorm. batchnorm's running statistics are not in a checkpoint
(edgetrain recomputes them by calibration, model/README.md "Normalization state"); ours:
the PyTorch model gets them recalibrated the same way on the data given with --data (in
batches of 100, as edgetrain-server evaluate does), and the program refuses a batchnorm
model without --data; as a library, `model.calibrate_normalization(batches)`.
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

# edgetrain's normalization epsilon (kernels/normalization.h, kNormalizationEps).
NORMALIZATION_EPS = 1e-5
CALIBRATION_BATCH = 100  # server/evaluator.cc's batch, so the statistics come out the same

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


class CalibratedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """nn.BatchNorm for N x C (x L) (x H x W) whose running statistics come from a calibration
    pass, as edgetrain's Trainer::calibrate_normalization: while `calibrating`, it normalizes
    with the batch's statistics (as in training) and sums each batch's mean and biased
    variance over its positions; finish() sets the mean and unbiased variance over all
    calibrated positions. Outside calibration it is PyTorch's batch norm in eval mode (an
    ONNX BatchNormalization). Before any calibration: mean 0, variance 1 (a fresh Trainer's)."""

    def __init__(self, channels):
        super().__init__(channels, eps=NORMALIZATION_EPS)
        self.calibrating = False
        self.sums = None

    def _check_input_dim(self, x):
        if x.dim() not in (2, 3, 4):
            raise ValueError(f"batchnorm: expected a 2-, 3- or 4-D input, got {x.dim()}-D")

    def forward(self, x):
        if not self.calibrating:
            return super().forward(x)
        dims = [0] + list(range(2, x.dim()))
        positions = x.numel() // x.shape[1]
        mean = x.double().mean(dim=dims)
        var = x.double().var(dim=dims, unbiased=False)
        self.sums[0] += mean * positions
        self.sums[1] += (var + mean * mean) * positions
        self.sums[2] += positions
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    def begin(self):
        self.calibrating = True
        self.sums = [torch.zeros(self.num_features, dtype=torch.float64),
                     torch.zeros(self.num_features, dtype=torch.float64), 0]

    def finish(self):
        self.calibrating = False
        n = self.sums[2]
        if n == 0:
            return
        mean = self.sums[0] / n
        var = torch.clamp(self.sums[1] / n - mean * mean, min=0.0) * (n / (n - 1) if n > 1 else 1.0)
        self.running_mean.copy_(mean.float())
        self.running_var.copy_(var.float())


class SpecNetwork(nn.Module):
    """The spec's layers in order, each reading the tensor it names (a residual graph:
    'name', 'from', 'add'); `steps` are (layer key or None, input slot, added slot, relu)."""

    def __init__(self, layers, steps, standardize, input_hwc, sequence=False):
        super().__init__()
        self.input_hwc = input_hwc  # the spec's 'input HxWxC' (1 x L x C), for an export's dummy input
        self.sequence = sequence    # 'input LxC sequence': takes N x C x L
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

    def batch_norms(self):
        return [m for m in self.modules() if isinstance(m, CalibratedBatchNorm)]

    def example_input(self, count=1):
        """Zeros of the shape forward() takes, for `count` examples (an export's dummy input)."""
        H, W, C = self.input_hwc
        return torch.zeros(count, C, W) if self.sequence else torch.zeros(count, C, H, W)

    def calibrate_normalization(self, batches):
        """Sets every batchnorm layer's running statistics from `batches` (tensors as forward()
        takes), as edgetrain's evaluator does before scoring; a no-op without batchnorm."""
        norms = self.batch_norms()
        if not norms:
            return
        for m in norms:
            m.begin()
        try:
            with torch.no_grad():
                for x in batches:
                    self(x)
        finally:
            for m in norms:
                m.finish()


def build_module(spec_text, tensors, scaling="per-example-standardize"):
    """nn.Module for the spec, its parameters set from edgetrain's tensors. `scaling` is how
    edgetrain scaled the examples before the first layer (the data description's scaling:
    'per-example-standardize', IDX data's, or 'none')."""
    statements = parse_spec(spec_text)
    verb, words = statements[0]
    if verb != "input":
        raise ValueError("a model spec starts with 'input HxWxC'")
    sequence = "sequence" in words
    if scaling not in ("per-example-standardize", "none"):
        raise ValueError(f"scaling '{scaling}' is not supported (per-example-standardize or none)")
    if sequence:  # held as a 1 x L x C image by edgetrain; N x C x L here
        L, C = (int(v) for v in words[0].split("x"))
        H, W = 1, L
    else:
        H, W, C = (int(v) for v in words[0].split("x"))
    standardize = Standardize(H * W * C) if scaling == "per-example-standardize" else None
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
        elif verb in ("conv", "conv1d", "dwconv"):
            depthwise = verb == "dwconv"
            kind = "conv" if verb == "conv1d" else verb  # conv1d's tensors are conv's (model.cc)
            n = number(kind)
            oc = c if depthwise else int(words[0])
            k = int(words[1 if not depthwise else 0].split("x")[0])
            kh = 1 if verb == "conv1d" else k
            stride = int(words[words.index("stride") + 1]) if "stride" in words else 1
            pad = 0 if verb == "conv1d" or "valid" in words else (k - 1) // 2
            groups = c if depthwise else 1
            wt = tensors[f"{kind}{n}.weight"]  # [OC][KH][KW][C]
            if sequence:
                # Height 1: of a KxK kernel padded (K-1)/2 only the middle row meets the
                # sequence (edgetrain refuses a valid KxK with K > 1 here), so it is a Conv1d.
                conv = nn.Conv1d(c, oc, k, stride=stride, padding=pad, groups=groups)
                weight = wt[:, (kh - 1) // 2].transpose(0, 2, 1)  # [OC][KW][C] -> [OC][C][KW]
            else:
                conv = nn.Conv2d(c, oc, (kh, k), stride=stride, padding=pad, groups=groups)
                weight = wt.transpose(0, 3, 1, 2)  # -> [OC][C][KH][KW]
            conv.weight.data = torch.from_numpy(np.ascontiguousarray(weight))
            conv.bias.data = torch.from_numpy(tensors[f"{kind}{n}.bias"])
            layers[f"{kind}{n}"] = conv
            current = push(f"{kind}{n}", source, None, relu,
                           ((h + 2 * pad - kh) // stride + 1, (w + 2 * pad - k) // stride + 1, oc))
        elif verb in ("groupnorm", "batchnorm"):
            group = verb == "groupnorm"
            key = f"gn{number('gn')}" if group else f"bn{number('bn')}"
            norm = nn.GroupNorm(int(words[0]), c, eps=NORMALIZATION_EPS) if group else CalibratedBatchNorm(c)
            norm.weight.data = torch.from_numpy(tensors[f"{key}.weight"])
            norm.bias.data = torch.from_numpy(tensors[f"{key}.bias"])
            layers[key] = norm
            current = push(key, source, None, relu, (h, w, c), flat[source])
        elif verb in ("maxpool", "avgpool"):
            k = 2 if verb == "maxpool" else int(words[0])
            key = f"pool{len(steps)}"
            layers[key] = nn.MaxPool2d(2) if verb == "maxpool" else nn.AvgPool2d(k)
            current = push(key, source, None, False, (h // k, w // k, c))
        elif verb == "globalavgpool":
            layers[f"pool{len(steps)}"] = nn.AdaptiveAvgPool1d(1) if sequence else nn.AdaptiveAvgPool2d(1)
            current = push(f"pool{len(steps)}", source, None, False, (1, 1, c))
        elif verb == "fc":
            n = number("fc")
            out = int(words[0])
            wt = tensors[f"fc{n}.weight"]  # [OUT][IN], IN in NHWC flatten order
            if not flat[source]:
                # PyTorch flattens N x C x H x W as (C, H, W) (a sequence's N x C x L as
                # (C, L): H = 1); edgetrain as (H, W, C).
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
    return SpecNetwork(layers, steps, standardize, (H, W, C), sequence).eval()


def load_checkpoint(path, model=None, scaling="per-example-standardize"):
    """(nn.Module, metadata) for a checkpoint; `model` is a built-in name, a spec or a spec
    file; `scaling` as build_module's."""
    tensors, metadata = read_safetensors(path)
    name = model or metadata.get("edgetrain.model")
    if not name:
        raise ValueError(f"{path} does not name its model: give --model")
    if name == "custom":  # written before inline spec text was named by itself
        raise ValueError(f"{path} names its model 'custom' (a spec given inline, which older versions "
                         f"did not record): give that spec with --model")
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


class DataError(ValueError):
    """A data directory edgetrain-data.toml describes that this loader cannot read: the message
    names the file and the problem (as model/user_data.cc's errors do)."""


def read_user_test_split(directory):
    """(features, labels, scaling) of the [test] split an edgetrain-data.toml in `directory`
    describes (model/README.md, "Your own data"): features as float32 N x H x W x C (a
    sequence's N x L x C), labels int64, scaling (name, scale, offset). The same files and
    checks as edgetrain's reader, in NumPy: .npy, .npz (features_array / labels_array) or CSV
    (label_column by name or index, header)."""
    import csv
    import tomllib
    description = os.path.join(directory, "edgetrain-data.toml")
    try:
        with open(description, "rb") as f:
            toml = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise DataError(f"{description}: {e}") from None
    try:
        classes = int(toml["num_classes"])
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{description}: needs num_classes (an integer)") from None
    if "sequence" in toml:
        length, channels = (int(v) for v in toml["sequence"])
        shape = (length, channels)
    elif "example_shape" in toml:
        shape = tuple(int(v) for v in toml["example_shape"])
    else:
        raise DataError(f"{description}: needs example_shape = [H, W, C] or sequence = [L, C]")
    name = toml.get("scaling", "per-example-standardize")
    if name not in ("per-example-standardize", "scale", "none"):
        raise DataError(f"{description}: scaling is '{name}'; expected per-example-standardize, scale or none")
    scaling = (name, float(toml.get("scale", 1.0)), float(toml.get("offset", 0.0)))
    test = toml.get("test")
    if not isinstance(test, dict) or "features" not in test:
        raise DataError(f"{description}: no [test] section with 'features' to evaluate on")
    features_path = os.path.join(directory, test["features"])

    def array(path, member):
        try:
            if path.endswith(".npz"):
                with np.load(path) as archive:
                    if not member:
                        raise DataError(f"{path}: is an .npz archive: name the array in it "
                                        f"(its arrays: {', '.join(archive.files)})")
                    if member not in archive.files:
                        raise DataError(f"{path}: has no array '{member}' (its arrays: {', '.join(archive.files)})")
                    return archive[member]
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            if isinstance(e, DataError):
                raise
            raise DataError(f"{path}: {e}") from None

    if features_path.lower().endswith(".csv"):
        column = test.get("label_column")
        if column is None:
            raise DataError(f"{description}: [test] holds a CSV file: give label_column (its name or 0-based index)")
        header = test.get("header", isinstance(column, str))
        try:
            with open(features_path, newline="") as f:
                rows = [row for row in csv.reader(f) if row]
        except OSError as e:
            raise DataError(f"{features_path}: {e}") from None
        if header:
            names, rows = rows[0], rows[1:]
            if isinstance(column, str):
                if column not in names:
                    raise DataError(f"{features_path}: no column named '{column}' in the header ({', '.join(names)})")
                column = names.index(column)
        try:
            table = np.array(rows, dtype=np.float64)
        except ValueError:
            raise DataError(f"{features_path}: a value is not a number (or the rows differ in length)") from None
        if table.ndim != 2 or not 0 <= column < table.shape[1]:
            raise DataError(f"{features_path}: label_column {column} but rows have "
                            f"{table.shape[1] if table.ndim == 2 else 0} fields")
        labels = table[:, column]
        if np.any(labels != np.round(labels)):
            raise DataError(f"{features_path}: a label is not an integer")
        labels, features = labels.astype(np.int64), np.delete(table, column, axis=1).astype(np.float32)
    else:
        if "labels" not in test:
            raise DataError(f"{description}: [test] needs 'labels' (a .npy or .npz file)")
        features = array(features_path, test.get("features_array"))
        labels_path = os.path.join(directory, test["labels"])
        labels = array(labels_path, test.get("labels_array"))
        if features.dtype not in (np.float32, np.uint8):
            raise DataError(f"{features_path}: features of dtype {features.dtype}; float32 or uint8 are read "
                            f"(x.astype(np.float32))")
        if labels.dtype.kind not in "iu" or labels.ndim != 1:
            raise DataError(f"{labels_path}: labels must be integers of shape (N,), got {labels.dtype} {labels.shape}")
        labels = labels.astype(np.int64)
    count, size = len(labels), int(np.prod(shape))
    if len(features) != count or features.size != count * size:
        raise DataError(f"{features_path}: features of shape {features.shape} for {count} labels of the example "
                        f"shape {list(shape)}")
    if count and (labels.min() < 0 or labels.max() >= classes):
        raise DataError(f"{features_path}: a label outside [0, {classes}) (num_classes = {classes})")
    return features.astype(np.float32).reshape((count,) + shape), labels, scaling


def module_input(module, examples):
    """The tensor `module` takes for numpy examples stored as edgetrain holds them: N x H x W
    (x C) images, or N x L x C sequences (a sequence model's)."""
    x = torch.from_numpy(np.ascontiguousarray(examples, dtype=np.float32))
    if module.sequence:
        return x.reshape(x.shape[0], module.input_hwc[1], module.input_hwc[2]).permute(0, 2, 1)
    if x.dim() == 3:
        x = x[..., None]
    return x.permute(0, 3, 1, 2)


def calibrate(module, images, batch=CALIBRATION_BATCH):
    """batchnorm's running statistics from `images` (numpy, as module_input takes), in
    batches of 100 as edgetrain's evaluator (server/evaluator.cc)."""
    module.calibrate_normalization(module_input(module, images[start:start + batch])
                                   for start in range(0, len(images), batch))


def evaluate(module, images, labels, batch=100):
    """(accuracy, mean cross-entropy loss) of `module` on uint8 NHWC (or NHW) images, or
    N x L x C sequences for a sequence model."""
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(labels), batch):
            x = module_input(module, images[start:start + batch])
            y = torch.from_numpy(labels[start:start + batch].astype(np.int64))
            logits = module(x)
            correct += int((logits.argmax(dim=1) == y).sum())
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
    return correct / len(labels), loss_sum / len(labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint.safetensors or best.safetensors of edgetrain-server")
    parser.add_argument("--model", help="built-in model name or spec (default: the one the checkpoint names)")
    parser.add_argument("--data", help="test set to evaluate on: mnist, mnist-small, fashion-mnist, a directory "
                        "of IDX files (t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, raw or .gz), or a "
                        "directory with edgetrain-data.toml (your NumPy or CSV files, model/README.md \"Your own "
                        "data\": its [test] split, scaled as it says); a model with batchnorm needs it: its "
                        "running statistics are recalibrated on these examples first (as edgetrain-server "
                        "evaluate does) and so are also in --onnx's file")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a line")
    parser.add_argument("--scaling", choices=["per-example-standardize", "none"],
                        help="how edgetrain scaled the examples (default: the data description's scaling with a "
                             "--data directory holding edgetrain-data.toml, else per-example-standardize, IDX "
                             "data's): none for a model converted by tools/onnx_to_edgetrain.py and trained on "
                             "data described with scaling = \"none\". A description's scaling = \"scale\" is "
                             "applied to the examples before the model (--onnx's model then takes scaled values)")
    parser.add_argument("--onnx", metavar="FILE", help="also write the model as ONNX (torch.onnx.export) to FILE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    user_data = None
    if args.data and os.path.isfile(os.path.join(args.data, "edgetrain-data.toml")) and \
            args.data not in ("mnist", "mnist-small", "fashion-mnist"):
        try:
            user_data = read_user_test_split(args.data)
        except DataError as e:
            print(f"checkpoint_to_torch.py: --data {args.data}: {e}", file=sys.stderr)
            return 2
        described = user_data[2][0]
        if args.scaling and args.scaling != (described if described != "scale" else "none"):
            print(f"checkpoint_to_torch.py: --scaling {args.scaling}, but {args.data}/edgetrain-data.toml says "
                  f"scaling = \"{described}\" (the scaling edgetrain trained with): leave --scaling out",
                  file=sys.stderr)
            return 2
        args.scaling = "none" if described == "scale" else described
    try:
        module, metadata = load_checkpoint(args.checkpoint, args.model, args.scaling or "per-example-standardize")
    except ValueError as e:  # a model this loader cannot rebuild: say which and why, no traceback
        print(f"checkpoint_to_torch.py: {args.checkpoint}: {e}", file=sys.stderr)
        return 2
    result = {"checkpoint": args.checkpoint, "model": args.model or metadata.get("edgetrain.model"),
              "version": int(metadata.get("edgetrain.version", 0))}
    if module.batch_norms() and not args.data:
        print(f"checkpoint_to_torch.py: {args.checkpoint}: the model has 'batchnorm' layers, whose running "
              f"statistics a checkpoint does not hold (model/README.md, \"Normalization state\"): give --data "
              f"to recalibrate them on its test images", file=sys.stderr)
        return 2
    if user_data is not None:
        images, labels, (scaling, scale, offset) = user_data
        if scaling == "scale":  # x * scale + offset in float32, as the trainer does
            images = images * np.float32(scale) + np.float32(offset)
        calibrate(module, images)
    elif args.data:
        images_path, labels_path = test_files(args.data)
        images, labels = read_idx(images_path), read_idx(labels_path)
        calibrate(module, images)
    if args.onnx:
        torch.onnx.export(module, module.example_input(), args.onnx, input_names=["images"], output_names=["logits"],
                          dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
        result["onnx"] = args.onnx
    if args.data:
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
