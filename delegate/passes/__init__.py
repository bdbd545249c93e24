"""Graph passes over a partition's edge graph, run by preprocess before lowering.

A pass is a pure detection pre-pass: `detect(graph)` only reads the fx graph (and the program's
constants) and returns rewrites, fx node -> the lowering that replaces that node's own. A node
no pass matched lowers through its OpDef, so a graph with no match lowers byte-identically
with the passes on or off.

Compile spec "passes": comma-separated names of the passes to run, or "none"; absent: all.
"""
from __future__ import annotations

from delegate.errors import DelegateError
from delegate.passes import cache_write
from delegate.passes import fold_batch_norm
from delegate.passes import fuse_linear
from delegate.passes import linear_swiglu
from delegate.passes import residual_add
from delegate.passes import rms_norm
from delegate.passes import rms_norm_linear
from delegate.passes import rope
from delegate.passes import rope_cache
from delegate.passes import sdpa_layout
from delegate.passes import swiglu

PASSES = {"fold_batch_norm": fold_batch_norm.detect, "fuse_linear": fuse_linear.detect,
          "residual_add": residual_add.detect, "swiglu": swiglu.detect,
          # after fuse_linear and swiglu: it replaces their rewrites of the nodes it absorbs
          "linear_swiglu": linear_swiglu.detect,
          "rms_norm": rms_norm.detect,
          # after rms_norm, fuse_linear and linear_swiglu: it replaces their rewrites of the
          # nodes it absorbs
          "rms_norm_linear": rms_norm_linear.detect,
          "rope": rope.detect, "sdpa_layout": sdpa_layout.detect,
          "cache_write": cache_write.detect,
          # after rope and cache_write: it replaces their rewrites of the nodes it absorbs
          "rope_cache": rope_cache.detect}
# A pass that fuses other passes' matches runs only where they run too.
REQUIRES = {"rope_cache": ("rope", "cache_write")}
SPEC_KEY = "passes"


def enabled(compile_specs) -> tuple:
    """Names of the passes the compile specs ask for (all when they say nothing)."""
    value = next((bytes(cs.value) for cs in compile_specs or () if cs.key == SPEC_KEY), None)
    if value is None:
        return tuple(PASSES)
    text = value.decode()
    if text == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise DelegateError(f"compile spec {SPEC_KEY!r}: expected 'none' or names from "
                            f"{sorted(PASSES)}, got {text!r}")
    return names


def rewrites(graph, names) -> dict:
    """fx node -> replacement lowering, from every enabled pass (run in PASSES order)."""
    out: dict = {}
    for name in PASSES:
        if name in names and all(n in names for n in REQUIRES.get(name, ())):
            out.update(PASSES[name](graph))
    return out
