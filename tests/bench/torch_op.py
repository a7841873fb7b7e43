#!/usr/bin/python3
"""PyTorch CPU twin of `kernel_bench --op`: one layer's forward + backward (input, weight
and bias gradients, ReLU after the convolutions as the Trainer fuses it) on a
B x H x W x C input, median ms of 21 calls after one warm-up. Prints the same fields.
Benchmark only (Debian's python3-torch, /usr/bin/python3); never a test.
    tests/bench/torch_op.py --op dwconv3x3 --op-shape 14x14x32 --batch 10 --threads 1"""
import argparse
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--op", required=True,
                    choices=["conv1x1", "conv3x3s2", "dwconv3x3", "dwconv3x3s2", "avgpool2", "globalavgpool",
                             "groupnorm", "batchnorm"])
parser.add_argument("--op-shape", default="14x14x32")
parser.add_argument("--batch", type=int, default=10)
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()
torch.set_num_threads(args.threads)
H, W, C = (int(v) for v in args.op_shape.split("x"))
layers = {
    "conv1x1": lambda: nn.Sequential(nn.Conv2d(C, 2 * C, 1), nn.ReLU()),
    "conv3x3s2": lambda: nn.Sequential(nn.Conv2d(C, 2 * C, 3, stride=2, padding=1), nn.ReLU()),
    "dwconv3x3": lambda: nn.Sequential(nn.Conv2d(C, C, 3, padding=1, groups=C), nn.ReLU()),
    "dwconv3x3s2": lambda: nn.Sequential(nn.Conv2d(C, C, 3, stride=2, padding=1, groups=C), nn.ReLU()),
    "avgpool2": lambda: nn.AvgPool2d(2),
    "globalavgpool": lambda: nn.AdaptiveAvgPool2d(1),
    "groupnorm": lambda: nn.GroupNorm(8, C),  # 8 groups, as kernel_bench's
    "batchnorm": lambda: nn.BatchNorm2d(C),   # training mode: batch statistics
}
layer = layers[args.op]()
x = torch.randn(args.batch, C, H, W, requires_grad=True)
with torch.no_grad():
    dout = torch.randn_like(layer(x))


def step():
    x.grad = None
    layer.zero_grad(set_to_none=True)
    layer(x).backward(dout)


step()
times = []
for _ in range(21):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
times.sort()
print(f"op=torch-{args.op} shape={args.op_shape} batch={args.batch} threads={args.threads} "
      f"ms_fwd_bwd={times[len(times) // 2] * 1e3:.3f}")
