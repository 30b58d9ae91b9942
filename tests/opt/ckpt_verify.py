"""Checks a dt checkpoint with Python's standard library and numpy alone (no dt code): follows
`latest` (or takes a step directory), checks every rank file's size and XXH64 against
manifest.json, reassembles every logical tensor from its shards (each element exactly once) and
prints one line per tensor:   name dtype shape sum   (sum in float64, to 17 digits)
Exit status 1 with a message on the first problem.

Usage: ckpt_verify.py DIR [STEP_DIR]"""
import json
import os
import struct
import sys

import numpy as np

M = (1 << 64) - 1
P1, P2, P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P4, P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def rnd(acc, x):
    return (rotl((acc + x * P2) & M, 31) * P1) & M


def xxh64(b, seed=0):
    """XXH64 as its specification writes it (github.com/Cyan4973/xxHash, doc/xxhash_spec.md)."""
    n, i = len(b), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            for j in range(4):
                v[j] = rnd(v[j], int.from_bytes(b[i + 8 * j:i + 8 * j + 8], "little"))
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for j in range(4):
            h = ((h ^ rnd(0, v[j])) * P1 + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, int.from_bytes(b[i:i + 8], "little")), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ ((int.from_bytes(b[i:i + 4], "little") * P1) & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ ((b[i] * P5) & M), 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return h ^ (h >> 32)


def decode(raw, dtype):
    if dtype == "BF16":  # bf16 is the top half of an f32
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype={"F32": "<f4", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1"}[dtype])


def fail(msg):
    print("ckpt_verify: " + msg)
    sys.exit(1)


def main(root, step_dir=None):
    assert xxh64(b"") == 0xEF46DB3751D8E999 and xxh64(b"abc") == 0x44BC2CF5AD770999
    if step_dir is None:
        step_dir = open(os.path.join(root, "latest")).read().strip()
    d = os.path.join(root, step_dir)
    man = json.load(open(os.path.join(d, "manifest.json")))
    if man.get("format") != "dt-checkpoint" or man.get("version") != 1:
        fail("not a dt checkpoint, version 1")
    files = {}
    for f in man["files"]:
        raw = open(os.path.join(d, f["file"]), "rb").read()
        if len(raw) != f["bytes"]:
            fail("%s has %d bytes, the manifest says %d" % (f["file"], len(raw), f["bytes"]))
        if "%016x" % xxh64(raw) != f["xxh64"]:
            fail("%s: xxh64 %016x, the manifest says %s" % (f["file"], xxh64(raw), f["xxh64"]))
        (n,) = struct.unpack("<Q", raw[:8])
        files[f["rank"]] = (json.loads(raw[8:8 + n]), raw[8 + n:])
    for name, t in sorted(man["tensors"].items()):
        full = np.zeros(t["global_shape"], dtype=np.float64)
        seen = np.zeros(t["global_shape"], dtype=np.int64)
        for s in t["shards"]:
            header, data = files[s["rank"]]
            e = header[name]
            b, end = e["data_offsets"]
            a = decode(data[b:end], e["dtype"]).reshape(e["shape"])
            if list(a.shape) != s["shape"] or e["dtype"] != t["dtype"]:
                fail("%s: the shard in rank %d is %s %s, the manifest says %s %s" %
                     (name, s["rank"], e["dtype"], e["shape"], t["dtype"], s["shape"]))
            box = tuple(slice(st, st + sh) for st, sh in zip(s["start"], s["shape"]))
            full[box] = a
            seen[box] += 1
        if not (seen == 1).all():
            fail("%s: the shards do not cover every element exactly once" % name)
        print(name, t["dtype"], "x".join(map(str, t["global_shape"])), repr(float(full.sum())))


if __name__ == "__main__":
    main(*sys.argv[1:3])
