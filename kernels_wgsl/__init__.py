"""WGSL kernels: *.wgsl shaders and the small Python that sizes and dispatches each family.

A family module (kernels_wgsl/<family>.py next to <family>.wgsl) registers one builder per op
name of delegate/ops. The executor calls a builder once per load with the upper-bound shapes
and the attributes, and gets back the dispatches the op needs:

    builder(ins: list[shape | None], outs: list[shape], attrs: dict, info: BuildInfo)
        -> list[Dispatch]

Operands are numbered inputs first (absent optional inputs keep their slot), then outputs.
Binding 0 of every entry point is its params uniform; bindings 1.. are `Dispatch.args` in
order. `Dispatch.sizes(ins, outs, attrs)` is called per execute with the live shapes and
returns (params bytes, workgroup count); a count of 0 skips the dispatch, which is how a
builder routes by live shape. The executor folds counts above 65,535 into a 2-D grid, so
every entry point takes its linear workgroup index from `wg_linear()` (common.wgsl).

Kernels know nothing of the IR; ops registered with alias=True run no dispatch at all: their
output is the input's bytes reinterpreted (a contiguous reshape).
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from delegate.errors import UnknownOperatorError, UnsupportedError
from delegate.plugins import import_families
from delegate.shape_math import numel  # noqa: F401  (re-exported for the builders)

_DIR = Path(__file__).parent
_NOT_FAMILIES = ("device",)
SizesFn = Callable[[list, list, dict], tuple]   # -> (params bytes, workgroup count)


@dataclass(frozen=True)
class Dispatch:
    shader: str            # family stem: kernels_wgsl/<shader>.wgsl
    entry: str             # entry point in that file
    args: tuple            # operand index per binding 1..; an absent input binds a dummy
    writes: tuple          # the operand indices this dispatch writes
    sizes: SizesFn
    constants: tuple = ()  # ((override name, value), ...) pipeline-overridable constants
    label: str = ""        # kernel name for profiles; defaults to the entry point
    prelude: str = ""      # WGSL put before the file: `enable`s and aliases picking a variant
    # Scratch operands, numbered after the outputs (operand len(ins) + len(outs) + j): the
    # bytes scratch j needs at the upper-bound shapes. The executor gives a node one buffer per
    # j, sized for the largest request among its dispatches; its contents live only between
    # that node's dispatches. Builders use it only when BuildInfo.scratch says it is bound.
    scratch: tuple = ()
    # The params are the node's previous dispatch's, byte for byte at every binding: the two
    # share one params slot, so a decode step's params prefix does not grow with them.
    shared_params: bool = False
    # For a step that reads an offset (a KV cache's position): fixed_grid(ins, attrs) says
    # that at these live shapes its workgroup count is the same at every offset, so the
    # executor may keep command buffers finished for the binding; the executor checks it at
    # every execute. None: the grid may move with the offset.
    fixed_grid: Optional[Callable] = None

    def kinds(self) -> tuple:
        return ("uniform",) + tuple("rw" if a in self.writes else "read" for a in self.args)


@dataclass(frozen=True)
class BuildInfo:
    """What a builder may know besides shapes and attributes."""
    gpu: object            # kernels_wgsl.device.GpuDevice (features: has_f16, limits)
    in_dtypes: tuple       # torch dtype per input (None where absent), as the graph declares
    scratch: bool = False  # the executor binds Dispatch.scratch operands


@dataclass(frozen=True)
class WgslKernel:
    name: str
    build: Callable = None
    alias: bool = False    # output is the input's bytes with another shape: no dispatch


_KERNELS: dict = {}
_loaded = False


def register_wgsl(name: str, alias: bool = False):
    """Decorator: register `builder` as the WGSL kernel of op `name`."""

    def deco(builder):
        _KERNELS[name] = WgslKernel(name, builder, alias)
        return builder

    return deco


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import_families(__name__, __path__, skip=_NOT_FAMILIES, group="etwgpu.wgsl")


def has_kernel(name: str) -> bool:
    _load()
    return name in _KERNELS


def get_kernel(name: str) -> WgslKernel:
    _load()
    try:
        return _KERNELS[name]
    except KeyError:
        raise UnknownOperatorError(
            f"WGSL kernel {name!r}: expected a registered kernel, got none under that name"
        ) from None


def adapter_unavailable(selector: str | None = None) -> str:
    """Empty when a WebGPU device can be had, else why not."""
    from kernels_wgsl.device import adapter_unavailable as why_not

    return why_not(selector)


@functools.lru_cache(maxsize=None)
def source(shader: str, prelude: str = "") -> str:
    """WGSL text of kernels_wgsl/<shader>.wgsl after the prelude and common.wgsl, with every
    `enable` line first (WGSL wants directives before declarations)."""
    body = (_DIR / f"{shader}.wgsl").read_text()
    common = (_DIR / "common.wgsl").read_text()
    lines = prelude.splitlines() + [common] + body.splitlines()
    enables = [ln for ln in lines if ln.startswith("enable ")]
    return "\n".join(enables + [ln for ln in lines if not ln.startswith("enable ")])


# ---- params packing -------------------------------------------------------------------------
def words(*values) -> bytes:
    """Pack ints as u32 (negatives as i32 bits) and floats as f32, padded to 16 bytes.

    Lists are flattened, so a `vec4<u32>` array field is a list of 4*k ints.
    """
    flat = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        else:
            flat.append(v)
    pad = bytes(-4 * len(flat) % 16)
    try:   # all u32 (the common case): one pack, ~20x cheaper than one per word
        return struct.pack(f"<{len(flat)}I", *flat) + pad
    except struct.error:
        pass
    kinds = []
    for k, x in enumerate(flat):
        if isinstance(x, float):
            kinds.append("f")
            continue
        x = flat[k] = int(x)
        if not -(1 << 31) <= x < (1 << 32):   # sizes past 32 bits cannot be indexed in WGSL
            raise UnsupportedError(f"kernel parameter: expected a 32-bit integer, got {x}")
        kinds.append("i" if x < 0 else "I")
    return struct.pack("<" + "".join(kinds), *flat) + pad


MAX_RANK = 8


def padded(seq, n: int = MAX_RANK, fill: int = 0) -> list:
    seq = list(seq)
    if len(seq) > n:
        raise UnsupportedError(f"tensor rank: expected at most {n}, got {len(seq)}")
    return seq + [fill] * (n - len(seq))


def contiguous_strides(shape) -> list:
    strides, step = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        step *= int(shape[d])
    return strides


def broadcast_strides(shape, out_shape) -> list:
    """Element strides reading `shape` broadcast to `out_shape` (0 along broadcast dims)."""
    own = contiguous_strides(shape)
    lead = len(out_shape) - len(shape)
    return [0 if d < lead or shape[d - lead] == 1 else own[d - lead]
            for d in range(len(out_shape))]


def broadcast_layout(out_shape, *operands) -> list:
    """The params tail of a kernel reading operands broadcast to `out_shape`: the shape, then
    each operand's element strides (a None operand, a scalar: all zero), padded to MAX_RANK."""
    zeros = [0] * len(out_shape)
    return [padded(out_shape)] + [padded(zeros if s is None else broadcast_strides(s, out_shape))
                                  for s in operands]


# How a kernel reads a 4-byte element (the WebGPU executor holds int64 as i32, bool as u32
# 0 / 1): KIND_PRELUDE declares these codes to a shader as `const KIND_<NAME>: u32`.
ELEMENT_KINDS = {"f32": ("float32",), "i32": ("int32", "int64"), "bool": ("bool",)}
# With the codes, the decoding every kind-aware shader shares: a 4-byte element's bits as f32
# (an i32 or bool 0 / 1 converted), its truth as torch tests x != 0 (on the bits, a float's
# sign dropped: -0 is false, NaN true), and a bool stored as u32 0 / 1.
KIND_PRELUDE = "\n".join([f"const KIND_{k.upper()}: u32 = {code}u;"
                          for code, k in enumerate(ELEMENT_KINDS)] + [
    "fn as_f32(bits: u32, kind: u32) -> f32 {",
    "    return select(f32(bitcast<i32>(bits)), bitcast<f32>(bits), kind == KIND_F32);",
    "}",
    "fn truth(bits: u32, kind: u32) -> bool {",
    "    return select(bits, bits & 0x7fffffffu, kind == KIND_F32) != 0u;",
    "}",
    "fn holds(c: bool) -> u32 {",
    "    return select(0u, 1u, c);",
    "}"])


def element_kind(dtype) -> int:
    """The KIND_ code of a torch dtype or its name ("float32"); UnsupportedError otherwise."""
    name = str(dtype).removeprefix("torch.")
    for code, names in enumerate(ELEMENT_KINDS.values()):
        if name in names:
            return code
    raise UnsupportedError(f"element dtype on WebGPU: expected one of "
                           f"{[n for ns in ELEMENT_KINDS.values() for n in ns]}, got {name}")


def groups(n: int, per_group: int) -> int:
    return (int(n) + per_group - 1) // per_group
