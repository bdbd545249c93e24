"""linear_q4gsw and linear_q4gsw_multi on WebGPU: three kernels, routed per shape binding by the
live M, each with either of two epilogues.

    M == 1        q4gsw_coop_gemv.wgsl       one workgroup of `lanes` lanes per 4, 8 or 16 output
                                             columns (decode), built per GemvConfig; the lanes'
                                             sums meet by subgroupAdd when the device has
                                             subgroups, else in workgroup memory
    1 < M, small  q4gsw_steel_gemm.wgsl      64x64 tile, 16x16 threads, 4x4 per thread, BK 16
    M >= TILE128_MIN_M and enough 128x128 tiles to fill the GPU:
                  q4gsw_steel_gemm128.wgsl   128x128 tile, 256 threads, 8x8 per thread, BK 8,
                                             double-buffered tiles of dequantized weights
    M >= TILE128_MIN_M and K > K_SPLIT (split K, where the executor binds scratch):
                  q4gsw_steel_gemm128.wgsl   the 128x128 tile per (K chunk, tile) into partials,
                                             then q4gsw_splitk_reduce sums them in chunk order

Both GEMMs can hold f16 tile values (f32 accumulation) on a device with shader-f16, or run all
in f32 (the prelude picks tile_t). f32 tiles are the default: on the H200 they were faster at
every bench/q4gsw.py shape (2048^3: 656 against 694 us) and they round nothing. Both GEMMs
dequantize a weight before it meets x and sum each output as one FMA chain over k in order, so
for the same tile_t they give the same bits: the router's choice of tile changes no value.
Split K sums one chain per chunk and then the chunks, so its bits differ from the unsplit
chain's; whether it runs depends on K and the live M alone, never on N, so a fused op's
columns still match their unfused linears bit for bit (unless the fused op's partials outgrow
the device's binding limit while the unfused ones fit: then the fused op runs unsplit).
Every dispatch is built once per load; `sizes` gives the ones that do not fit the live M a
workgroup count of 0, so the executor skips them.
Operands: x [..., K], packed int32 [N, K/8], scales float32 [K/gs, N padded to 4], bias [N] or
absent, optionally a residual [..., N], out [..., N]. K is a multiple of the group size (the
op's check), so of 32.

The kernels' stores go through store_output(), which the prelude supplies (one kernel body per
kernel, whatever it writes), so the GEMV (either reduction), both GEMM tiles and every GEMV
config take the same epilogue:
    q4gsw_epilogue_bias.wgsl   linear_q4gsw: out [..., N] = (y + bias) + residual, each term
                               optional (the residual: delegate/passes/residual_add.py)
    q4gsw_epilogue_split.wgsl  linear_q4gsw_multi (fused q/k/v, gate/up): the weight is the
                               outputs' concatenated along N, column n goes to the output whose
                               range holds it; outputs [..., N_i], no bias
    q4gsw_epilogue_swiglu.wgsl linear_q4gsw_swiglu (gate/up and their SwiGLU product): the
                               gate's and up's rows interleaved, out [..., N/2] =
                               silu(column 2j) * column 2j + 1, stored by store_pair()
A fused op is routed as one linear of the total N; every column's value is the one its own
linear_q4gsw would give (bit for bit), whichever kernel runs. The GEMV and the 128x128 tile
store a thread's columns as pairs (2j, 2j + 1), which the SwiGLU epilogue needs; the 64x64
tile does not, so linear_q4gsw_swiglu runs the 128x128 tile at every M > 1.

How a kernel reads x is the GEMV's prologue, which the prelude also supplies (begin_x, x_at):
plain, or for a fused RMSNorm (norm_eps set, delegate/passes/rms_norm_linear.py)
q4gsw_prologue_norm.wgsl, which recomputes the norm's statistics per workgroup and normalizes
x as it loads it, the rms_norm kernel's bits. At M > 1 such an op instead runs the rms_norm
kernel itself (normalization.py) into scratch 0, and its GEMMs read that as x; split K's
partials are then scratch 1.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from delegate.errors import UnsupportedError
from kernels_wgsl import Dispatch, groups, numel, register_wgsl, words
from kernels_wgsl.normalization import rms_norm_dispatch, rms_norm_params

GEMM, GEMM128, GEMV = "q4gsw_steel_gemm", "q4gsw_steel_gemm128", "q4gsw_coop_gemv"
TILE, TILE128 = 64, 128
# The 128x128 tile from this M up (below it, most of its rows would be padding) and only when
# the grid has at least this many tiles (fewer leave SMs idle that the 64x64 tile would fill).
# H200 (132 SMs), bench/q4gsw.py: at 64 tiles the 64x64 tile wins (M 512, N 2048, K 8192:
# 1339 against 1791 us), at 256 the 128x128 (M 2048, N 2048: 656 against 1026 us).
TILE128_MIN_M = 64
TILE128_MIN_TILES = 256
# Split K from this K up: chunks of K_SPLIT (a multiple of BK = 8), one workgroup per chunk
# and tile, at every M >= TILE128_MIN_M. Only the chunk length decides bits, so it is one
# constant; None turns split K off. The Llama-3.2-1B-shaped layer on an H100, summed GPU us
# (bench/results/splitk_h100.txt): off 3042 at T=512 and 1739 at T=128; 2048 (the down
# projection only) 2586 / 1305; 1024: 2544 / 1013; 512: 2498 / 778. The partials cost scratch
# of splits x M x N floats at the upper-bound M (SwiGLU's 4 x 2048 x 16384: 512 MiB).
K_SPLIT = 512
TILES_F16 = False   # f16 tile values where the device has shader-f16 (see the docstring)
TILE128_THREADS = 256
PRELUDE = {True: "enable f16;\nalias tile_t = f16;", False: "alias tile_t = f32;"}
_DIR = Path(__file__).parent
GEMV_REDUCE = {True: "q4gsw_gemv_reduce_subgroup.wgsl", False: "q4gsw_gemv_reduce_workgroup.wgsl"}
MAX_OUTPUTS = 3   # bindings 4..6 of the split epilogue: 6 storage buffers of the 8 allowed


@dataclass(frozen=True)
class Epilogue:
    """What a kernel's store_output() is: its WGSL, and its bindings 4.. as operands."""
    wgsl: str
    args: tuple            # operand per binding 1..: x, packed, scales, then the epilogue's
    writes: tuple
    constants: tuple

    def reading(self, x: int) -> "Epilogue":
        """The same, with binding 1 (x) reading operand x."""
        return replace(self, args=(x,) + tuple(self.args[1:]))


@dataclass(frozen=True)
class Norm:
    """An op's fused RMSNorm (norm_eps set): its weight is input 3, and at M > 1 the
    normalized x is scratch operand `scratch`, of `nbytes` at the upper-bound M."""
    eps: float
    scratch: int
    nbytes: int

    def gemv_prologue(self, k: int, lanes: int) -> str:
        eps_bits = struct.unpack("<I", struct.pack("<f", self.eps))[0]   # as words() rounds it
        return "\n".join([f"const NORM_WG: u32 = {NORM_PARTIALS}u;",
                          f"fn norm_eps() -> f32 {{ return bitcast<f32>({eps_bits}u); }}",
                          norm_partials_wgsl(k // 4, lanes),
                          (_DIR / "q4gsw_prologue_norm.wgsl").read_text()])

    def dispatch(self) -> Dispatch:
        """rms_norm of x (operand 0) by weight 3 into the scratch, at M > 1."""
        def sizes(ins, outs, attrs):
            m, k = _live_m(ins), int(attrs["K"])
            return rms_norm_params(m, k, self.eps), (m if m > 1 else 0)

        return rms_norm_dispatch(0, 3, self.scratch, sizes, True, (self.nbytes,))


NORM_PARTIALS = 128   # the rms_norm kernel's workgroup (normalization.wgsl): its partials


def norm_partials_wgsl(vecs: int, lanes: int) -> str:
    """WGSL of norm_partials(lane) for a row of `vecs` vec4s: partial t (< 128) sums the
    squares of vec4s t, t + 128, .. in order; lane holds t = lane + u * lanes. Unrolled, every
    load first (an index past the row reads its last vec4 and is not summed)."""
    parts = [u * lanes for u in range(max(1, NORM_PARTIALS // lanes))]
    steps = range(0, vecs, NORM_PARTIALS)
    loads, sums = [], []
    for u, t0 in enumerate(parts):
        sums.append(f"    var p{u} = 0.0;")
        for s in steps:
            first = s + t0   # the index lane 0 reads
            ragged = first + lanes > vecs or t0 + lanes > NORM_PARTIALS
            index = f"min(lane + {first}u, {vecs - 1}u)" if ragged else f"lane + {first}u"
            loads.append(f"    let v{u}_{s} = x[{index}];")
            step = f"add_squares4(p{u}, v{u}_{s})"
            if ragged:
                step = f"select(p{u}, {step}, lane + {first}u < {vecs}u && lane + {t0}u < {NORM_PARTIALS}u)"
            sums.append(f"    p{u} = {step};")
    stores = [f"    if (lane + {t0}u < {NORM_PARTIALS}u) {{ norm_red[lane + {t0}u] = p{u}; }}"
              for u, t0 in enumerate(parts)]
    return "\n".join(["fn norm_partials(lane: u32) {"] + loads + sums + stores + ["}"])


PLAIN_PROLOGUE = "fn begin_x(lane: u32) {}\nfn x_at(q: u32) -> vec4<f32> { return x[q]; }"
NORM_WORKGROUP_BYTES = 4 * NORM_PARTIALS   # q4gsw_prologue_norm.wgsl's norm_red


def fused_norm(ins, outs, attrs, info) -> Optional[Norm]:
    """The op's Norm, None without norm_eps. Its scratch is the first after the outputs."""
    if attrs.get("norm_eps") is None:
        return None
    if not info.scratch:
        raise UnsupportedError("a q4gsw op with a fused RMSNorm: expected the executor to bind "
                               "scratch for its M > 1 path, got BuildInfo.scratch False")
    return Norm(float(attrs["norm_eps"]), len(ins) + len(outs), numel(ins[0]) * 4)


def bias_epilogue(has_bias: bool, has_residual: bool = False) -> Epilogue:
    """linear_q4gsw: operands x, packed, scales, bias (absent: a dummy), then the residual
    when the node has one, then out; binding 6 is the residual (absent: a dummy)."""
    out = 5 if has_residual else 4
    return Epilogue((_DIR / "q4gsw_epilogue_bias.wgsl").read_text(),
                    (0, 1, 2, 3 if has_bias else None, out, 4 if has_residual else None), (out,),
                    (("HAS_BIAS", int(has_bias)), ("HAS_RESIDUAL", int(has_residual))))


def split_epilogue(widths, inputs: int = 3) -> Epilogue:
    """linear_q4gsw_multi: operands x, packed, scales (and a fused norm's weight: `inputs`
    4), then one output per width (a pair's third binding is a dummy that nothing writes)."""
    widths = [int(w) for w in widths]
    if not 2 <= len(widths) <= MAX_OUTPUTS:
        raise UnsupportedError(f"linear_q4gsw_multi outputs: expected 2 to {MAX_OUTPUTS}, "
                               f"got {len(widths)}")
    outs = tuple(inputs + i if i < len(widths) else None for i in range(MAX_OUTPUTS))
    return Epilogue((_DIR / "q4gsw_epilogue_split.wgsl").read_text(), (0, 1, 2) + outs, outs,
                    (("N0", widths[0]), ("N1", widths[1])))


def swiglu_epilogue(inputs: int = 3) -> Epilogue:
    """linear_q4gsw_swiglu: operands x, packed (gate and up rows interleaved), scales (and a
    fused norm's weight: `inputs` 4), out."""
    return Epilogue((_DIR / "q4gsw_epilogue_swiglu.wgsl").read_text(), (0, 1, 2, inputs),
                    (inputs,), ())


def q4_params(m: int, attrs: dict, tile: int) -> bytes:
    k, n = int(attrs["K"]), int(attrs["N"])
    return words(m, n, k, int(attrs["group_size"]), groups(n, 4) * 4, k // 8,
                 groups(m, tile), groups(n, tile))


def tile128_bytes(f16: bool) -> int:
    """Workgroup memory of the 128x128 tile: 2 stages of x and weight tiles, 8 k x 128."""
    return 2 * 2 * 8 * TILE128 * (2 if f16 else 4)


def tile128_fits(gpu, f16: bool) -> bool:
    limits = gpu.limits
    return (limits.get("max-compute-workgroup-storage-size", 16384) >= tile128_bytes(f16)
            and limits.get("max-compute-invocations-per-workgroup", 256) >= TILE128_THREADS)


def uses_tile128(m: int, n: int) -> bool:
    return m >= TILE128_MIN_M and groups(m, TILE128) * groups(n, TILE128) >= TILE128_MIN_TILES


def _live_m(ins) -> int:
    return numel(ins[0][:-1])


def steel_gemm(tile: int, f16: bool, n: int, epi: Epilogue, runs) -> Dispatch:
    """The GEMM of `tile` (64 or 128, unsplit), dispatched when runs(m, n) for the live M."""
    shader = GEMM if tile == TILE else GEMM128

    def sizes(ins, outs, attrs):
        m = _live_m(ins)
        return q4_params(m, attrs, tile), (groups(m, tile) * groups(n, tile) if runs(m, n) else 0)

    # the 128x128 module declares the partials (binding 7); unsplit, the output stands in
    args = epi.args if tile == TILE else _pad7(epi.args, epi.writes[0])
    return Dispatch(shader, shader, args, epi.writes, sizes, epi.constants,
                    label=shader + ("_f16" if f16 else "_f32"),
                    prelude=_tile_prelude(tile, f16, 1, 0) + "\n" + epi.wgsl)


def _pad7(args: tuple, operand) -> tuple:
    """args with `operand` at binding 7 (absent bindings between stay dummies)."""
    return tuple(args) + (None,) * (6 - len(args)) + (operand,)


def _tile_prelude(tile: int, f16: bool, splits: int, chunk: int) -> str:
    split = f"\nconst SPLITS: u32 = {splits}u;\nconst K_CHUNK: u32 = {chunk}u;"
    return PRELUDE[f16] + (split if tile == TILE128 else "")


def k_splits(k: int) -> int:
    """Chunks of K_SPLIT that split K (1: unsplit)."""
    return groups(k, K_SPLIT) if K_SPLIT and k > K_SPLIT else 1


def partials_bytes(ins, n: int, info) -> int:
    """Scratch of split K at the upper-bound M: splits x M x n_pad floats; 0 where K is not
    split, M never reaches TILE128_MIN_M, the executor binds no scratch, or the partials
    would outgrow one binding."""
    splits, m = k_splits(int(ins[0][-1])), _live_m(ins)
    nbytes = splits * m * groups(n, 4) * 16
    limit = info.gpu.limits.get("max-storage-buffer-binding-size", 1 << 27)
    fits = splits > 1 and m >= TILE128_MIN_M and info.scratch and nbytes <= limit
    return nbytes if fits else 0


def split_gemm(f16: bool, n: int, k: int, epi: Epilogue, operands: int, scratch: tuple) -> list:
    """Split K's two dispatches, live at M >= TILE128_MIN_M: the 128x128 tile per (chunk,
    tile) writing partials (scratch operand `operands`, the last of the `scratch` sizes), then
    the ordered sum of the chunks stored through the epilogue."""
    splits = k_splits(k)
    runs = lambda m: m >= TILE128_MIN_M   # noqa: E731

    def gemm_sizes(ins, outs, attrs):
        m = _live_m(ins)
        count = groups(m, TILE128) * groups(n, TILE128) * splits
        return q4_params(m, attrs, TILE128), count if runs(m) else 0

    def reduce_sizes(ins, outs, attrs):
        m = _live_m(ins)
        return q4_params(m, attrs, TILE128), groups(m * groups(n, 4), 256) if runs(m) else 0

    args, writes = _pad7(epi.args, operands), tuple(epi.writes) + (operands,)
    extra = {"prelude": _tile_prelude(TILE128, f16, splits, K_SPLIT) + "\n" + epi.wgsl,
             "scratch": tuple(scratch)}
    tag = "_f16" if f16 else "_f32"
    return [Dispatch(GEMM128, GEMM128, args, writes, gemm_sizes, epi.constants,
                     label=f"{GEMM128}_splitk{tag}", **extra),
            Dispatch(GEMM128, "q4gsw_splitk_reduce", args, writes, reduce_sizes, epi.constants,
                     label="q4gsw_splitk_reduce", shared_params=True, **extra)]


# ---- the GEMV -----------------------------------------------------------------------------------
# A chunk is `words` packed u32 words, one load; its WGSL type and widening to vec4<u32>.
GEMV_CHUNKS = {1: ("u32", "vec4<u32>(c, 0u, 0u, 0u)"), 2: ("vec2<u32>", "vec4<u32>(c, 0u, 0u)"),
               4: ("vec4<u32>", "c")}
GEMV_COLS, GEMV_UNROLLS = (4, 8, 16), (1, 2, 4)
# Routing from bench/q4gsw.py --sweep-gemv on the H200 (bench/results/q4gsw_gemv_sweep_h200.txt,
# a Llama-3.2-1B decode step's GEMVs at each layout's fastest schedule): vec2<u32> loads and
# 4 chunks per lane, i.e. 32 lanes at K = 2048 (447.3 us against 472.9 for the old w1 l64) and
# 128 at K = 8192 (145.6 us against 150.6 for w1 l256).
GEMV_WORDS = 2
GEMV_LANE_CHUNKS = 4                      # lanes = K / (8 * words * this), a power of 2 ...
GEMV_MIN_LANES, GEMV_MAX_LANES = 32, 256  # ... within these (256: WebGPU's default limit)
# Columns and unrolling, from the same sweep at the routed w2 l32 (K = 2048): 4 columns with
# every chunk of a lane in one loop step up to the FFN's N (N = 8192: 8.12 us against 10.52
# for c8 u4; N = 16384: 11.99 against 13.20), 8 columns a step at a time from this N on
# (N = 128256, the LM head: 59.99 us against 65.69 for c8 u4 and 63.93 for c4 u4), where
# the grid alone keeps loads enough in flight. No N between 16384 and 128256 was measured.
GEMV_WIDE_N = 65536


@dataclass(frozen=True)
class GemvConfig:
    """One build of q4gsw_coop_gemv.wgsl. `words` and `lanes` split K among the lanes: with the
    reduction they decide an output's bits, so the router picks them by K alone and a fused
    op's columns keep their unfused bits. `cols`, `unroll` and `x_staged` only schedule the
    work and change no bit."""
    words: int = 1          # u32 words per weight load: 1 (u32), 2 (vec2<u32>), 4 (vec4<u32>)
    lanes: int = 64         # lanes along K: the workgroup size, a power of 2 >= 32
    cols: int = 8           # output columns per workgroup: 4, 8 or 16
    unroll: int = 4         # chunks per lane whose loads a loop step issues together: 1, 2, 4
    x_staged: bool = False  # x read through workgroup memory instead of global loads

    def __post_init__(self):
        ok = (self.words in GEMV_CHUNKS and self.cols in GEMV_COLS
              and self.unroll in GEMV_UNROLLS and self.lanes >= 32
              and self.lanes & (self.lanes - 1) == 0)
        if not ok:
            raise UnsupportedError(f"GEMV config: expected words 1/2/4, lanes a power of 2 >= 32, "
                                   f"cols 4/8/16, unroll 1/2/4, got {self}")

    @property
    def name(self) -> str:
        return (f"w{self.words} l{self.lanes} c{self.cols} u{self.unroll}"
                + (" xs" if self.x_staged else ""))

    def workgroup_bytes(self, subgroups: bool, norm: bool = False) -> int:
        """Workgroup memory: the reduction's (per subgroup, or per lane and column), x's and a
        fused norm's."""
        sums = 16 * 4 * (self.lanes // 4) if subgroups else 4 * self.cols * self.lanes
        return sums + 16 * self.x_stage_len() + (NORM_WORKGROUP_BYTES if norm else 0)

    def x_stage_len(self) -> int:
        return 2 * self.words * (self.unroll * self.lanes + 1) if self.x_staged else 1

    def fits(self, gpu, subgroups: bool, norm: bool = False) -> bool:
        limits = gpu.limits
        return (self.lanes <= limits.get("max-compute-invocations-per-workgroup", 256)
                and self.lanes <= limits.get("max-compute-workgroup-size-x", 256)
                and self.workgroup_bytes(subgroups, norm)
                <= limits.get("max-compute-workgroup-storage-size", 16384))

    def prelude(self, group_size: int) -> str:
        chunk, widen = GEMV_CHUNKS[self.words]
        return "\n".join([
            f"alias wchunk = {chunk};",
            f"fn words4(c: wchunk) -> vec4<u32> {{ return {widen}; }}",
            f"const WORDS: u32 = {self.words}u;", f"const LANES: u32 = {self.lanes}u;",
            f"const QUADS: u32 = {self.cols // 4}u;", f"const UNROLL: u32 = {self.unroll}u;",
            f"const GROUP: u32 = {int(group_size)}u;",
            f"const X_STAGED: bool = {str(self.x_staged).lower()};",
            f"const X_STAGE_LEN: u32 = {self.x_stage_len()}u;"])


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, int(v) - 1).bit_length()


def gemv_layout(k: int, gpu) -> tuple:
    """(words, lanes) for K; the device's limit on lanes falls back to 64 (fits every device)."""
    lanes = _pow2_at_least(groups(k, 8 * GEMV_WORDS * GEMV_LANE_CHUNKS))
    lanes = min(GEMV_MAX_LANES, max(GEMV_MIN_LANES, lanes))
    if GemvConfig(GEMV_WORDS, lanes, 4, 1).fits(gpu, False):
        return GEMV_WORDS, lanes
    return GEMV_WORDS, 64


def gemv_config(k: int, n: int, gpu, subgroups: bool, norm: bool = False) -> GemvConfig:
    """The routed GEMV: the layout of K; below GEMV_WIDE_N 4 columns and as many chunks per
    loop step as a lane has (up to 4), from it 8 columns a chunk a step; fewer columns where
    workgroup memory is short (no bit changes)."""
    words, lanes = gemv_layout(k, gpu)
    per_lane = groups(k // (8 * words), lanes)
    unroll = max(u for u in GEMV_UNROLLS if u <= max(1, per_lane))
    cols = 4
    if n >= GEMV_WIDE_N:
        cols, unroll = 8, 1
    config = GemvConfig(words, lanes, cols, unroll)
    while not config.fits(gpu, subgroups, norm) and config.cols > 4:
        config = GemvConfig(words, lanes, config.cols // 2, unroll)
    return config


def coop_gemv(subgroups: bool, n: int, epi: Epilogue, runs, config: GemvConfig,
              group_size: int, norm: Optional[Norm] = None, k: int = 0) -> Dispatch:
    """The GEMV of `config`, its cross-lane sums by subgroupAdd or through workgroup memory,
    x read plainly or, with `norm` (K = k), normalized by its prologue (weight: binding 7)."""

    def sizes(ins, outs, attrs):
        m = _live_m(ins)
        return q4_params(m, attrs, 1), (groups(n, config.cols) if runs(m, n) else 0)

    reduce = (_DIR / GEMV_REDUCE[subgroups]).read_text()
    prologue = PLAIN_PROLOGUE if norm is None else norm.gemv_prologue(k, config.lanes)
    args = epi.args if norm is None else _pad7(epi.args, 3)
    return Dispatch(GEMV, GEMV, args, epi.writes, sizes, epi.constants,
                    label=GEMV + ("_subgroup" if subgroups else ""),
                    prelude="\n".join([config.prelude(group_size), reduce, prologue, epi.wgsl]))


def _gemv(ins, outs, attrs, epi: Epilogue, info, norm: Optional[Norm]) -> Dispatch:
    """The op's GEMV, live at M == 1."""
    k, n, group_size = int(attrs["K"]), int(attrs["N"]), int(attrs["group_size"])
    subgroups = bool(info.gpu.has_subgroups)
    config = gemv_config(k, n, info.gpu, subgroups, norm is not None)
    return coop_gemv(subgroups, n, epi, lambda m, n: m == 1, config, group_size, norm, k)


def _split(f16: bool, n: int, k: int, epi: Epilogue, ins, outs, norm, partials: int) -> list:
    """split_gemm's dispatches, its partials the scratch after a fused norm's."""
    first = len(ins) + len(outs)
    if norm is None:
        return split_gemm(f16, n, k, epi, first, (partials,))
    return split_gemm(f16, n, k, epi, first + 1, (norm.nbytes, partials))


def _normed(norm: Optional[Norm], gemms: list, gemv: Dispatch) -> list:
    """A fused norm's rms_norm dispatch first (live at M > 1), then the GEMMs and the GEMV."""
    return ([] if norm is None else [norm.dispatch()]) + gemms + [gemv]


def routed(ins, outs, attrs: dict, epi: Epilogue, info, norm: Optional[Norm] = None) -> list:
    """Every kernel one q4gsw op of N columns may run, each live only at the M it fits:
    the GEMV at M == 1, else the 64x64 tile or, where it fits and pays, the 128x128 one; with
    split K, the 64x64 tile below TILE128_MIN_M and the split 128x128 tile from it. With a
    fused norm, its rms_norm first at M > 1, whose output the GEMMs read as x."""
    k, n = int(attrs["K"]), int(attrs["N"])
    f16 = TILES_F16 and bool(info.gpu.has_f16)
    gemv = _gemv(ins, outs, attrs, epi, info, norm)
    tiles = epi if norm is None else epi.reading(norm.scratch)
    if not tile128_fits(info.gpu, f16):
        return _normed(norm, [steel_gemm(TILE, f16, n, tiles, lambda m, n: m > 1)], gemv)
    scratch = partials_bytes(ins, n, info)
    if scratch:
        small = steel_gemm(TILE, f16, n, tiles, lambda m, n: 1 < m < TILE128_MIN_M)
        return _normed(norm, [small, *_split(f16, n, k, tiles, ins, outs, norm, scratch)], gemv)
    small = steel_gemm(TILE, f16, n, tiles, lambda m, n: m > 1 and not uses_tile128(m, n))
    return _normed(norm, [small, steel_gemm(TILE128, f16, n, tiles, uses_tile128)], gemv)


def routed_pairs(ins, outs, attrs: dict, epi: Epilogue, info, norm: Optional[Norm] = None) -> list:
    """The kernels of an op whose epilogue takes column pairs (2j, 2j + 1) from one thread:
    the GEMV at M == 1 and the 128x128 tile at any M > 1 (it fits WebGPU's default limits;
    the 64x64 tile's threads hold columns 16 apart), split from TILE128_MIN_M where routed()
    splits. Every tile gives the bits routed() gives at that M. A fused norm as routed()."""
    k, n = int(attrs["K"]), int(attrs["N"])
    f16 = TILES_F16 and bool(info.gpu.has_f16)
    if not tile128_fits(info.gpu, f16):
        raise UnsupportedError(f"linear_q4gsw_swiglu: expected the device to fit the 128x128 "
                               f"tile ({tile128_bytes(f16)} B of workgroup memory, "
                               f"{TILE128_THREADS} invocations), got limits {info.gpu.limits}")
    gemv = _gemv(ins, outs, attrs, epi, info, norm)
    tiles = epi if norm is None else epi.reading(norm.scratch)
    scratch = partials_bytes(ins, n, info)
    if scratch:
        unsplit = steel_gemm(TILE128, f16, n, tiles, lambda m, n: 1 < m < TILE128_MIN_M)
        return _normed(norm, [unsplit, *_split(f16, n, k, tiles, ins, outs, norm, scratch)],
                       gemv)
    return _normed(norm, [steel_gemm(TILE128, f16, n, tiles, lambda m, n: m > 1)], gemv)


@register_wgsl("linear_q4gsw")
def linear_q4gsw(ins, outs, attrs, info):
    has_bias = len(ins) > 3 and ins[3] is not None
    has_residual = len(ins) > 4 and ins[4] is not None
    return routed(ins, outs, attrs, bias_epilogue(has_bias, has_residual), info)


@register_wgsl("linear_q4gsw_multi")
def linear_q4gsw_multi(ins, outs, attrs, info):
    norm = fused_norm(ins, outs, attrs, info)
    return routed(ins, outs, attrs, split_epilogue(attrs["widths"], len(ins)), info, norm)


@register_wgsl("linear_q4gsw_swiglu")
def linear_q4gsw_swiglu(ins, outs, attrs, info):
    norm = fused_norm(ins, outs, attrs, info)
    return routed_pairs(ins, outs, attrs, swiglu_epilogue(len(ins)), info, norm)
