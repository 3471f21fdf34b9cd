#!/usr/bin/env python3
"""Writes a small seed corpus for each fuzz target under fuzz/corpus/<target>/.

The seeds are built here at run time (nothing binary is committed), from
the byte layouts in src/engine/segment/format.rs, log/manifest.rs and
log/txn.rs. A seed that drifts from the format only makes the fuzzer
start further away; the targets never rely on it. When format/vectors/
exists, seeds are also cut from its engine-written files.

Usage: python3 fuzz/scripts/seed-corpus.py [CORPUS_DIR]   (default fuzz/corpus)
"""

import os
import struct
import sys
import zlib

FUZZ = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(FUZZ, "corpus")
VERSION = 1
FLAG_END, FLAG_MULTI = 1, 2


def crc(b):
    return zlib.crc32(b) & 0xFFFFFFFF


def mp_str(s):
    b = s.encode()
    assert len(b) < 32
    return bytes([0xA0 | len(b)]) + b


def mp_uint(n):
    if n < 128:
        return bytes([n])
    return b"\xcf" + struct.pack(">Q", n)


def doc(eid, key=None, ty=None, payload=b"\x81\xa1x\x01"):
    """MessagePack [id, key, type, metadata, payload]."""
    nil = b"\xc0"
    meta = b"\x81" + mp_str("producer") + mp_str("p")
    return (b"\x95" + mp_str(eid) + (mp_str(key) if key else nil) + (mp_str(ty) if ty else nil)
            + meta + payload)


def record(seq, ts=1000, flags=FLAG_END, txn=0, document=None):
    body = struct.pack("<QqB3xQ", seq, ts, flags, txn) + (document or doc("id-%d" % seq, "k", "t"))
    return struct.pack("<II", len(body), crc(body)) + body


def segment_header(partition=0, stream=1, base=1, created=0):
    b = b"RHEOLOG\0" + struct.pack("<HHIQQq", VERSION, 0, partition, stream, base, created) + bytes(20)
    return b + struct.pack("<I", crc(b))


def footer(records_end, first, last, max_ts):
    b = b"RHEOSEAL" + struct.pack("<QQQQq", records_end, first, last, last - first + 1, max_ts) + bytes(12)
    return b + struct.pack("<I", crc(b))


def index_header(base):
    b = b"RHEOIDX\0" + struct.pack("<HHIQI", VERSION, 0, 0, base, 0)
    return b + struct.pack("<I", crc(b))


def index_entry(seq, offset, max_ts_before=-(2 ** 63), max_txn_before=0):
    b = struct.pack("<QQqQI", seq, offset, max_ts_before, max_txn_before, 0)
    return b + struct.pack("<I", crc(b))


def manifest(streams, next_id):
    # rmp_serde's default: structs as arrays.
    body = b"\x92" + mp_uint(next_id) + bytes([0x90 | len(streams)])
    for sid, name, parts, indexes in streams:
        body += b"\x95" + mp_uint(sid) + mp_str(name) + mp_uint(parts)
        body += bytes([0x90 | len(indexes)]) + b"".join(mp_str(i) for i in indexes) + mp_uint(0)
    head = b"RHEOMAN\0" + struct.pack("<HHIQI", VERSION, 0, 0, len(body), crc(body))
    return head + struct.pack("<I", crc(head)) + body


def txn_log(ids):
    head = b"RHEOTXN\0" + struct.pack("<HH", VERSION, 0)
    out = head + struct.pack("<I", crc(head))
    for t in ids:
        e = struct.pack("<QI", t, 0)
        out += e + struct.pack("<I", crc(e))
    return out


def recovery_input(mode, content, last_seq=0, max_ts=0, committed=0, entries=b""):
    assert len(entries) % 40 == 0
    return (bytes([mode]) + struct.pack("<QqQ", last_seq, max_ts, committed) + bytes([len(entries) // 40])
            + entries + content)


def seeds():
    three = record(1, flags=0) + record(2, flags=0) + record(3)
    multi = record(4, flags=FLAG_MULTI, txn=7) + record(5, flags=FLAG_MULTI | FLAG_END, txn=7)
    odd = record(1, document=doc("e", None, None, payload=b"\x93\xcb" + struct.pack(">d", 2.5) + b"\xc3\xa0"))
    yield "record_decoder", "three", three
    yield "record_decoder", "multi", multi
    yield "record_decoder", "odd-payload", odd
    yield "record_decoder", "torn", three[:-5]
    yield "record_decoder", "then-footer", three + footer(64 + len(three), 1, 3, 1000)

    # segment_recovery: mode bits HEADER=1 FIX_CRCS=2 FOOTER=4 INDEX=8 TXN=16 STRICT=32
    # FOOTER_FROM_ZERO=64
    yield "segment_recovery", "active", recovery_input(1, three + bytes(64))
    yield "segment_recovery", "torn-tail", recovery_input(1, three + record(4)[:-3] + bytes(16))
    yield "segment_recovery", "strict", recovery_input(1 | 32, three + record(4, flags=0))
    yield "segment_recovery", "sealed", recovery_input(1 | 4, three, last_seq=3, max_ts=1000)
    yield "segment_recovery", "multi-txn", recovery_input(
        1 | 8 | 16, three + multi, committed=7, entries=index_entry(1, 64) + index_entry(4, 64 + len(three), 1000))
    yield "segment_recovery", "multi-uncommitted", recovery_input(1 | 16, three + multi, committed=6)
    yield "segment_recovery", "raw-file", recovery_input(0, segment_header() + three)
    yield "segment_recovery", "fix-crcs", recovery_input(1 | 2, three)

    # index_decoder: base sequence (u64) then the bytes.
    base = struct.pack("<Q", 1)
    yield "index_decoder", "index", base + index_header(1) + index_entry(1, 64) + index_entry(40, 5000, 9, 2)
    yield "index_decoder", "header", base + segment_header(3, 9, 1001, -5)
    yield "index_decoder", "footer", base + footer(4096, 10, 19, 77)
    yield "index_decoder", "entries", base + index_entry(1, 64) + index_entry(2, 128)

    yield "manifest_txn_decoder", "manifest", manifest([(1, "orders", 4, ["customer"]), (2, "x", 1, [])], 3)
    yield "manifest_txn_decoder", "empty-manifest", manifest([], 1)
    yield "manifest_txn_decoder", "txn", txn_log([1, 2, 9])
    yield "manifest_txn_decoder", "txn-entries", struct.pack("<QI", 5, 0) + bytes(4)


def vector_seeds(vectors):
    """Seeds cut from the engine-written test vectors in format/vectors/."""
    def read(name):
        with open(os.path.join(vectors, name), "rb") as f:
            return f.read()

    names = sorted(os.listdir(vectors))
    base = struct.pack("<Q", 1)
    committed = 0
    if "txn.bin" in names:
        txn = read("txn.bin")
        yield "manifest_txn_decoder", "vector-txn.bin", txn
        if len(txn) >= 32:
            committed = struct.unpack("<Q", txn[-16:-8])[0]
    if "manifest.bin" in names:
        yield "manifest_txn_decoder", "vector-manifest.bin", read("manifest.bin")
    idx_entries = b""
    for name in names:
        if name.endswith(".idx"):
            idx = read(name)
            yield "index_decoder", "vector-" + name, base + idx
            if name == "segment-sealed.idx":
                idx_entries = idx[32:][: (len(idx) - 32) // 40 * 40]
    for name in names:
        if not name.endswith(".log"):
            continue
        log = read(name)
        yield "record_decoder", "vector-" + name, log[64:]
        yield "index_decoder", "vector-header-" + name, base + log[:64]
        yield "index_decoder", "vector-end-" + name, base + log[-64:]
        # segment_recovery: mode 0 (the file as is, header included); with
        # the transaction log (TXN=16); with the sealed segment's index
        # points (INDEX=8) as well.
        yield "segment_recovery", "vector-" + name, recovery_input(0, log)
        yield "segment_recovery", "vector-txn-" + name, recovery_input(16, log, committed=committed)
        if idx_entries:
            yield "segment_recovery", "vector-idx-" + name, recovery_input(
                8 | 16, log, committed=committed, entries=idx_entries)


def main():
    counts = {}
    sources = [seeds()]
    vectors = os.path.join(os.path.dirname(FUZZ), "format", "vectors")
    if os.path.isdir(vectors):
        sources.append(vector_seeds(vectors))
    for source in sources:
        for target, name, data in source:
            d = os.path.join(CORPUS, target)
            os.makedirs(d, exist_ok=True)
            if not name.startswith("vector-"):
                name = "seed-" + name
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
            counts[target] = counts.get(target, 0) + 1
    print("seed corpus in %s (%s): %s" % (
        CORPUS, "with format/vectors" if len(sources) > 1 else "no format/vectors",
        ", ".join("%s %d" % kv for kv in sorted(counts.items()))))


if __name__ == "__main__":
    main()
