#!/usr/bin/python3
"""Writes a small data set of one's own for the tests, as a user would: Gaussian blobs,
one class per blob, examples of 8x8x1, in NumPy (.npz, deflated by savez_compressed or stored
by savez), .npy
(float32 or uint8) or CSV files, with the edgetrain-data.toml that describes them
(model/README.md, "Your own data"). Set-up ships no such data set, so tests make one.

usage: make_user_data.py DIR [--format npz|npz-stored|npy|npy-uint8|csv] [--classes 3] [--train 1500]
                         [--test 300] [--seed 1] [--shape 8x8x1 | --sequence LxC]

--shape HxWxC or --sequence LxC give the examples another shape (e.g. 49x10x1 for ds-cnn,
--sequence 128x9 for cnn1d: a sequence is described as `sequence = [L, C]`).

Each class's mean is a fixed random 8x8 pattern; an example is its class's pattern plus unit
Gaussian noise, so the classes overlap a little and a small network reaches well above chance
(1/classes) but needs some training to."""

import argparse
import os

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--format", default="npz", choices=["npz", "npz-stored", "npy", "npy-uint8", "csv"])
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--train", type=int, default=1500)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shape", default="8x8x1", help="HxWxC of an example")
    parser.add_argument("--sequence", help="LxC: examples are sequences of L steps of C channels")
    args = parser.parse_args()
    if args.sequence:
        length, channels = (int(v) for v in args.sequence.split("x"))
        shape, described = (1, length, channels), f"sequence = [{length}, {channels}]"
    else:
        shape = tuple(int(v) for v in args.shape.split("x"))
        described = f"example_shape = [{shape[0]}, {shape[1]}, {shape[2]}]"
    values = shape[0] * shape[1] * shape[2]

    rng = np.random.default_rng(args.seed)
    means = rng.normal(0.0, 0.3, size=(args.classes, *shape))

    def blobs(n):
        y = rng.integers(0, args.classes, size=n)
        x = means[y] + rng.normal(0.0, 1.0, size=(n, *shape))
        return x.astype(np.float32), y.astype(np.int64)

    x_train, y_train = blobs(args.train)
    x_test, y_test = blobs(args.test)
    os.makedirs(args.dir, exist_ok=True)
    path = lambda name: os.path.join(args.dir, name)
    description = [f"num_classes = {args.classes}", described]

    if args.format in ("npz", "npz-stored"):
        # savez_compressed deflates each member; savez stores them (read in place by a worker).
        save = np.savez_compressed if args.format == "npz" else np.savez
        save(path("blobs.npz"), x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
        for split in ("train", "test"):
            description += [f"[{split}]", 'features = "blobs.npz"', f'features_array = "x_{split}"',
                            'labels = "blobs.npz"', f'labels_array = "y_{split}"']
    elif args.format in ("npy", "npy-uint8"):
        if args.format == "npy-uint8":
            # Grey values around 128: the default per-example standardization undoes the offset.
            to_bytes = lambda x: np.clip(x * 32 + 128, 0, 255).astype(np.uint8)
            x_train, x_test = to_bytes(x_train), to_bytes(x_test)
        for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
            np.save(path(f"{split}-x.npy"), x)
            np.save(path(f"{split}-y.npy"), y.astype(np.int32))
            description += [f"[{split}]", f'features = "{split}-x.npy"',
                            f'labels = "{split}-y.npy"']
    else:
        description.insert(2, 'scaling = "none"')
        for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
            with open(path(f"{split}.csv"), "w") as out:
                out.write(",".join(["label"] + [f"p{i}" for i in range(values)]) + "\n")
                for features, label in zip(x.reshape(len(x), -1), y):
                    out.write(f"{label}," + ",".join(f"{v:.4f}" for v in features) + "\n")
            description += [f"[{split}]", f'features = "{split}.csv"', 'label_column = "label"']
    with open(path("edgetrain-data.toml"), "w") as out:
        out.write("\n".join(description) + "\n")


if __name__ == "__main__":
    main()
