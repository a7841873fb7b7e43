#!/usr/bin/env python3
"""What the server's staleness rule made of the stale updates in a state directory's WAL.

For every update applied at a staleness above --above (version produced - 1 - its fetched
version), the AdaComp paper's sigma per sent entry (how many of the `delay` updates applied
before it touched that entry; server/parameter_store.h), and so the share of the update's
L1 mass the server applied: sum |g_i| / max(1, sigma_i) over sum |g_i|. Reads the WAL
(server/write_ahead_log.h) and the sparse updates in it (transport/CODEC.md), fp32 or
fp16 values (sign + scale values all weigh the same). With the local steps an update
claims (its header, CODEC.md) and the server's --offline-step-credit C (the WAL header's
high 16 bits), also the share applied under the credit: sigma_i cut to
ceil(sigma_i / min(s, C, sigma_i)) (server/README.md, "Offline updates"). A log written with
--entry-staleness reads too (its sigma here is still the paper's), and then ends with what
its entry delays cost per record. Standard library only.

usage: experiments/wal_staleness.py STATE_DIR [--above N]
"""
import argparse, glob, os, struct


def leb128(data, pos):
    value = shift = 0
    while True:
        byte = data[pos]; pos += 1
        value |= (byte & 0x7F) << shift; shift += 7
        if not byte & 0x80:
            return value, pos


def decode_update(data):
    """(fetched version, local steps, [(tensor, [indices], [values])]) of a sparse update."""
    fetched, count = struct.unpack_from("<QI", data, 24)
    local_steps = struct.unpack_from("<H", data, 6)[0]
    pos, tensors = 36, []
    for _ in range(count):
        tensor, n, k, value_encoding, index_encoding = struct.unpack_from("<IIIBB", data, pos)
        pos += 14
        if index_encoding == 0:
            indices, previous = [], -1
            for j in range(k):
                gap, pos = leb128(data, pos)
                previous = gap if j == 0 else previous + gap + 1
                indices.append(previous)
        elif index_encoding == 1:
            bitmap = data[pos:pos + (n + 7) // 8]; pos += (n + 7) // 8
            indices = [i for i in range(n) if bitmap[i // 8] >> (i % 8) & 1]
        else:
            indices = list(range(n))
        if value_encoding == 0:
            values = list(struct.unpack_from("<%df" % k, data, pos)); pos += 4 * k
        elif value_encoding == 1:
            values = list(struct.unpack_from("<%de" % k, data, pos)); pos += 2 * k
        else:
            values = [1.0] * k; pos += (4 + (k + 7) // 8) if k else 0
        tensors.append((tensor, indices, values))
    return fetched, local_steps, tensors


ENTRY_DELAY_BYTES = {"records": 0, "with_delays": 0, "entries": 0, "delay_bytes": 0, "record_bytes": 0}


def records(state_dir):
    """(version, identity, update bytes) of every record, oldest first, each version once.
    Entry delays (--entry-staleness: bit 15 of the identity length) are skipped and counted
    in ENTRY_DELAY_BYTES; the sigma below is the paper's either way."""
    seen = set()
    for path in [os.path.join(state_dir, "wal.prev.log"), os.path.join(state_dir, "wal.log")]:
        if not os.path.exists(path):
            continue
        data, pos = open(path, "rb").read(), 32
        while pos + 8 <= len(data):
            length, _crc = struct.unpack_from("<II", data, pos)
            body = data[pos + 8:pos + 8 + length]; pos += 8 + length
            version, _sequence, id_field = struct.unpack_from("<QQH", body, 0)
            id_length, start = id_field & 0x7FFF, 18 + (id_field & 0x7FFF)
            if version in seen:
                continue
            seen.add(version)
            ENTRY_DELAY_BYTES["records"] += 1
            ENTRY_DELAY_BYTES["record_bytes"] += 8 + length
            if id_field & 0x8000:
                count, after = leb128(body, start)
                for _ in range(2 * count):
                    _, after = leb128(body, after)
                ENTRY_DELAY_BYTES["with_delays"] += 1
                ENTRY_DELAY_BYTES["entries"] += count
                ENTRY_DELAY_BYTES["delay_bytes"] += after - start
                start = after
            yield version, body[18:18 + id_length].decode(), body[start:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("state_dir")
    parser.add_argument("--above", type=int, default=50)
    args = parser.parse_args()
    touched = {}  # version -> set of (tensor, index)
    credit = 0
    wal = os.path.join(args.state_dir, "wal.log")
    if os.path.exists(wal):
        credit = struct.unpack_from("<I", open(wal, "rb").read(32), 24)[0] >> 16
    print(f"offline step credit C = {credit}")
    print("| device | version | staleness | local steps | entries | mean sigma | share of its L1 mass applied "
          "(paper's sigma) | share applied with the credit |")
    print("|---|---|---|---|---|---|---|---|")
    for version, who, update in sorted(records(args.state_dir)):
        fetched, local_steps, tensors = decode_update(update)
        entries = {(t, i): abs(v) for t, indices, values in tensors for i, v in zip(indices, values)}
        delay = version - 1 - fetched
        if delay > args.above:
            window = [touched[v] for v in range(fetched + 1, version) if v in touched]
            if len(window) < delay:
                print(f"| {who} | {version} | {delay} | {local_steps} | the WAL lacks {delay - len(window)} of the updates before it ||||")
            else:
                sigma = {key: sum(key in s for s in window) for key in entries}
                mass = sum(entries.values())
                applied = sum(m / max(1, sigma[key]) for key, m in entries.items())
                s = min(local_steps, credit)
                credited = lambda d: d if s <= 1 else -(-d // min(s, d))
                applied_credit = sum(m / credited(max(1, sigma[key])) for key, m in entries.items())
                print(f"| {who} | {version} | {delay} | {local_steps} | {len(entries)} | "
                      f"{sum(sigma.values()) / len(sigma):.1f} | {applied / mass:.3f} | "
                      f"{applied_credit / mass:.3f} |")
        touched[version] = set(entries)
    d = ENTRY_DELAY_BYTES
    if d["with_delays"]:
        print(f"\nentry delays (--entry-staleness): {d['with_delays']} of {d['records']} records, "
              f"{d['entries'] / d['records']:.0f} entries and {d['delay_bytes'] / d['records']:.0f} bytes "
              f"per record, {d['delay_bytes'] / d['record_bytes']:.1%} of the log's "
              f"{d['record_bytes'] / d['records']:.0f} bytes per record")


if __name__ == "__main__":
    main()
