"""PyTorch counterpart of kernel_bench: one training step (forward, backward, SGD) of the
paper CNN (or, with --model, a built-in edge model of model/model.cc, the same layers and
parameter count) on CPU, same batch and threads; prints one line in kernel_bench's format.
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
parser.add_argument("--model", default="paper-cnn",
                    choices=["paper-cnn", "mobilenet-mini", "resnet-8", "resnet-8-32x32x3", "ds-cnn", "cnn1d"])
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


def conv(c, oc, k, stride=1, groups=1):
    """Our 'same' conv (pad (k-1)/2 on every side); a 1x1 is 'valid' either way."""
    return nn.Conv2d(c, oc, k, stride=stride, padding=(k - 1) // 2, groups=groups)


class MobilenetMini(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            conv(1, 32, 3, 2), nn.ReLU(), conv(32, 32, 3, groups=32), nn.ReLU(), conv(32, 64, 1), nn.ReLU(),
            conv(64, 64, 3, 2, groups=64), nn.ReLU(), conv(64, 128, 1), nn.ReLU(),
            conv(128, 128, 3, groups=128), nn.ReLU(), conv(128, 128, 1), nn.ReLU())
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class ResNet8(nn.Module):
    """model.cc's resnet-8: three residual stages, 1x1 strided projections, no normalization."""

    def __init__(self, channels):
        super().__init__()
        self.stem = conv(channels, 16, 3)
        self.a1, self.b1 = conv(16, 16, 3), conv(16, 16, 3)
        self.a2, self.b2, self.p2 = conv(16, 32, 3, 2), conv(32, 32, 3), conv(16, 32, 1, 2)
        self.a3, self.b3, self.p3 = conv(32, 64, 3, 2), conv(64, 64, 3), conv(32, 64, 1, 2)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        s0 = F.relu(self.stem(x))
        s1 = F.relu(self.b1(F.relu(self.a1(s0))) + s0)
        s2 = F.relu(self.b2(F.relu(self.a2(s1))) + self.p2(s1))
        s3 = F.relu(self.b3(F.relu(self.a3(s2))) + self.p3(s2))
        return self.fc(s3.mean((2, 3)))


class DsCnn(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [conv(1, 64, 3, 2), nn.ReLU()]
        for _ in range(4):
            layers += [conv(64, 64, 3, groups=64), nn.ReLU(), conv(64, 64, 1), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(64, 12)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class Cnn1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(9, 32, 5), nn.ReLU(), nn.Conv1d(32, 32, 5, stride=2), nn.ReLU(),
            nn.Conv1d(32, 64, 5), nn.ReLU(), nn.Conv1d(64, 64, 5, stride=2), nn.ReLU())
        self.fc = nn.Linear(64, 6)

    def forward(self, x):
        return self.fc(self.body(x).mean(2))


# name: (module, input shape without the batch, classes, parameters as model_test asserts)
MODELS = {
    "paper-cnn": (PaperCnn, (1, 28, 28), 10, 421642),
    "mobilenet-mini": (MobilenetMini, (1, 28, 28), 10, 30794),
    "resnet-8": (lambda: ResNet8(1), (1, 28, 28), 10, 77418),
    "resnet-8-32x32x3": (lambda: ResNet8(3), (3, 32, 32), 10, 77706),
    "ds-cnn": (DsCnn, (1, 49, 10), 12, 20620),
    "cnn1d": (Cnn1d, (9, 128), 6, 37862),
}
make, shape, classes, parameters = MODELS[args.model]
model = make()
assert sum(p.numel() for p in model.parameters()) == parameters, args.model
opt = torch.optim.SGD(model.parameters(), lr=0.01)
images = torch.randn(args.batch, *shape)
labels = torch.randint(0, classes, (args.batch,))


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
flops = 0 if args.model != "paper-cnn" else 2 * (2 * B * 28 * 28 * 32 * 9) + 3 * (2 * B * 14 * 14 * 64 * 288 + 2 * B * 3136 * 128 + 2 * B * 128 * 10)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
name = "" if args.model == "paper-cnn" else "-" + args.model
print(f"pytorch-{torch.__version__}{name} batch={B} threads={args.threads} ms_per_step={median * 1e3:.3f} "
      f"min_ms={times[0] * 1e3:.3f} gflops={flops / median / 1e9:.2f} peak_rss_mib={rss:.1f} loss={loss:.4f}")
