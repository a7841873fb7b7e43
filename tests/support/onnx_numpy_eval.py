#!/usr/bin/python3
"""Runs an ONNX file that server/checkpoint_to_torch.py --onnx wrote, with NumPy only, on a
test set, and prints {"accuracy": ..., "loss": ..., "operators": [...]} as JSON.

Why a NumPy interpreter: Debian bookworm ships the `onnx` package (python3-onnx 1.12: the
format, its checker) but no runtime to execute a model (onnxruntime is not packaged, and
onnx's own reference evaluator arrived in 1.13). Executing the file, rather than only
checking it, is what shows the export is the trained model: e2e_run_end compares this
accuracy with edgetrain-server evaluate's. Only the operators such an export uses are
implemented; any other one is an error, not a guess.

usage: onnx_numpy_eval.py MODEL.onnx --data NAME|DIR
"""
import argparse
import json
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server"))
from checkpoint_to_torch import read_idx, test_files  # noqa: E402  (the loader's data reading, not a copy)


def attributes(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def conv2d(x, w, b, pads, strides):
    """NCHW convolution (group 1, dilation 1) as one matrix product over im2col patches."""
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (x.shape[2] - kh) // strides[0] + 1
    ow = (x.shape[3] - kw) // strides[1] + 1
    patches = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            patches[:, :, i, j] = x[:, :, i:i + strides[0] * oh:strides[0], j:j + strides[1] * ow:strides[1]]
    out = np.einsum("nckluv,ockl->nouv", patches, w, optimize=True)
    return out + b.reshape(1, oc, 1, 1)


def max_pool(x, kernel, strides):
    n, c, h, w = x.shape
    oh, ow = (h - kernel[0]) // strides[0] + 1, (w - kernel[1]) // strides[1] + 1
    out = np.full((n, c, oh, ow), -np.inf, dtype=x.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            out = np.maximum(out, x[:, :, i:i + strides[0] * oh:strides[0], j:j + strides[1] * ow:strides[1]])
    return out


def run_node(node, v):
    a = attributes(node)
    x = [v[name] if name else None for name in node.input]
    op = node.op_type
    if op == "Constant":
        return numpy_helper.to_array(a["value"])
    if op == "Flatten":
        axis = a.get("axis", 1)
        return x[0].reshape(int(np.prod(x[0].shape[:axis])), -1)
    if op == "Cast":
        return x[0].astype(onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[a["to"]])
    if op == "ReduceMean":
        return x[0].mean(axis=tuple(a["axes"]), keepdims=bool(a.get("keepdims", 1)))
    if op in ("Sub", "Mul", "Pow", "Add", "Div"):
        return {"Sub": np.subtract, "Mul": np.multiply, "Pow": np.power, "Add": np.add, "Div": np.divide}[op](x[0], x[1])
    if op == "Sqrt":
        return np.sqrt(x[0])
    if op == "Reciprocal":
        return 1 / x[0]
    if op == "Clip":
        low = x[1] if len(x) > 1 and x[1] is not None else None
        high = x[2] if len(x) > 2 and x[2] is not None else None
        return np.clip(x[0], low, high)
    if op == "Shape":
        return np.array(x[0].shape, dtype=np.int64)
    if op == "Gather":
        return np.take(x[0], x[1], axis=a.get("axis", 0))
    if op == "Unsqueeze":
        return np.expand_dims(x[0], tuple(int(i) for i in x[1]))
    if op == "Concat":
        return np.concatenate([np.atleast_1d(t) for t in x], axis=a["axis"])
    if op == "Reshape":
        return x[0].reshape(tuple(int(d) for d in x[1]))
    if op == "Transpose":
        return x[0].transpose(a["perm"])
    if op == "Conv":
        if a.get("group", 1) != 1 or any(d != 1 for d in a.get("dilations", [1, 1])):
            raise ValueError("Conv with groups or dilation is not implemented here")
        return conv2d(x[0], x[1], x[2], a.get("pads", [0, 0, 0, 0]), a.get("strides", [1, 1]))
    if op == "Relu":
        return np.maximum(x[0], 0)
    if op == "MaxPool":
        if any(p != 0 for p in a.get("pads", [0, 0, 0, 0])) or a.get("ceil_mode", 0):
            raise ValueError("MaxPool with padding or ceil_mode is not implemented here")
        return max_pool(x[0], a["kernel_shape"], a["strides"])
    if op == "Gemm":
        b = x[1].T if a.get("transB", 0) else x[1]
        y = a.get("alpha", 1.0) * ((x[0].T if a.get("transA", 0) else x[0]) @ b)
        return y + a.get("beta", 1.0) * x[2] if len(x) > 2 else y
    raise ValueError(f"operator {op} is not implemented by this NumPy interpreter")


def run_model(model, images):
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values[model.graph.input[0].name] = images
    for node in model.graph.node:
        values[node.output[0]] = run_node(node, values)
    return values[model.graph.output[0].name]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument("--data", required=True, help="mnist, mnist-small, fashion-mnist or a directory of IDX files")
    args = parser.parse_args()
    model = onnx.load(args.model)
    onnx.checker.check_model(model)
    images_path, labels_path = test_files(args.data)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim == 3:
        images = images[..., None]
    correct, loss_sum = 0, 0.0
    for start in range(0, len(labels), 200):
        x = images[start:start + 200].astype(np.float32).transpose(0, 3, 1, 2)
        logits = run_model(model, x).astype(np.float64)
        y = labels[start:start + 200].astype(np.int64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss_sum += float(-log_softmax[np.arange(len(y)), y].sum())
        correct += int((logits.argmax(axis=1) == y).sum())
    print(json.dumps({"accuracy": correct / len(labels), "loss": loss_sum / len(labels),
                      "operators": sorted({n.op_type for n in model.graph.node})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
