"""PyTorch counterpart of kernel_bench: one training step (forward, backward, SGD) of the
paper CNN on CPU, same batch and threads; prints one line in kernel_bench's format.
Run with /usr/bin/python3 (Debian's python3-torch installs there)."""
import argparse
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=10)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--warmup", type=int, default=3)
args = parser.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(1)


class PaperCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


model = PaperCnn()
assert sum(p.numel() for p in model.parameters()) == 421642
opt = torch.optim.SGD(model.parameters(), lr=0.01)
images = torch.randn(args.batch, 1, 28, 28)
labels = torch.randint(0, 10, (args.batch,))


def step():
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(args.warmup):
    step()
times = []
for _ in range(args.steps):
    start = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - start)
times.sort()
median = times[len(times) // 2]
B = args.batch
flops = 2 * (2 * B * 28 * 28 * 32 * 9) + 3 * (2 * B * 14 * 14 * 64 * 288 + 2 * B * 3136 * 128 + 2 * B * 128 * 10)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"pytorch-{torch.__version__} batch={B} threads={args.threads} ms_per_step={median * 1e3:.3f} "
      f"min_ms={times[0] * 1e3:.3f} gflops={flops / median / 1e9:.2f} peak_rss_mib={rss:.1f} loss={loss:.4f}")
