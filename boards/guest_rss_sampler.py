#!/usr/bin/env python3
"""Peak resident memory of a program under qemu-user, told apart from QEMU's own.

usage: guest_rss_sampler.py PID GUEST_BASE GUEST_SIZE   (hex addresses, e.g. 0x200000000000)

The program runs under `qemu-aarch64 -R GUEST_SIZE -B GUEST_BASE`, so every page it maps
lies in [GUEST_BASE, GUEST_BASE + GUEST_SIZE) of the qemu process, and QEMU's translator,
code cache and libraries outside. Every 0.02 s until the process exits, sums Rss of
/proc/PID/smaps inside the window (the guest's pages) and over all of it (the qemu
process); prints the two peaks in KiB: "GUEST_KIB TOTAL_KIB". A sample can miss a peak
shorter than its interval. boards/measure-worker.sh and tests/bench/worker_memory_bench.sh both use it.
"""
import sys
import time


def main():
    pid, lo, size = int(sys.argv[1]), int(sys.argv[2], 16), int(sys.argv[3], 16)
    hi = lo + size
    peak_guest = peak_total = 0
    while True:
        try:
            with open(f"/proc/{pid}/smaps") as f:
                guest = total = 0
                inside = False
                for line in f:
                    first = line.split(None, 1)[0]
                    if "-" in first and line[0] in "0123456789abcdef":
                        start = int(first.split("-", 1)[0], 16)
                        inside = lo <= start < hi
                    elif line.startswith("Rss:"):
                        kib = int(line.split()[1])
                        total += kib
                        if inside:
                            guest += kib
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):
            break
        peak_guest, peak_total = max(peak_guest, guest), max(peak_total, total)
        if zombie:
            break
        time.sleep(0.02)
    print(peak_guest, peak_total)


if __name__ == "__main__":
    main()
