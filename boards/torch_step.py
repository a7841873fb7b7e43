"""PyTorch's side of boards/count-instructions.sh --torch (issue 40 part 5): training steps of
the paper CNN exactly as edgetrain's worker takes them, on one thread, with marks around the
measured steps for boards/qemu-plugins/phase_insns.c.

The same step as edgetrain's runtime::Trainer + sgd_update (model/model.cc `paper-cnn`,
model/trainer.cc, kernels/reference.cc):
  input 28x28x1; conv 32 3x3 same relu; maxpool 2; conv 64 3x3 same relu; maxpool 2;
  fc 128 relu; fc 10 (421,642 parameters), mean softmax cross-entropy, plain SGD (no
  momentum, no weight decay), Glorot-uniform weights and zero biases;
  from raw uint8 pixels, standardized per image inside the step as the Trainer does:
  (x - mean) / max(stddev, 1/sqrt(784)) with the population stddev.
Data: consecutive batches of the MNIST training IDX files in --data. edgetrain's
kernel_bench, whose count this is compared with, repeats one batch of random pixels; the data
barely moves a count (PyTorch's steps here, each on other digits, differ by under 0.01 %).

Marks: os.close(MARK + k) on descriptor numbers above 2^30, which no process has open (Linux
caps descriptors at fs.nr_open, 2^20 by default), so close() fails with EBADF and changes
nothing; the plugin (syscall=57, close on aarch64) starts a phase at each. Per step:
  MARK+0 "step":    zero_grad, uint8 -> float, per-image standardization
  MARK+1 "forward": the forward pass and the loss
  MARK+2 "backward": loss.backward()
  MARK+3 "sgd":     optimizer.step() and loss.item() (edgetrain's step returns its loss)
--warmup steps first without marks (PyTorch allocates and picks kernels in its first calls),
then --steps + 1 marked steps and a last "step" mark that closes them: the plugin skips the
first marked step and reports the mean of the other --steps.
Prints one line like kernel_bench's when done. Not a test; run under qemu-aarch64 by
count-instructions.sh, or anywhere with `python3 boards/torch_step.py --data DIR`.
"""
import argparse
import gzip
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MARK = 0x7E570000  # 2,119,630,848: above any descriptor the kernel can hand out


def mark(k):
    try:
        os.close(MARK + k)
    except OSError:
        pass


def read_idx(path, count):
    """The first `count` items of an IDX file of unsigned bytes (gzip or raw), as numpy."""
    opener = open
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            opener = gzip.open
    with opener(path, "rb") as f:
        magic = struct.unpack(">I", f.read(4))[0]
        if magic >> 8 != 0x08:
            raise SystemExit(f"{path}: not an unsigned-byte IDX file (magic {magic:#x})")
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        if dims[0] < count:
            raise SystemExit(f"{path}: {dims[0]} items, {count} needed")
        item = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        return np.frombuffer(f.read(count * item), dtype=np.uint8).reshape((count,) + dims[1:])


class PaperCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(7 * 7 * 64, 128)
        self.fc2 = nn.Linear(128, 10)
        # edgetrain's Model::initialize: Glorot uniform over fan_in + fan_out, zero biases.
        for layer in (self.conv1, self.conv2, self.fc1, self.fc2):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def standardize(pixels):
    """tf.image.per_image_standardization, as kernels::standardize_per_image."""
    x = pixels.to(torch.float32)
    flat = x.view(x.shape[0], -1)
    mean = flat.mean(dim=1, keepdim=True)
    std = flat.std(dim=1, unbiased=False, keepdim=True)
    scale = 1.0 / torch.clamp(std, min=1.0 / flat.shape[1] ** 0.5)
    return ((flat - mean) * scale).view_as(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="measured steps")
    parser.add_argument("--warmup", type=int, default=3, help="unmarked steps first")
    parser.add_argument("--data", default=os.path.join(
        os.environ.get("EDGETRAIN_DEPS", "/var/cache/edgetrain"), "mnist-full"))
    parser.add_argument("--lr", type=float, default=0.01, help="kernel_bench's")
    parser.add_argument("--no-marks", action="store_true", help="run without the close() marks")
    args = parser.parse_args()

    # One thread, as edgetrain's count (kernel_bench --threads 1). OPENBLAS_NUM_THREADS and
    # OMP_NUM_THREADS are set by the caller too: OpenBLAS reads its own at load time.
    torch.set_num_threads(1)
    torch.manual_seed(1)

    total = args.warmup + args.steps + 1
    B = args.batch
    images = torch.from_numpy(read_idx(os.path.join(args.data, "train-images-idx3-ubyte"),
                                       total * B).copy()).view(total * B, 1, 28, 28)
    labels = torch.from_numpy(read_idx(os.path.join(args.data, "train-labels-idx1-ubyte"),
                                       total * B).astype(np.int64))
    batches = [(images[i * B:(i + 1) * B], labels[i * B:(i + 1) * B]) for i in range(total)]

    model = PaperCnn()
    assert sum(p.numel() for p in model.parameters()) == 421642
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    marks = not args.no_marks
    loss = float("nan")
    for i, (pixels, target) in enumerate(batches):
        marked = marks and i >= args.warmup
        if marked:
            mark(0)
        opt.zero_grad(set_to_none=True)
        x = standardize(pixels)
        if marked:
            mark(1)
        out = F.cross_entropy(model(x), target)
        if marked:
            mark(2)
        out.backward()
        if marked:
            mark(3)
        opt.step()
        loss = out.item()
    if marks:
        mark(0)  # closes the last measured step; what follows (exit) is not counted
    print(f"pytorch-{torch.__version__} batch={B} threads={torch.get_num_threads()} "
          f"steps={args.steps} warmup={args.warmup} loss={loss:.4f}")


if __name__ == "__main__":
    main()
