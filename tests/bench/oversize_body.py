#!/usr/bin/env python3
"""Memory of edgetrain-server while one peer posts an oversize block-wise body (issue 18).

Starts edgetrain-server --insecure (plain CoAP, so that the blocks can be sent by hand) on
127.0.0.1 with a fresh state directory, then POSTs /update?id=flood in 1024-byte Block1
blocks, one confirmable block at a time, up to --megabytes MiB (without a Size1 option
unless --announce), until the server answers anything but 2.31 Continue. Prints the
server's VmHWM (peak resident memory) and VmRSS before and after, the blocks it took and
the answer, for each server program given (e.g. a build before and after the change, side
by side in one invocation). Not a test: a figure.

usage: oversize_body.py [--megabytes 256] [--announce] SERVER [SERVER...]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def uint_bytes(value):
    out = b""
    while value:
        out = bytes([value & 0xFF]) + out
        value >>= 8
    return out


def option(last, number, value):
    delta, length = number - last, len(value)
    head, ext = 0, b""
    for v, shift in ((delta, 4), (length, 0)):
        if v < 13:
            head |= v << shift
        elif v < 269:
            head |= 13 << shift
            ext += bytes([v - 13])
        else:
            head |= 14 << shift
            ext += (v - 269).to_bytes(2, "big")
    return bytes([head]) + ext + value


def block_message(mid, num, more, payload, size1):
    message = bytes([0x41, 0x02, mid >> 8 & 0xFF, mid & 0xFF, 0x5A])  # CON POST, token 0x5a
    message += option(0, 11, b"update") + option(11, 15, b"id=flood")
    message += option(15, 27, uint_bytes(num << 4 | (8 if more else 0) | 6))
    if size1 is not None:
        message += option(27, 60, uint_bytes(size1))
    return message + b"\xff" + payload


def flood(port, total, announce):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(5)
    blocks = total // 1024
    payload = bytes(1024)
    code = None
    for num in range(blocks):
        mid = (num + 1) & 0xFFFF
        sock.send(block_message(mid, num, num + 1 < blocks, payload, total if announce and num == 0 else None))
        while True:
            reply = sock.recv(2048)
            if len(reply) >= 4 and (reply[2] << 8 | reply[3]) == mid:
                break
        code = (reply[1] >> 5) * 100 + (reply[1] & 0x1F)
        if code != 231:
            return num + 1, code
    return blocks, code


def measure(server, megabytes, announce):
    with tempfile.TemporaryDirectory() as work:
        keys = os.path.join(work, "keys.toml")
        subprocess.run([server, "add-device", "d0", "--keystore", keys], check=True, capture_output=True)
        stats = os.path.join(work, "stats.json")
        process = subprocess.Popen(
            [server, "--listen", "127.0.0.1", "--port", "0", "--insecure", "--insecure-port", "0", "--model", "mlp",
             "--state-dir", os.path.join(work, "state"), "--keystore", keys, "--stats-file", stats],
            stderr=subprocess.DEVNULL)
        try:
            port = None
            for _ in range(600):
                try:
                    with open(stats) as f:
                        port = json.load(f).get("insecure_port")
                    if port:
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.05)
            if not port:
                sys.exit(f"{server}: no insecure port in its stats file")
            before = status_kib(process.pid, "VmHWM"), status_kib(process.pid, "VmRSS")
            started = time.monotonic()
            blocks, code = flood(port, megabytes << 20, announce)
            seconds = time.monotonic() - started
            after = status_kib(process.pid, "VmHWM"), status_kib(process.pid, "VmRSS")
        finally:
            process.terminate()
            process.wait(timeout=60)
    print(f"{server}: {megabytes} MiB body{' (Size1 announced)' if announce else ''}: answered "
          f"{code // 100}.{code % 100:02d} after {blocks} blocks ({blocks * 1024} bytes, {seconds:.1f} s); "
          f"VmHWM {before[0] / 1024:.1f} -> {after[0] / 1024:.1f} MiB, VmRSS {before[1] / 1024:.1f} -> "
          f"{after[1] / 1024:.1f} MiB")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--announce", action="store_true", help="send Size1 with the first block")
    parser.add_argument("servers", nargs="+")
    args = parser.parse_args()
    for server in args.servers:
        measure(server, args.megabytes, args.announce)


if __name__ == "__main__":
    main()
