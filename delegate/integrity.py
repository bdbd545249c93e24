"""Weight integrity: the named-data key of a weight is a digest of its bytes, checked at load.

key = "etwgpu." + sha256(bytes + dtype and shape) + "." + crc32 of sampled 4 KiB blocks

verify="full" recomputes the sha256 of every weight; verify="fast" only the CRC32 of the
sampled blocks (at most SAMPLE_BLOCKS + 1 blocks per weight: it catches truncation and
zeroed or garbled pages, not every single flipped bit); verify="off" checks sizes only.
"auto" is full up to FULL_VERIFY_BYTES of weights per delegate and fast above (measured
here: sha256 ~1 GB/s on one core, so 1 GiB costs about a second, once per process).
Lowering (export) and the runtime both import this module, so the key is made in one place.
"""
from __future__ import annotations

import hashlib
import re
import weakref
import zlib

from delegate.errors import BlobError, ProgramError

VERIFY_MODES = ("auto", "full", "fast", "off")
FULL_VERIFY_BYTES = 1 << 30
BLOCK = 4096
SAMPLE_BLOCKS = 64
_KEY = re.compile(r"etwgpu\.([0-9a-f]{64})\.([0-9a-f]{8})")

# owner of the named data (a Program) -> {key: strongest mode already verified}. Weak, so a
# Program's buffers are rehashed if a new Program (new bytes) ever reuses its address.
_VERIFIED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def weight_key(data: bytes, dtype, shape) -> str:
    """The named-data key of a weight's bytes (dtype and shape are part of its identity)."""
    return f"etwgpu.{_sha256(data, dtype, shape)}.{sampled_crc32(data):08x}"


def _sha256(data, dtype, shape) -> str:
    h = hashlib.sha256(data)   # streamed: no copy of a large weight
    h.update(str((dtype, tuple(shape))).encode())
    return h.hexdigest()


def sampled_crc32(data) -> int:
    """CRC32 over SAMPLE_BLOCKS evenly spaced 4 KiB blocks and the last block (all of a
    small weight), so its cost is bounded whatever the weight's size."""
    view = memoryview(data).cast("B")
    n = len(view)
    if n <= BLOCK * (SAMPLE_BLOCKS + 1):
        return zlib.crc32(view)
    step = n // SAMPLE_BLOCKS
    crc = 0
    for off in [i * step for i in range(SAMPLE_BLOCKS)] + [n - BLOCK]:
        crc = zlib.crc32(view[off:off + BLOCK], crc)
    return crc


def resolve_mode(mode, total_bytes: int) -> str:
    """The mode to apply: `auto` picks full up to FULL_VERIFY_BYTES, else fast."""
    if mode not in VERIFY_MODES:
        raise ProgramError(f"load option verify: expected one of {VERIFY_MODES}, got {mode!r}")
    if mode == "auto":
        return "full" if total_bytes <= FULL_VERIFY_BYTES else "fast"
    return mode


def verify_weight(key: str, data, dtype, shape, mode: str, owner=None) -> None:
    """BlobError naming the key unless the bytes match it (under mode full or fast)."""
    if mode == "off" or _already(owner, key, mode):
        return
    m = _KEY.fullmatch(key)
    if m is None:
        raise BlobError(f"weight {key}: expected a key 'etwgpu.<sha256>.<crc32>', got another")
    if mode == "full":
        got, want = _sha256(data, dtype, shape), m.group(1)
    else:
        got, want = f"{sampled_crc32(data):08x}", m.group(2)
    if got != want:
        raise BlobError(f"weight {key}: expected bytes whose {_WHAT[mode]} is {want}, got "
                        f"{got}: the weight data is corrupted")
    _remember(owner, key, mode)


_WHAT = {"full": "sha256", "fast": "sampled-block CRC32"}


def _already(owner, key: str, mode: str) -> bool:
    done = _VERIFIED.get(owner, {}).get(key) if _weakable(owner) else None
    return done == "full" or done == mode


def _remember(owner, key: str, mode: str) -> None:
    if _weakable(owner):
        seen = _VERIFIED.setdefault(owner, {})
        seen[key] = "full" if "full" in (mode, seen.get(key)) else mode


def _weakable(owner) -> bool:
    if owner is None:
        return False
    try:
        weakref.ref(owner)
    except TypeError:
        return False
    return True
