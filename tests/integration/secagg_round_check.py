#!/usr/bin/env python3
"""Checks one secure round of tests/integration/rounds_secure_aggregation.sh from the files the
workers wrote under --test-secagg-dump (the round's start model, each device's clipped delta and
its quantized values) and the next round's start model (what the server applied), with the
standard library only (no numpy on the test machines).

  secagg_round_check.py model DUMP_DIR ROUND SERVER_LR DEVICE... -- ABSENT...
      The model after ROUND must equal start + SERVER_LR x the mean of the DEVICEs' clipped
      deltas to within half a quantization step per device plus float rounding, and the mean
      of the quantized values (the exact integer sum, read back as the server does) to within
      float rounding; and must NOT equal the mean without the ABSENT devices (so the check can
      fail: their inputs were in the sum).
  secagg_round_check.py secrets DUMP_DIR ROUND FILE...
      No FILE holds 32 consecutive bytes of any device's quantized or clipped delta of ROUND
      (taken at four places where the values are not zero): the server's state, WAL and log
      hold no unmasked individual delta.
"""
import glob
import json
import os
import struct
import sys


def floats(path):
    with open(path, "rb") as f:
        data = f.read()
    return list(struct.unpack("<%df" % (len(data) // 4), data))


def int32s(path):
    with open(path, "rb") as f:
        data = f.read()
    return list(struct.unpack("<%di" % (len(data) // 4), data))


def fail(text):
    sys.exit("FAIL: " + text)


def check_model(dump, round_number, server_lr, devices, absent):
    stem = lambda d, r: os.path.join(dump, "%s.r%d" % (d, r))
    start = floats(stem(devices[0], round_number) + ".start.f32")
    after_files = glob.glob(os.path.join(dump, "*.r%d.start.f32" % (round_number + 1)))
    if not after_files:
        fail("no device pulled the model of round %d" % (round_number + 1))
    after = floats(after_files[0])
    meta = json.load(open(stem(devices[0], round_number) + ".json"))
    n, clip = meta["devices"], meta["clip_norm"]
    scale = ((2**31 - 1) // n) / clip  # privacy/quantize.h: K / S
    m = len(devices)
    deltas = [floats(stem(d, round_number) + ".delta.f32") for d in devices]
    quantized = [int32s(stem(d, round_number) + ".quantized.u32") for d in devices]
    worst_plain, worst_quantized = 0.0, 0.0
    for i in range(len(start)):
        plain = start[i] + server_lr * sum(delta[i] for delta in deltas) / m
        exact = start[i] + server_lr * (sum(q[i] for q in quantized) / scale) / m
        rounding = 4 * 2**-24 * (abs(start[i]) + abs(after[i]) + 1e-30)  # float32 adds
        worst_plain = max(worst_plain, abs(after[i] - plain) - (server_lr * 0.5 / scale + rounding))
        worst_quantized = max(worst_quantized, abs(after[i] - exact) - rounding)
        if abs(after[i] - plain) > server_lr * 0.5 / scale + rounding:
            fail("parameter %d: %.9g after the round, %.9g with the plain mean of %d deltas" % (i, after[i], plain, m))
        if abs(after[i] - exact) > rounding:
            fail("parameter %d: %.9g after the round, %.9g with the quantized sum" % (i, after[i], exact))
    kept = [d for d, name in zip(deltas, devices) if name not in absent]
    moved = max(abs(after[i] - (start[i] + server_lr * sum(d[i] for d in kept) / len(kept))) for i in range(len(start)))
    if moved <= 1e-6:
        fail("the model equals the mean without %s too: the check cannot tell" % " ".join(absent))
    print("round %d: %d parameters equal start + %g x the mean of %d devices' deltas within half a quantization "
          "step (1/scale = %.3g) and float rounding; without %s they would differ by up to %.3g"
          % (round_number, len(start), server_lr, m, 1 / scale, " ".join(absent), moved))


def check_secrets(dump, round_number, files):
    needles = []
    for path in glob.glob(os.path.join(dump, "*.r%d.quantized.u32" % round_number)) + \
            glob.glob(os.path.join(dump, "*.r%d.delta.f32" % round_number)):
        data = open(path, "rb").read()
        values = len(data) // 4
        nonzero = [i for i in range(0, values - 8, 97) if data[4 * i:4 * i + 32].count(0) < 16]
        if len(nonzero) < 4:
            fail(path + ": fewer than four nonzero windows")
        for pick in (0, len(nonzero) // 3, 2 * len(nonzero) // 3, len(nonzero) - 1):
            i = nonzero[pick]
            needles.append((path, data[4 * i:4 * i + 32]))
    if not needles:
        fail("no dumped deltas of round %d" % round_number)
    for f in files:
        haystack = open(f, "rb").read()
        for path, needle in needles:
            if needle in haystack:
                fail("%s holds 32 bytes of %s" % (f, os.path.basename(path)))
    print("round %d: %d windows of %d devices' deltas found in none of %d files"
          % (round_number, len(needles), len(needles) // 8, len(files)))


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "model":
        rest = sys.argv[5:]
        devices = rest[:rest.index("--")] if "--" in rest else rest
        absent = rest[rest.index("--") + 1:] if "--" in rest else []
        check_model(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), devices, absent)
    elif len(sys.argv) >= 5 and sys.argv[1] == "secrets":
        check_secrets(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit(__doc__)
