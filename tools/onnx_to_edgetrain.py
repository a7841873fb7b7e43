#!/usr/bin/python3
"""Convert an ONNX classifier (as torch.onnx.export writes it) to an edgetrain model spec and its
initial weights, so that a model defined in PyTorch trains on edgetrain's workers.

    /usr/bin/python3 tools/onnx_to_edgetrain.py model.onnx --out my-model
        writes my-model.spec (the spec language of model/README.md, one statement a line)
        and my-model.safetensors (the weights under edgetrain's tensor names and layouts);
    edgetrain-sim --model my-model.spec --init-from my-model.safetensors --data DIR ...
    edgetrain-server --model my-model.spec --init-from my-model.safetensors ...

Operators (each maps to one spec statement, or to none):
    Conv (2-D; group 1 -> conv, group = channels -> dwconv; 1-D without padding -> conv1d
    on an input N x C x L, 'input LxC sequence'), Gemm, MatMul (+ Add of a
    constant bias) -> fc, Relu -> relu (fused into the layer before it), MaxPool 2x2/2 ->
    maxpool 2, AveragePool KxK/K -> avgpool K (and the Pad of zeros torch puts before it),
    GlobalAveragePool -> globalavgpool, Flatten and Reshape to (N, -1) -> nothing (fc flattens), BatchNormalization -> batchnorm, Add of two
    tensors -> add (residual), Dropout -> dropout P, Identity -> nothing; group norm -> groupnorm G,
    both as opset 18's GroupNormalization (scale and bias per group, or per channel as opset 21
    has them) and as torch 1.13 exports nn.GroupNorm (which has no opset 18): Reshape to
    (N, G, -1), InstanceNormalization with unit scale and zero bias, Reshape back to the input's
    Shape, then Mul and Add of the per-channel weight and bias (or neither, affine=False).
Every other operator is refused by name with its node's name, and so is an attribute the spec
cannot say (dilations, asymmetric or non-'same' padding, auto_pad, ceil_mode, strides that
differ by axis, transposed Gemm inputs); nothing is written then (exit 2).

The model must take one input N x C x H x W (or N x C x L, or N x F) float tensor and end in a Conv, Gemm or
MatMul producing the class logits. edgetrain feeds the network the examples as the data
description scales them (model/README.md, "Your own data"): to see the same numbers PyTorch
sees, store the features as PyTorch's input (channels last, H x W x C) with scaling = "none".

Needs Debian's python3-onnx and python3-numpy (toolchains/setup-deps.sh installs both)."""
import argparse
import json
import os
import struct
import sys
import zlib

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper, shape_inference
except ImportError as e:  # the module is named; the caller's exit status says "cannot run"
    print(f"onnx_to_edgetrain.py: needs python3-onnx and python3-numpy (Debian): {e}", file=sys.stderr)
    sys.exit(3)


class ConversionError(Exception):
    """A model the spec language cannot say: the message names the operator or attribute."""


def attributes(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def describe(node):
    return f"node {node.name or '(unnamed)'}"


def refuse_attribute(node, name, value, why):
    raise ConversionError(f"unsupported attribute {name}={value} of ONNX operator '{node.op_type}' "
                          f"({describe(node)}): {why}")


def infer_shapes(model):
    """onnx's shape inference, plus two outputs whose shape is their input's that it leaves
    unknown: GroupNormalization's (an operator of opset 18, newer than Debian's onnx 1.12) and
    a Reshape to the Shape of a tensor (torch's export of nn.GroupNorm), inferred again until
    nothing is added, so the layers after a group norm get their shapes too."""
    while True:
        model = shape_inference.infer_shapes(model)
        graph = model.graph
        known = {i.name: i for i in list(graph.value_info) + list(graph.input) + list(graph.output)
                 if i.type.tensor_type.shape.dim}
        shape_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Shape" and not attributes(n)}
        added = False
        for node in graph.node:
            same_as = (node.input[0] if node.op_type == "GroupNormalization" else
                       shape_of.get(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None)
            if same_as in known and node.output[0] not in known:
                for stale in [i for i in graph.value_info if i.name == node.output[0]]:
                    graph.value_info.remove(stale)
                info = onnx.ValueInfoProto()
                info.CopyFrom(known[same_as])
                info.name = node.output[0]
                graph.value_info.append(info)
                added = True
        if not added:
            return model


class Converter:
    """Walks the ONNX graph in its (topological) order and writes one spec statement per layer.

    edgetrain's spec is a chain with a current tensor; a layer reading another tensor gets
    'from A', an Add of two tensors 'add A', and the tensor read so gets 'name A' right after
    the statement that made it (inserted when the reference is met)."""

    def __init__(self, model):
        self.model = infer_shapes(model)
        graph = self.model.graph
        self.constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant":
                value = attributes(node).get("value")
                if value is not None:
                    self.constants[node.output[0]] = numpy_helper.to_array(value)
        self.shapes = {}
        for info in list(graph.value_info) + list(graph.input) + list(graph.output):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]
            self.shapes[info.name] = dims
        self.consumers = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.statements = []   # [text], one spec statement each
        self.produced_at = {}  # ONNX tensor -> index of the statement after which it is current
        self.names = {}        # ONNX tensor -> its 'name' in the spec
        self.alias = {}        # tensor -> the tensor it equals (Identity, Flatten, eval Dropout)
        self.flattened = {}    # tensor -> (C, H, W) of the image a Flatten/Reshape made it from
        self.tensors = {}      # edgetrain tensor name -> numpy array in edgetrain's layout
        self.counts = {}       # layer kind -> how many so far (conv1, conv2, fc1, ...)
        self.current = None

    # -- tensors and names ---------------------------------------------------------------
    def resolve(self, name):
        while name in self.alias:
            name = self.alias[name]
        return name

    def shape(self, name):
        dims = self.shapes.get(name)
        if dims is None or any(d is None for d in dims[1:]):
            raise ConversionError(f"the shape of tensor '{name}' is unknown (export with a fixed input shape)")
        return dims

    def spec_name(self, tensor):
        """The spec's name for an ONNX tensor, adding 'name A' after the statement that made it."""
        if tensor not in self.names:
            name = "t%d" % (len(self.names) + 1)
            self.names[tensor] = name
            at = self.produced_at[tensor]
            self.statements.insert(at + 1, f"name {name}")
            for other, index in self.produced_at.items():  # statements after it moved down by one
                if index > at:
                    self.produced_at[other] = index + 1
        return self.names[tensor]

    def read(self, tensor):
        """Makes `tensor` the input of the next layer: nothing, or 'from A'."""
        tensor = self.resolve(tensor)
        if tensor in self.flattened and self.flattened[tensor] is not None and tensor != self.current:
            raise ConversionError(f"tensor '{tensor}' is flattened and read by a layer other than the next one")
        if tensor != self.current:
            self.emit(f"from {self.spec_name(tensor)}", None)
        return tensor

    def emit(self, text, output):
        self.statements.append(text)
        if output is not None:
            self.produced_at[output] = len(self.statements) - 1
            self.current = output

    def next_index(self, kind):
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return self.counts[kind]

    def constant(self, node, name, what):
        if name not in self.constants:
            raise ConversionError(f"the {what} of ONNX operator '{node.op_type}' ({describe(node)}) is not a "
                                  f"constant: edgetrain trains it as a parameter only when it is an initializer")
        return self.constants[name].astype(np.float32)

    # -- operators -----------------------------------------------------------------------
    def convert(self):
        graph = self.model.graph
        inputs = [i for i in graph.input if i.name not in self.constants]
        if len(inputs) != 1:
            raise ConversionError(f"the model has {len(inputs)} inputs; edgetrain models take one")
        dims = self.shape(inputs[0].name)
        if len(dims) == 4:
            _, C, H, W = dims
            self.statements.append(f"input {H}x{W}x{C}")
        elif len(dims) == 3:  # N x C x L: a sequence, edgetrain's 1 x L x C image
            _, C, L = dims
            self.statements.append(f"input {L}x{C} sequence")
        elif len(dims) == 2:
            self.statements.append(f"input 1x1x{dims[1]}")
        else:
            raise ConversionError(f"input '{inputs[0].name}' has shape {dims}; N x C x H x W, N x C x L "
                                  f"or N x F is supported")
        self.produced_at[inputs[0].name] = 0
        self.current = inputs[0].name
        if len(dims) == 2:
            self.flattened[inputs[0].name] = None
        handlers = {"Conv": self.conv, "Gemm": self.gemm, "MatMul": self.matmul, "Relu": self.relu,
                    "MaxPool": self.maxpool, "AveragePool": self.avgpool,
                    "GlobalAveragePool": self.global_avgpool, "Flatten": self.flatten,
                    "Reshape": self.reshape, "BatchNormalization": self.batchnorm, "Add": self.add,
                    "Dropout": self.dropout, "Identity": self.identity, "Pad": self.pad,
                    "GroupNormalization": self.group_normalization}
        self.skip = set()
        # PyTorch's padding modes other than zeros export as a Pad node computed from the
        # input's shape (Shape, ConstantOfShape, ...): name the padding mode, the cause, rather
        # than the first helper operator met on the way.
        for node in graph.node:
            mode = attributes(node).get("mode", b"constant") if node.op_type == "Pad" else b"constant"
            mode = mode.decode() if isinstance(mode, bytes) else mode
            if mode != "constant":
                refuse_attribute(node, "mode", mode, "edgetrain pads only inside a conv, with zeros "
                                 "(padding_mode='zeros' in PyTorch)")
        for node in graph.node:
            if node.op_type == "Constant" or id(node) in self.skip:
                continue
            handler = handlers.get(node.op_type)
            if handler is None:
                raise ConversionError(f"unsupported ONNX operator '{node.op_type}' ({describe(node)}); "
                                      f"supported: {', '.join(sorted(handlers))}")
            handler(node)
        if len(graph.output) != 1 or self.resolve(graph.output[0].name) != self.current:
            raise ConversionError("the model must have one output, the last layer's logits")
        last = self.statements[-1].split()[0]
        if last not in ("fc", "conv", "conv1d"):
            raise ConversionError(f"the model's output comes from '{last}'; edgetrain's last layer is fc or conv "
                                  f"(a final Softmax or LogSoftmax belongs in the loss, not the model)")
        return self.statements, self.tensors

    def conv(self, node):
        a = attributes(node)
        weight = self.constant(node, node.input[1], "weight")
        if weight.ndim == 3:
            return self.conv1d(node, a, weight)
        if weight.ndim != 4:
            raise ConversionError(f"ONNX operator 'Conv' ({describe(node)}) with a {weight.ndim - 2}-D kernel: "
                                  f"only 1-D and 2-D convolutions are converted")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            refuse_attribute(node, "auto_pad", a["auto_pad"], "give explicit pads (padding=K//2 or 0 in PyTorch)")
        dilations = list(a.get("dilations", [1, 1]))
        if any(d != 1 for d in dilations):
            refuse_attribute(node, "dilations", dilations, "edgetrain's convolutions are not dilated")
        kh, kw = weight.shape[2], weight.shape[3]
        if kh != kw:
            refuse_attribute(node, "kernel_shape", [kh, kw], "edgetrain's kernels are square")
        strides = list(a.get("strides", [1, 1]))
        if strides[0] != strides[1]:
            refuse_attribute(node, "strides", strides, "the same stride on both axes is supported")
        pads = list(a.get("pads", [0, 0, 0, 0]))
        if all(p == 0 for p in pads):
            padding = "valid"
        elif kh % 2 == 1 and all(p == (kh - 1) // 2 for p in pads):
            padding = "same"
        else:
            refuse_attribute(node, "pads", pads, f"edgetrain pads 0 ('valid') or (K-1)/2 = {(kh - 1) // 2} "
                             f"on every side ('same')")
        source = self.read(node.input[0])
        in_channels = self.shape(source)[1]
        group = a.get("group", 1)
        out_channels = weight.shape[0]
        stride = f" stride {strides[0]}" if strides[0] != 1 else ""
        bias = (self.constant(node, node.input[2], "bias") if len(node.input) > 2 and node.input[2]
                else np.zeros(out_channels, np.float32))
        if group == 1:
            n = self.next_index("conv")
            self.tensors[f"conv{n}.weight"] = weight.transpose(0, 2, 3, 1)  # [OC][C][K][K] -> [OC][K][K][C]
            self.tensors[f"conv{n}.bias"] = bias
            text = f"conv {out_channels} {kh}x{kw}{stride} {padding}"
        elif group == in_channels and out_channels == in_channels:
            n = self.next_index("dwconv")
            self.tensors[f"dwconv{n}.weight"] = weight.transpose(0, 2, 3, 1)  # [C][1][K][K] -> [C][K][K][1]
            self.tensors[f"dwconv{n}.bias"] = bias
            text = f"dwconv {kh}x{kw}{stride} {padding}"
        else:
            refuse_attribute(node, "group", group, f"1 (conv) or the {in_channels} input channels with as many "
                             f"outputs (depthwise, channel multiplier 1) are supported")
        self.emit(text, node.output[0])

    def conv1d(self, node, a, weight):
        """Conv1d over N x C x L -> 'conv1d OC K [stride S] valid' (edgetrain's conv1d pads
        nothing: a padded one is refused by name, as the spec refuses 'same')."""
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            refuse_attribute(node, "auto_pad", a["auto_pad"], "give explicit pads")
        if any(d != 1 for d in a.get("dilations", [1])):
            refuse_attribute(node, "dilations", list(a["dilations"]), "edgetrain's convolutions are not dilated")
        if any(a.get("pads", [0, 0])):
            refuse_attribute(node, "pads", list(a["pads"]), "edgetrain's conv1d is 'valid' only (padding=0)")
        if a.get("group", 1) != 1:
            refuse_attribute(node, "group", a["group"], "1-D convolutions are not grouped in edgetrain")
        self.read(node.input[0])
        out_channels, _, k = weight.shape
        stride = list(a.get("strides", [1]))[0]
        bias = (self.constant(node, node.input[2], "bias") if len(node.input) > 2 and node.input[2]
                else np.zeros(out_channels, np.float32))
        n = self.next_index("conv")
        self.tensors[f"conv{n}.weight"] = weight.transpose(0, 2, 1)[:, None, :, :]  # [OC][C][K] -> [OC][1][K][C]
        self.tensors[f"conv{n}.bias"] = bias
        self.emit(f"conv1d {out_channels} {k}" + (f" stride {stride}" if stride != 1 else "") + " valid",
                  node.output[0])

    def linear(self, node, weight_in_out, bias):
        """An fc layer from a weight [IN][OUT] (as MatMul takes it)."""
        source = self.read(node.input[0])
        out = weight_in_out.shape[1]
        weight = weight_in_out.T  # [OUT][IN]
        image = self.flattened.get(source)
        if image is not None:  # PyTorch flattened C x H x W; edgetrain flattens H x W x C
            C, H, W = image
            weight = weight.reshape(out, C, H, W).transpose(0, 2, 3, 1).reshape(out, H * W * C)
        elif len(self.shape(source)) > 2:
            raise ConversionError(f"ONNX operator '{node.op_type}' ({describe(node)}) reads a "
                                  f"{len(self.shape(source))}-D tensor; flatten it first")
        n = self.next_index("fc")
        self.tensors[f"fc{n}.weight"] = weight
        self.tensors[f"fc{n}.bias"] = bias
        return f"fc {out}"

    def gemm(self, node):
        a = attributes(node)
        if a.get("transA", 0) != 0:
            refuse_attribute(node, "transA", a["transA"], "the input must not be transposed")
        for name in ("alpha", "beta"):
            if a.get(name, 1.0) != 1.0:
                refuse_attribute(node, name, a[name], "only 1 is supported")
        weight = self.constant(node, node.input[1], "weight")
        if a.get("transB", 0):
            weight = weight.T
        bias = (self.constant(node, node.input[2], "bias") if len(node.input) > 2 and node.input[2]
                else np.zeros(weight.shape[1], np.float32))
        if bias.shape != (weight.shape[1],):
            raise ConversionError(f"the bias of ONNX operator 'Gemm' ({describe(node)}) has shape "
                                  f"{list(bias.shape)}, not [{weight.shape[1]}]")
        self.emit(self.linear(node, weight, bias), node.output[0])

    def matmul(self, node):
        weight = self.constant(node, node.input[1], "weight")
        if weight.ndim != 2:
            raise ConversionError(f"ONNX operator 'MatMul' ({describe(node)}) with a {weight.ndim}-D weight")
        bias, output = np.zeros(weight.shape[1], np.float32), node.output[0]
        users = self.consumers.get(output, [])
        if len(users) == 1 and users[0].op_type == "Add":  # MatMul + Add(bias) is one fc layer
            add = users[0]
            other = add.input[1] if add.input[0] == output else add.input[0]
            if other in self.constants and self.constants[other].size == weight.shape[1]:
                bias = self.constants[other].astype(np.float32).reshape(-1)
                self.skip.add(id(add))
                output = add.output[0]
        self.emit(self.linear(node, weight, bias), output)

    def relu(self, node):
        source = self.resolve(node.input[0])
        last = self.statements[-1].split()
        fusable = (source == self.current and last[0] in ("conv", "conv1d", "dwconv", "fc", "add", "batchnorm", "groupnorm")
                   and "relu" not in last and len(self.consumers.get(source, [])) == 1
                   and source not in self.names)
        if fusable:
            self.statements[-1] += " relu"
            self.produced_at[node.output[0]] = len(self.statements) - 1
            self.current = node.output[0]
            self.flattened.pop(node.output[0], None)
        else:
            self.read(source)
            self.emit("relu", node.output[0])
        if source in self.flattened:
            self.flattened[node.output[0]] = self.flattened[source]

    def pool_attributes(self, node):
        a = attributes(node)
        kernel = list(a.get("kernel_shape", []))
        strides = list(a.get("strides", [1] * len(kernel)))
        pads = list(a.get("pads", [0] * 2 * len(kernel)))
        if len(kernel) != 2 or kernel[0] != kernel[1]:
            refuse_attribute(node, "kernel_shape", kernel, "a square 2-D window is supported")
        if strides != kernel:
            refuse_attribute(node, "strides", strides, "the stride must equal the window (non-overlapping pools)")
        if any(pads):
            refuse_attribute(node, "pads", pads, "pools are not padded")
        if a.get("ceil_mode", 0):
            refuse_attribute(node, "ceil_mode", a["ceil_mode"], "edgetrain's pools floor")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            refuse_attribute(node, "auto_pad", a["auto_pad"], "pools are not padded")
        if any(d != 1 for d in a.get("dilations", [1, 1])):
            refuse_attribute(node, "dilations", list(a["dilations"]), "pools are not dilated")
        if len(node.output) > 1 and node.output[1]:
            raise ConversionError(f"ONNX operator '{node.op_type}' ({describe(node)}) with an indices output")
        return kernel[0]

    def maxpool(self, node):
        if attributes(node).get("storage_order", 0):
            refuse_attribute(node, "storage_order", 1, "not supported")
        k = self.pool_attributes(node)
        if k != 2:
            refuse_attribute(node, "kernel_shape", [k, k], "edgetrain's max pool is 2x2, stride 2")
        self.read(node.input[0])
        self.emit("maxpool 2", node.output[0])

    def avgpool(self, node):
        k = self.pool_attributes(node)
        if k < 2:
            refuse_attribute(node, "kernel_shape", [k, k], "the window is at least 2x2")
        self.read(node.input[0])
        self.emit(f"avgpool {k}", node.output[0])

    def global_avgpool(self, node):
        self.read(node.input[0])
        self.emit("globalavgpool", node.output[0])

    def flatten_to_rows(self, node):
        source = self.resolve(node.input[0])
        dims = self.shape(source)
        if len(dims) < 2:  # shape inference left it unknown: the fc's weight order depends on it
            raise ConversionError(f"the shape of tensor '{source}', flattened by ONNX operator '{node.op_type}' "
                                  f"({describe(node)}), is unknown (export with a fixed input shape)")
        self.alias[node.output[0]] = source
        if len(dims) == 4:
            self.flattened[source] = (dims[1], dims[2], dims[3])
        elif len(dims) == 3:  # a sequence C x L, held by edgetrain as 1 x L x C
            self.flattened[source] = (dims[1], 1, dims[2])
        if source != self.current:
            raise ConversionError(f"ONNX operator '{node.op_type}' ({describe(node)}) flattens a tensor other "
                                  f"than the last layer's output")

    def flatten(self, node):
        if attributes(node).get("axis", 1) != 1:
            refuse_attribute(node, "axis", attributes(node)["axis"], "only axis=1 (keep the batch) is supported")
        self.flatten_to_rows(node)

    def reshape(self, node):
        users = self.consumers.get(node.output[0], [])
        if len(users) == 1 and users[0].op_type == "InstanceNormalization":
            return self.exported_group_norm(node, users[0])
        target = self.constants.get(node.input[1])
        source = self.shape(self.resolve(node.input[0]))
        per_example = int(np.prod(source[1:]))
        if target is None or len(target) != 2 or target[1] not in (-1, per_example) or target[0] not in (
                -1, 0) and (source[0] is None or target[0] != source[0]):
            raise ConversionError(f"ONNX operator 'Reshape' ({describe(node)}) to shape "
                                  f"{None if target is None else target.tolist()}: only a flatten to "
                                  f"(N, -1) is supported")
        self.flatten_to_rows(node)

    def batchnorm(self, node):
        a = attributes(node)
        if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
            raise ConversionError(f"ONNX operator 'BatchNormalization' ({describe(node)}) was exported in "
                                  f"training mode; export with model.eval()")
        eps = a.get("epsilon", 1e-5)
        if abs(eps - 1e-5) > 1e-9:
            refuse_attribute(node, "epsilon", eps, "edgetrain's batchnorm uses 1e-5")
        if len(self.shape(self.resolve(node.input[0]))) != 4:
            raise ConversionError(f"ONNX operator 'BatchNormalization' ({describe(node)}) on a 2-D tensor: "
                                  f"only BatchNorm2d is supported")
        self.read(node.input[0])
        n = self.next_index("bn")
        self.tensors[f"bn{n}.weight"] = self.constant(node, node.input[1], "scale")
        self.tensors[f"bn{n}.bias"] = self.constant(node, node.input[2], "bias")
        self.batchnorm_layers = getattr(self, "batchnorm_layers", 0) + 1
        self.emit("batchnorm", node.output[0])

    def emit_group_norm(self, node, source, groups, epsilon, weight, bias, output):
        """'groupnorm G' after checking what edgetrain's group norm computes: G divides the
        channels, epsilon 1e-5 (kernels/normalization.h), an image (N x C x H x W) input."""
        dims = self.shape(source)
        if len(dims) != 4:
            raise ConversionError(f"group norm ({describe(node)}) of a {len(dims)}-D tensor: only images "
                                  f"(N x C x H x W) are supported")
        channels = dims[1]
        if groups < 1 or channels % groups:
            raise ConversionError(f"group norm ({describe(node)}) with {groups} groups of {channels} channels: "
                                  f"the groups must divide the channels")
        if abs(epsilon - 1e-5) > 1e-9:
            refuse_attribute(node, "epsilon", epsilon, "edgetrain's groupnorm uses 1e-5")
        self.read(source)
        n = self.next_index("gn")
        self.tensors[f"gn{n}.weight"] = np.asarray(weight, np.float32).reshape(channels)
        self.tensors[f"gn{n}.bias"] = np.asarray(bias, np.float32).reshape(channels)
        self.emit(f"groupnorm {groups}", output)

    def group_normalization(self, node):
        """Opset 18's GroupNormalization: scale and bias per group (opset 18) or per channel
        (opset 21); a per-group value is the same for each channel of its group."""
        a = attributes(node)
        if "num_groups" not in a:
            raise ConversionError(f"ONNX operator 'GroupNormalization' ({describe(node)}) without num_groups")
        groups, source = int(a["num_groups"]), self.resolve(node.input[0])
        channels = self.shape(source)[1]
        scale = self.constant(node, node.input[1], "scale").reshape(-1)
        bias = self.constant(node, node.input[2], "bias").reshape(-1)
        if scale.size == groups and bias.size == groups and groups != channels and channels % groups == 0:
            scale, bias = np.repeat(scale, channels // groups), np.repeat(bias, channels // groups)
        if scale.size != channels or bias.size != channels:
            raise ConversionError(f"ONNX operator 'GroupNormalization' ({describe(node)}): scale and bias of "
                                  f"{scale.size} and {bias.size} values, neither the {groups} groups nor the "
                                  f"{channels} channels")
        self.emit_group_norm(node, source, groups, float(a.get("epsilon", 1e-5)), scale, bias, node.output[0])

    def exported_group_norm(self, reshape, instance_norm):
        """torch 1.13's nn.GroupNorm: Reshape(x, [0|N, G, -1]) -> InstanceNormalization(unit
        scale, zero bias) -> Reshape(_, Shape(x)) [-> Mul(weight [C,1,1]) -> Add(bias [C,1,1])].
        Anything else around an InstanceNormalization is refused by name: edgetrain has no
        instance norm of its own (it is 'groupnorm C', which this does not guess)."""
        def refuse(why):
            raise ConversionError(f"ONNX operator 'InstanceNormalization' ({describe(instance_norm)}) is "
                                  f"converted only as torch's export of nn.GroupNorm: {why}")
        source = self.resolve(reshape.input[0])
        dims = self.shape(source)
        target = self.constants.get(reshape.input[1])
        if len(dims) != 4 or target is None or len(target) != 3 or target[2] != -1 or target[0] not in (0, dims[0]):
            refuse(f"the Reshape before it ({describe(reshape)}) is not one to (N, G, -1) of an image")
        groups = int(target[1])
        scale = self.constant(instance_norm, instance_norm.input[1], "scale")
        bias = self.constant(instance_norm, instance_norm.input[2], "bias")
        if not (np.all(scale == 1) and np.all(bias == 0)):
            refuse("its scale is not 1 or its bias not 0")
        after = self.consumers.get(instance_norm.output[0], [])
        if len(after) != 1 or after[0].op_type != "Reshape":
            refuse("it is not followed by one Reshape back to the input's shape")
        back = after[0]
        shape_of = next((n for n in self.model.graph.node if back.input[1] in n.output), None)
        if not (shape_of is not None and shape_of.op_type == "Shape" and self.resolve(shape_of.input[0]) == source):
            refuse(f"the Reshape after it ({describe(back)}) is not to the Shape of its input")
        self.skip.update({id(instance_norm), id(back), id(shape_of)})
        channels, output = dims[1], back.output[0]
        weight, offset = np.ones(channels, np.float32), np.zeros(channels, np.float32)
        for op_type in ("Mul", "Add"):  # the affine part, each a constant of C values
            users = self.consumers.get(output, [])
            if len(users) != 1 or users[0].op_type != op_type:
                break
            user = users[0]
            other = user.input[1] if user.input[0] == output else user.input[0]
            value = self.constants.get(other)
            if value is None or value.size != channels or (value.ndim > 1 and value.shape[0] != channels):
                break
            if op_type == "Mul":
                weight = value.astype(np.float32).reshape(channels)
            else:
                offset = value.astype(np.float32).reshape(channels)
            self.skip.add(id(user))
            output = user.output[0]
        epsilon = float(attributes(instance_norm).get("epsilon", 1e-5))
        self.emit_group_norm(instance_norm, source, groups, epsilon, weight, offset, output)

    def add(self, node):
        left, right = (self.resolve(i) for i in node.input)
        for operand in (left, right):
            if operand in self.constants:
                raise ConversionError(f"ONNX operator 'Add' ({describe(node)}) adds a constant: only the sum of "
                                      f"two layers' outputs (a residual connection) or a MatMul's bias is supported")
        if self.shape(left) != self.shape(right):
            raise ConversionError(f"ONNX operator 'Add' ({describe(node)}) of shapes {self.shape(left)} and "
                                  f"{self.shape(right)}: broadcasting is not supported")
        if right == self.current:
            left, right = right, left
        self.read(left)
        self.emit(f"add {self.spec_name(right)}", node.output[0])

    def dropout(self, node):
        a = attributes(node)
        ratio = a.get("ratio", 0.5)
        if len(node.input) > 1 and node.input[1]:
            ratio = float(self.constant(node, node.input[1], "ratio"))
        if len(node.input) > 2 and node.input[2] and bool(self.constants.get(node.input[2], False)):
            raise ConversionError(f"ONNX operator 'Dropout' ({describe(node)}) in training mode; export with "
                                  f"model.eval()")
        if ratio <= 0:
            self.alias[node.output[0]] = self.resolve(node.input[0])
            return
        if not 0 < ratio < 1:
            refuse_attribute(node, "ratio", ratio, "dropout's rate is in (0, 1)")
        self.read(node.input[0])
        self.emit(f"dropout {ratio:g}", node.output[0])

    def pad(self, node):
        """torch exports F.avg_pool2d with a Pad of zeros before it: nothing. Any other padding
        is refused: edgetrain pads only inside a conv, with zeros ('same')."""
        a = attributes(node)
        pads = self.constants.get(node.input[1]) if len(node.input) > 1 else np.array(a.get("pads", []))
        mode = a.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if pads is not None and not np.any(pads):
            self.alias[node.output[0]] = self.resolve(node.input[0])
            return
        raise ConversionError(f"unsupported ONNX operator 'Pad' ({describe(node)}, mode={mode}, pads="
                              f"{None if pads is None else pads.tolist()}): edgetrain pads only inside a conv, "
                              f"with zeros (padding=K//2 and padding_mode='zeros' in PyTorch)")

    def identity(self, node):
        self.alias[node.output[0]] = self.resolve(node.input[0])


def safetensors_bytes(tensors, metadata):
    """A safetensors file (little-endian F32) sealed as edgetrain-server's checkpoints are
    (server/checkpoint_file.h: edgetrain.crc32 is the CRC-32 of the file with its 8 digits read
    as zeros), so --init-from of edgetrain-server and edgetrain-sim takes it as it is."""
    metadata = dict(metadata, **{"edgetrain.crc32": "00000000"})
    header, offset, chunks = {"__metadata__": metadata}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    blob = bytearray(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    needle = b'"edgetrain.crc32":"'
    at = blob.index(needle) + len(needle)
    blob[at:at + 8] = b"%08x" % (zlib.crc32(bytes(blob)) & 0xFFFFFFFF)
    return bytes(blob)


def convert_file(onnx_path):
    """(spec statements, {tensor name: array}) of an ONNX file; ConversionError for what the
    spec cannot say."""
    if not os.path.isfile(onnx_path):
        raise ConversionError("no such file")
    try:
        model = onnx.load(onnx_path)
    except Exception as e:  # onnx raises DecodeError and others for a file that is not ONNX
        raise ConversionError(f"not an ONNX model: {e}") from None
    return Converter(model).convert()


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog="Exit status: 0 written; 2 refused (the operator or attribute named) or unreadable; 3 without\n"
               "python3-onnx or python3-numpy. tools/README.md has the weight layouts and the choices of ours.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", help="the .onnx file (torch.onnx.export, eval mode, fixed input shape)")
    parser.add_argument("--out", required=True, metavar="PREFIX",
                        help="writes PREFIX.spec and PREFIX.safetensors")
    parser.add_argument("--print", action="store_true", help="also print the spec on stdout")
    args = parser.parse_args()
    try:
        statements, tensors = convert_file(args.onnx)
    except (ConversionError, OSError) as e:
        print(f"onnx_to_edgetrain.py: {args.onnx}: {e}", file=sys.stderr)
        return 2
    spec_text = "\n".join(statements) + "\n"
    one_line = "; ".join(statements)
    header = (f"# converted from {os.path.basename(args.onnx)} by tools/onnx_to_edgetrain.py;\n"
              f"# weights: {os.path.basename(args.out)}.safetensors\n")
    if any(s.startswith("batchnorm") for s in statements):
        header += ("# batchnorm: PyTorch's running statistics are not carried over; edgetrain recomputes\n"
                   "# them for every evaluation (model/README.md, \"Normalization state\")\n")
    metadata = {"edgetrain.model": header + spec_text, "edgetrain.converted_from": os.path.basename(args.onnx)}
    try:
        with open(args.out + ".spec", "w") as f:
            f.write(header + spec_text)
        with open(args.out + ".safetensors", "wb") as f:
            f.write(safetensors_bytes(tensors, metadata))
    except OSError as e:
        print(f"onnx_to_edgetrain.py: cannot write {args.out}.spec / .safetensors: {e}", file=sys.stderr)
        return 2
    count = sum(int(np.prod(a.shape)) for a in tensors.values())
    print(f"wrote {args.out}.spec ({len(statements)} statements) and {args.out}.safetensors "
          f"({len(tensors)} tensors, {count} parameters)")
    if args.print:
        print(one_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
