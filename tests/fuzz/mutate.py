"""Seeded mutations of bytes: bit flips, truncation, insertion, deletion and extreme integers.

Every mutation is a pure function of (data, seed), so a trial is reproduced from its seed.
A mutation reports the byte range it touched, to say which region of a .pte it landed in.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass

KINDS = ("flip", "truncate", "insert", "delete", "extreme")
# int32 / int64 values that break sizes, offsets and counts when a reader trusts them
EXTREMES = {4: (0, -1, 1, 2 ** 31 - 1, -2 ** 31, 2 ** 32 - 1, 2 ** 16),
            8: (0, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 32, 2 ** 40, 2 ** 62)}


@dataclass(frozen=True)
class Mutation:
    kind: str
    lo: int          # first byte touched (insertion / truncation point)
    hi: int          # one past the last byte touched (== lo for an insertion)
    detail: str

    def overlaps(self, start: int, end: int) -> bool:
        if self.lo == self.hi:                  # an insertion lands strictly inside
            return start < self.lo < end
        return self.lo < end and start < self.hi


def mutate(data: bytes, seed, lo: int = 0) -> tuple:
    """(mutated bytes, Mutation). lo: the first offset a mutation may touch (a header to keep)."""
    rng = random.Random(seed)
    kind = rng.choice(KINDS)
    n = len(data)
    off = rng.randrange(lo, n)
    if kind == "flip":
        width = rng.randint(1, 16)
        out = bytearray(data)
        for i in range(off, min(off + width, n)):
            if rng.random() < 0.5 or i == off:
                out[i] ^= 1 << rng.randrange(8)
        return bytes(out), Mutation(kind, off, min(off + width, n), f"bits in {width} bytes")
    if kind == "truncate":
        return data[:off], Mutation(kind, off, n, f"to {off} bytes")
    if kind == "insert":
        size = rng.choice((1, 4, 8, 16, 36, 64))
        junk = bytes(rng.randrange(256) for _ in range(size))
        return data[:off] + junk + data[off:], Mutation(kind, off, off, f"{size} bytes")
    if kind == "delete":
        size = rng.choice((1, 4, 8, 16, 20, 64))
        return data[:off] + data[off + size:], Mutation(kind, off, min(off + size, n), f"{size} bytes")
    width = rng.choice((4, 8))
    off = max(lo, off - off % width)
    if off + width > n:
        off = max(lo, n - width - (n - width) % width)
    value = rng.choice(EXTREMES[width])
    packed = struct.pack("<i" if width == 4 else "<q", value) if value < 0 else \
        value.to_bytes(width, "little")
    out = data[:off] + packed + data[off + width:]
    return out[:n], Mutation(kind, off, off + width, f"int{width * 8} {value}")
