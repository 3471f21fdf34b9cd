#!/usr/bin/env python3
"""Writes a small seed corpus for each fuzz target under fuzz/corpus/<target>/.

The seeds are built here at run time (nothing binary is committed), from
the byte layouts in src/engine/segment/format.rs, log/manifest.rs,
log/txn.rs, engine/delivery/wal.rs, engine/delivery/checkpoint.rs and
engine/index/file.rs (format/secondary-index.md) (the
delivery records' MessagePack as rmp_serde writes it: structs as arrays,
enums as {variant: fields} maps or, unit variants, the variant's name). A seed that drifts from the format only makes the fuzzer
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

    # six_decoder: mode AS_IS=0 FIXED=1 BUILT=2 DOC=3, KEEP_VERSION=4; then the content.
    yield from six_seeds()


# ---------------------------------------------------------------- secondary index

def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def six_file(fields, terms, base=1, last=8, records_end=64 + 8 * 100, max_ts=1000, offsets=True,
             partition=0, stream=1, block_target=4096):
    """A .six file as file::encode writes it (format/secondary-index.md).

    fields: sorted names; terms: sorted (key bytes, [sequence offsets from base])."""
    head = b"RHEOSIX\0" + struct.pack("<HHIQQQQq", VERSION, 0, partition, stream, base, last, records_end, max_ts)
    head += bytes(4)
    out = head + struct.pack("<I", crc(head))
    blocks, block, first, count = [], b"", None, 0
    spans = [[b"", b""] for _ in fields]
    for key, offs in terms:
        if first is None:
            first = key
        ordinal = struct.unpack(">H", key[:2])[0]
        if len(key) > 2 and ordinal < len(fields):
            if not spans[ordinal][0]:
                spans[ordinal][0] = key[2:]
            spans[ordinal][1] = key[2:]
        post, prev = b"", 0
        for i, o in enumerate(offs):
            post += varint(o if i == 0 else o - prev)
            prev = o
        block += varint(len(key)) + key + varint(len(offs)) + varint(len(post)) + post
        count += 1
        if len(block) >= block_target:
            blocks.append((first, len(out), block, count))
            out += block
            block, first, count = b"", None, 0
    if first is not None:
        blocks.append((first, len(out), block, count))
        out += block
    n = last - base + 1
    if offsets:
        out += b"".join(struct.pack("<I", 64 + 100 * i) for i in range(n))
    d = varint(len(fields))
    for f, (lo, hi) in zip(fields, spans):
        d += varint(len(f)) + f.encode() + varint(len(lo)) + lo + varint(len(hi)) + hi
    d += varint(len(blocks))
    for f, off, b, cnt in blocks:
        d += varint(len(f)) + f + varint(off) + varint(len(b)) + struct.pack("<I", crc(b)) + varint(cnt)
    lastkey = terms[-1][0] if terms else b""
    d += varint(len(lastkey)) + lastkey + varint(n if offsets else 0)
    dir_offset = len(out)
    return out + d + struct.pack("<QII", dir_offset, len(d), crc(d)) + b"RHEOSIX\0"


def six_key(ordinal, tag, value=b""):
    return struct.pack(">H", ordinal) + bytes([tag]) + value


def six_int(n):
    return b"\x01" + ((n + 2 ** 127) % 2 ** 128).to_bytes(16, "big")


def six_seeds():
    fields = ["id", "payload.amount", "payload.flag", "type"]
    terms = [
        (six_key(0, 3, b"evt-1"), [0]), (six_key(0, 3, b"evt-2"), [1]), (six_key(0, 3, b"evt-3"), [2, 5]),
        (six_key(1, 2, six_int(-5)), [0, 3]),
        (six_key(1, 2, six_int(2) + struct.pack(">d", 0.5)), [1]),
        (six_key(1, 2, six_int(250)), [2, 4, 7]),
        (six_key(2, 0), [6]), (six_key(2, 1, b"\x00"), [0]), (six_key(2, 1, b"\x01"), [1, 2]),
        (six_key(2, 4), [3]),
        (six_key(3, 3, b"order_paid"), [0, 2, 4, 6]), (six_key(3, 3, b"order_placed"), [1, 3, 5, 7]),
    ]
    small = six_file(fields, terms)
    yield "six_decoder", "file", b"\x00" + small
    yield "six_decoder", "file-fixed", b"\x01" + small
    yield "six_decoder", "file-no-offsets", b"\x01" + six_file(fields, terms, offsets=False)
    yield "six_decoder", "file-small-blocks", b"\x01" + six_file(fields, terms, block_target=16)
    yield "six_decoder", "file-empty", b"\x01" + six_file(["id", "type"], [], last=1)
    yield "six_decoder", "file-version-2", b"\x05" + small[:8] + b"\x02" + small[9:]
    bad = bytearray(small)
    bad[70] ^= 1
    yield "six_decoder", "file-damaged-block", b"\x01" + bytes(bad)
    yield "six_decoder", "built", b"\x02" + bytes(range(1, 200))
    yield "six_decoder", "built-long-value", b"\x02" + bytes([0, 5, 9, 0, 3, 2, 0, 7, 0x81, 0x30, 0, 1])
    yield "six_decoder", "doc", b"\x03" + doc("e1", "k", "t")
    nested = b"\x82" + mp_str("a") + b"\x92\x01\x81" + mp_str("b") + b"\xcb" + struct.pack(">d", 1.5)
    nested += mp_str("b") + b"\x93\xc0\xc3\xa0"
    yield "six_decoder", "doc-nested", b"\x03" + doc("e2", None, None, payload=nested)
    yield "six_decoder", "doc-duplicate-keys", b"\x03" + doc("e3", "k", None, payload=b"\x82\xa1a\x01\xa1a\x02")
    yield "six_decoder", "doc-nan", b"\x03" + doc("e4", None, "t", payload=b"\x81\xa1a\xcb\x7f\xf8" + bytes(6))


# ---------------------------------------------------------------- delivery table

def mp(v):
    """MessagePack as rmp_serde writes it (the decoder also takes other widths)."""
    if v is None:
        return b"\xc0"
    if isinstance(v, bool):
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if 0 <= v < 2 ** 8:
            return b"\xcc" + bytes([v])
        if 0 <= v < 2 ** 16:
            return b"\xcd" + struct.pack(">H", v)
        if 0 <= v < 2 ** 32:
            return b"\xce" + struct.pack(">I", v)
        if 0 <= v < 2 ** 64:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, str):
        b = v.encode()
        assert len(b) < 32
        return bytes([0xA0 | len(b)]) + b
    if isinstance(v, bytes):
        # u128 lease ids: a 16-byte bin, big-endian.
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, list):
        assert len(v) < 16
        return bytes([0x90 | len(v)]) + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        assert len(v) < 16
        return bytes([0x80 | len(v)]) + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


T0 = 1_767_225_600_000  # the targets' clock start (2026-01-01)


def lease_id(n):
    return struct.pack(">QQ", 0x0123456789ABCDEF, n)


def duration(ms):
    return [ms // 1000, ms % 1000 * 1_000_000]


def part(p, frontier=0, cursor=0, done=(), deliveries=(), dead=(), floor=0):
    """PartSnapshot: [p, frontier, floor, cursor, done, deliveries, dead]."""
    return [p, frontier, floor, cursor, [list(r) for r in done], list(deliveries), list(dead)]


def leased(seq, attempt, n, expires=T0 + 5000):
    return [seq, attempt, {"Leased": [lease_id(n), "c", expires]}]


def group(name, parts, max_attempts=5, partitions=None, backoff="None", next_dead=0):
    """GroupSnapshot: [[name, max_attempts, partitions, created_at], backoff, next_dead_order, parts]."""
    return [[name, max_attempts, partitions, T0], backoff, next_dead, parts]


G_NEW = group("g", [part(0), part(1)], max_attempts=3)
H_NEW = group("h", [part(1)], partitions=[1], backoff={"Fixed": duration(500)})
G_BUSY = group("g", [
    part(0, frontier=1, cursor=3, deliveries=[leased(2, 1, 1), [3, 2, {"Waiting": [T0 + 100]}]]),
    part(1, frontier=0, cursor=3, done=[(2, 2)], deliveries=[[1, 1, "Available"], leased(3, 3, 2)],
         dead=[[2, "bad", 1, T0, 0]]),
], max_attempts=3, next_dead=1)


def wal_header(gen):
    b = b"RHEOWAL\0" + struct.pack("<HHIQI", VERSION, 0, 0, gen, 0)
    return b + struct.pack("<I", crc(b))


def wal_record(lsn, grp, kind, payload, fix=True):
    name = grp.encode()
    body = struct.pack("<QBH", lsn, kind, len(name)) + name + payload
    return struct.pack("<II", len(body), crc(body) if fix else 0) + body


def wal_create(lsn, snap, fix=True):
    return wal_record(lsn, snap[0][0], 1, mp(snap), fix)


def wal_ops(lsn, grp, ops, fix=True):
    return wal_record(lsn, grp, 2, mp(ops), fix)


def wal_records(fix=True):
    """A session's records: two groups, then every kind of transition."""
    ops = [
        [{"Claim": [0, "c", T0 + 5000, [[1, lease_id(1)], [2, lease_id(2)]]]},
         {"Claim": [1, "c", T0 + 5000, [[1, lease_id(3)]]]}],
        [{"Ack": [0, [1]]}],
        [{"Reschedule": [0, 2, T0, T0 + 100]}],
        [{"DeadLetter": [1, 1, "bad", T0]}],
        [{"Renew": [0, 2, T0 + 9000]}, {"Cursor": [1, 3]}],
        [{"ReopenAfter": [0, 0]}],
        [{"ReopenOne": [1, [1]]}],
        [{"Reset": [1, 2]}],
    ]
    out = wal_create(1, G_NEW, fix) + wal_create(2, H_NEW, fix)
    for i, o in enumerate(ops):
        out += wal_ops(3 + i, "g", o, fix)
    return out


def checkpoint_file(gen, lsn, groups, body=None):
    body = mp(groups) if body is None else body
    head = b"RHEOCKP\0" + struct.pack("<HHIQQQI", VERSION, 0, 0, gen, lsn, len(body), crc(body))
    return head + struct.pack("<I", crc(head)) + body


def wal_input(mode, content, off=0):
    # wal_decoder: HEADER=1 BASE=2 SPLICE=4 FIX_CRCS=8 STRICT=16 TRUNCATE=32 REMOVE_EMPTY=64
    return bytes([mode]) + struct.pack("<H", off) + content


def ckpt_input(mode, content, lsn=0, off=0):
    # checkpoint_decoder: FORGE=1 REAL=2 KEEP_WAL=4 STRICT=8
    return bytes([mode]) + struct.pack("<QH", lsn, off) + content


def model_input(config, calls):
    """delivery_model: the bytes arbitrary::Unstructured decodes to these calls.

    config: (max_attempts 1..4, backoff index 0..2 (0, 300, 2000 ms),
    checkpoint_bytes index 0..3 (256, 1024, 4096, none), preallocate 0/1).
    A partition scope is 0, 1 or None (both)."""
    if config is None:
        out = b""  # calls only (a call nested in crash_in)
    else:
        attempts, backoff, ckpt, prealloc = config
        out = bytes([attempts - 1, backoff, ckpt, prealloc])
    scope = {0: 0, 1: 1, None: 2}
    for c in calls:
        op, args = c[0], c[1:]
        if op == "append":
            out += bytes([0, args[0], args[1] - 1])
        elif op == "fetch":
            limit, lease_ms, only = args
            out += bytes([4, limit - 1]) + struct.pack(">H", lease_ms - 1) + bytes([scope[only]])
        elif op == "ack":
            out += bytes([8, args[0]])
        elif op == "ack_many":
            out += bytes([11, len(args[0]) - 1] + list(args[0]))
        elif op == "retry":
            i, delay = args
            out += bytes([12, i]) + (b"\x01" + struct.pack(">H", delay) if delay is not None else b"\x00")
        elif op == "reject":
            out += bytes([14, args[0]])
        elif op == "renew":
            out += bytes([15, args[0]]) + struct.pack(">H", args[1] - 1)
        elif op == "advance":
            out += bytes([16]) + struct.pack(">H", args[0] - 1)
        elif op == "replay":
            out += bytes([18, args[0], scope[args[1]]])
        elif op == "checkpoint":
            out += bytes([19])
        elif op == "reopen":
            out += bytes([20, 1 if args[0] else 0])
        elif op == "crash":
            out += bytes([22])
        elif op == "fetch_h":
            limit, lease_ms, only = args
            out += bytes([24, limit - 1]) + struct.pack(">H", lease_ms - 1) + bytes([scope[only]])
        elif op == "replay_in":
            # (group, mode "seq" | "time" | "query", value, partition scope)
            g, mode, value, only = args
            out += bytes([25, g])
            if mode == "seq":
                out += bytes([0, value])
            elif mode == "time":
                out += bytes([1]) + struct.pack(">H", value)
            else:
                out += bytes([2, value])
            out += bytes([scope[only]])
        elif op == "reset":
            # (group, start "beginning" | "after" | "at" | "latest", value, partition scope)
            g, start, value, only = args
            out += bytes([26, g])
            if start == "beginning":
                out += bytes([0])
            elif start == "after":
                out += bytes([1, value])
            elif start == "at":
                out += bytes([2]) + struct.pack(">H", value)
            else:
                out += bytes([3])
            out += bytes([scope[only]])
        elif op == "skip":
            g, p, seq = args
            out += bytes([27, g, p, seq])
        elif op == "crash_in":
            # (file operations into the call, the call)
            after, inner = args
            out += bytes([28, after - 1]) + model_input(None, [inner])
        else:
            raise ValueError(op)
    return out


def delivery_seeds():
    records = wal_records()
    yield "wal_decoder", "records", wal_input(0, wal_header(1) + records)
    yield "wal_decoder", "records-strict", wal_input(16, wal_header(1) + records)
    yield "wal_decoder", "records-unfixed", wal_input(1 | 8, wal_records(fix=False))
    yield "wal_decoder", "torn-tail", wal_input(1, records + records[:-7][-40:])
    yield "wal_decoder", "damage-then-valid", wal_input(1, records[:30] + b"\xff" * 9 + records[60:])
    yield "wal_decoder", "lsn-backwards", wal_input(1, wal_create(5, G_NEW) + wal_ops(4, "g", [{"Ack": [0, [1]]}]))
    yield "wal_decoder", "unknown-group", wal_input(1, wal_ops(1, "x", [{"Ack": [0, [1]]}]))
    yield "wal_decoder", "busy-group", wal_input(1, wal_create(1, G_BUSY) + wal_create(2, H_NEW))
    yield "wal_decoder", "large-values", wal_input(1 | 8, wal_create(1, G_NEW) + wal_ops(2, "g", [
        {"Claim": [1, "c", 2 ** 63 - 1, [[2 ** 64 - 1, lease_id(9)]]]}, {"Renew": [1, 2 ** 64 - 1, 2 ** 63 - 1]},
        {"ReopenAfter": [1, 2 ** 64 - 1]}, {"Reset": [7, 3]}, {"ReopenOne": [0, [0, 2 ** 64 - 2]]}]))
    yield "wal_decoder", "base", wal_input(2, b"")
    yield "wal_decoder", "base-strict", wal_input(2 | 16, b"")
    yield "wal_decoder", "base-then-zeros", wal_input(2, bytes(300))
    yield "wal_decoder", "base-then-torn", wal_input(2, struct.pack("<II", 40, 0) + bytes(20))
    yield "wal_decoder", "splice-fixed", wal_input(4 | 8, b"\x05\x00\x00\x00", off=120)
    yield "wal_decoder", "splice-truncate", wal_input(4 | 32, b"\x00" * 8, off=200)
    yield "wal_decoder", "torn-creation", wal_input(0, wal_header(1)[:20])
    yield "wal_decoder", "zeroed-header", wal_input(0, bytes(32))
    yield "wal_decoder", "other-generation", wal_input(0, wal_header(7) + records)
    yield "wal_decoder", "removed", wal_input(64, b"")

    both = [G_BUSY, H_NEW]
    yield "checkpoint_decoder", "groups", ckpt_input(1, mp(both), lsn=2)
    yield "checkpoint_decoder", "groups-strict", ckpt_input(1 | 8, mp(both), lsn=2)
    yield "checkpoint_decoder", "new-groups-keep-wal", ckpt_input(1 | 4, mp([G_NEW, H_NEW]), lsn=1000)
    yield "checkpoint_decoder", "created-twice", ckpt_input(1 | 4, mp([G_NEW]), lsn=0)
    yield "checkpoint_decoder", "empty", ckpt_input(1, mp([]))
    yield "checkpoint_decoder", "real", ckpt_input(2, b"")
    yield "checkpoint_decoder", "real-keep-wal", ckpt_input(2 | 4, b"")
    yield "checkpoint_decoder", "real-splice", ckpt_input(2 | 4, b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", off=30)
    yield "checkpoint_decoder", "file", ckpt_input(0, checkpoint_file(1, 2, both))
    yield "checkpoint_decoder", "file-generation-2", ckpt_input(0, checkpoint_file(2, 2, both))
    bad = bytearray(checkpoint_file(1, 2, both))
    bad[-1] ^= 1
    yield "checkpoint_decoder", "file-body-crc", ckpt_input(0, bytes(bad))
    yield "checkpoint_decoder", "file-short-body", ckpt_input(0, checkpoint_file(1, 2, both)[:-3])
    yield "checkpoint_decoder", "large-values", ckpt_input(1, mp([group("g", [
        part(0, frontier=2, cursor=2 ** 64 - 2, floor=2 ** 64 - 2, done=[(5, 2)]),
        part(2 ** 32 - 1, deliveries=[leased(2 ** 64 - 1, 2 ** 32 - 1, 1, 2 ** 63 - 1)])])]))

    yield "delivery_model", "claims-lost-in-a-crash", model_input((3, 0, 3, 0), [
        ("append", 0, 5), ("fetch", 3, 1000, None), ("ack", 0), ("fetch", 2, 1000, 0), ("crash",),
        ("fetch", 8, 1000, None), ("ack", 1), ("ack", 3), ("ack_many", [4, 5, 6]), ("reopen", True)])
    yield "delivery_model", "expiry-dead-letters", model_input((1, 0, 3, 0), [
        ("append", 0, 3), ("append", 1, 2), ("fetch", 4, 100, None), ("advance", 200), ("fetch", 8, 100, None),
        ("replay", 0, None), ("fetch", 8, 100, None), ("crash",), ("fetch", 8, 100, 1)])
    yield "delivery_model", "retry-backoff", model_input((3, 1, 1, 1), [
        ("append", 1, 4), ("fetch", 2, 5000, 1), ("retry", 0, None), ("retry", 1, 0), ("fetch", 8, 5000, None),
        ("advance", 301), ("fetch", 8, 5000, None), ("retry", 2, 3000), ("checkpoint",), ("crash",),
        ("advance", 3000), ("fetch", 8, 5000, None)])
    yield "delivery_model", "stale-after-refetch", model_input((4, 0, 0, 0), [
        ("append", 0, 2), ("fetch", 2, 100, 0), ("advance", 150), ("fetch", 1, 1000, 0), ("ack", 0),
        ("ack", 2), ("renew", 1, 2000), ("reject", 1), ("reopen", False), ("ack", 0), ("replay", 1, 0),
        ("fetch", 4, 1000, None)])
    calls = []
    for i in range(40):
        calls += [("append", i % 2, 1 + i % 5), ("fetch", 1 + i % 8, 500 + 97 * i, (0, 1, None)[i % 3]),
                  ("ack", i), ("retry", i + 1, None if i % 2 else 10 * i), ("advance", 400)]
        if i % 7 == 3:
            calls.append(("crash",))
        if i % 11 == 5:
            calls.append(("reopen", i % 2 == 0))
        if i % 13 == 6:
            calls.append(("replay", i % 9, None))
    yield "delivery_model", "long-small-checkpoints", model_input((3, 1, 0, 0), calls[:64])
    yield "delivery_model", "two-groups-replays-and-resets", model_input((2, 1, 1, 1), [
        ("append", 0, 4), ("append", 1, 5), ("advance", 1000), ("append", 1, 3), ("fetch", 8, 3000, None),
        ("fetch_h", 5, 3000, None), ("ack", 0), ("ack", 1), ("ack_many", [2, 3, 8, 9]), ("reject", 4),
        ("replay_in", 0, "time", 500, None), ("replay_in", 1, "query", 1, None), ("skip", 0, 1, 7),
        ("skip", 1, 1, 2), ("reset", 0, "after", 3, 0), ("reset", 1, "at", 600, None), ("fetch", 8, 1000, None),
        ("checkpoint",), ("crash",), ("fetch_h", 8, 1000, 1), ("reset", 0, "latest", 0, None),
        ("append", 0, 2), ("fetch", 8, 1000, None), ("reset", 0, "after", 30, 1), ("append", 1, 4),
        ("replay_in", 0, "seq", 0, None)])
    yield "delivery_model", "crashes-inside-calls", model_input((3, 0, 2, 0), [
        ("append", 0, 3), ("append", 1, 3), ("fetch", 6, 5000, None), ("fetch_h", 3, 5000, None),
        ("crash_in", 2, ("ack", 0)), ("crash_in", 3, ("ack_many", [1, 2, 3, 4])),
        ("crash_in", 1, ("fetch", 4, 100, None)), ("crash_in", 4, ("replay_in", 0, "seq", 0, None)),
        ("crash_in", 2, ("reset", 1, "beginning", 0, None)), ("crash_in", 3, ("skip", 0, 0, 2)),
        ("crash_in", 5, ("retry", 5, 100)), ("fetch", 8, 1000, None)])
    rng = 0x2545F4914F6CDD1D
    for n in range(4):
        out = bytearray()
        for _ in range(300 + 150 * n):
            rng = (rng * 6364136223846793005 + 1442695040888963407) % 2 ** 64
            out.append(rng >> 56)
        yield "delivery_model", "random-%d" % n, bytes(out)


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
        # Delivery-table vectors: whole files for the WAL and checkpoint targets.
        if name.startswith("delivery-wal") and name.endswith(".log"):
            yield "wal_decoder", "vector-" + name, wal_input(0, read(name))
            yield "wal_decoder", "vector-fixed-" + name, wal_input(8, read(name))
        elif name.endswith(".ckpt"):
            yield "checkpoint_decoder", "vector-" + name, ckpt_input(0, read(name))
        elif name.endswith(".six"):
            # Secondary-index vectors: as they are (AS_IS) and with the checksums
            # remade by the target (FIXED).
            yield "six_decoder", "vector-" + name, b"\x00" + read(name)
            yield "six_decoder", "vector-fixed-" + name, b"\x01" + read(name)
    for name in names:
        if not name.endswith(".log") or name.startswith("delivery-wal"):
            continue
        log = read(name)
        yield "record_decoder", "vector-" + name, log[64:]
        # six_decoder (DOC): the documents of the first records.
        at = 64
        for i in range(8):
            if at + 8 > len(log):
                break
            body_len = struct.unpack_from("<I", log, at)[0]
            if body_len < 29 or at + 8 + body_len > len(log):
                break
            yield "six_decoder", "vector-doc-%d-%s" % (i, name), b"\x03" + log[at + 8 + 28:at + 8 + body_len]
            at += 8 + body_len
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
    sources = [seeds(), delivery_seeds()]
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
