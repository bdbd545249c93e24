"""Pair a layer's two KV cache writes into one slice_scatter_pair (delegate/ops/shape.py).

ExecuTorch's Llama writes its new k and v rows into the resident caches at one position, as
edge holds it either `index_put(cache, [None, None, pos + arange(T)], x)` (the plain form) or
`auto_functionalized_v2(llama.update_cache, value=x, start_pos=pos, _all_bases=[cache])`
(the custom-op form); each lowers to a slice_scatter_, one strided_copy dispatch on WebGPU:

    k' = slice_scatter_(k_cache, k, dim, start);  v' = slice_scatter_(v_cache, v, dim, start)
        ─► v' = slice_scatter_pair(v_cache, v, k_cache, k, dim, start)     k' is k_cache itself

Two writes of the same dim, start and row count (their shapes may differ: K and V head dims)
pair in graph order, a leftover stays a slice_scatter_. The pair is emitted at the later write
and updates the later cache as its output and the earlier cache in place; the earlier write
emits nothing and its result is the earlier cache's own value. That is sound only where each
cache is a state placeholder that its write alone reads (so no one sees its old rows after the
pair, and the later write stays in place: ir.in_place_ok), and nothing reads the earlier
write's result before the later write. Caches that are not states at lowering (a user input)
lower as the two writes they were.
"""
from __future__ import annotations

from delegate.host_values import same_element_symbols
from delegate.lowering import sym_text
from delegate.symexpr import renamed
from delegate.ops.attention import repeat_reader
from delegate.ops.export import op_for_target, pattern_for
from delegate.ops.shape import cache_write, write_inputs
from delegate.passes._match import only_feeds, unread_before


def detect(graph) -> dict:
    rewrites = {}
    for first, second in pairs(graph):
        rewrites[first] = lower_first(first, second)
        rewrites[second] = lower_second(first, second)
    return rewrites


def pairs(graph) -> list:
    """(earlier, later) writes of one dim, start and row count into two cache placeholders,
    each earlier write paired with the next such write where unread_before allows."""
    nodes = list(graph.nodes)
    place = {n: i for i, n in enumerate(nodes)}
    names = same_element_symbols(graph)   # each write may `.item()` the position itself
    pairs, unpaired = [], {}   # (dim, start, rows) -> earlier write
    for node in nodes:
        found = cache_write(node)
        if found is None or found[0].op != "placeholder" or not only_feeds(found[0], node):
            continue
        _, dim, start, rows = found
        key = (dim, renamed(start, names), renamed(sym_text(rows), names))
        first = unpaired.pop(key, None)
        # the pair writes the earlier cache at the later write: nothing may read it before.
        # An sdpa's repeat of the cache's heads is no read (torch 2.11 orders v's before k's
        # rope and write; the sdpa reads the cache itself, after both)
        if first is not None and unread_before(first, node, place, repeat_reader):
            pairs.append((first, node))
        else:
            unpaired[key] = node
    return pairs


# ---- lowering ----------------------------------------------------------------------------------
def states(ctx, first, second) -> bool:
    """Both caches are delegate-owned states, which only the pair may write into as an input
    (a state or input placeholder is bound before any call lowers)."""
    return all(ctx.graph.values[ctx.tensor(cache_write(n)[0])].state for n in (first, second))


def _own_lowering(ctx, node) -> None:
    """The write as the registry lowers it (the update_cache pattern, or the slice_scatter op)."""
    (pattern_for(node) or op_for_target(node.target)).lower(ctx, node)


def lower_first(first, second):
    """The earlier write emits nothing: its result is its cache, written by the pair."""
    def lower(ctx, node):
        if not states(ctx, first, second):
            return _own_lowering(ctx, node)
        dst = ctx.tensor(cache_write(node)[0])
        if pattern_for(node) is not None:   # (update_cache's own dummy result, the cache)
            ctx.alias(node, [ctx.outputs(node)[0], dst])
        else:
            ctx.alias(node, dst)

    return lower


def lower_second(first, second):
    """slice_scatter_pair at the later write: its cache in place as output 0, then the
    earlier's (inputs made in graph order, as the two writes made them)."""
    def lower(ctx, node):
        if not states(ctx, first, second):
            return _own_lowering(ctx, node)
        dst1, src1, _, _, perm1 = write_inputs(ctx, first)
        dst, src, dim, start, perm = write_inputs(ctx, node)
        ctx.emit("slice_scatter_pair", [dst, src, dst1, src1], [written(ctx, node)], dim=dim,
                 start=start, src_dims=perm, src_dims1=perm1)

    return lower


def written(ctx, node) -> int:
    """The value of the later write's updated cache, made for the node that writes it."""
    return ctx.outputs(node)[1] if pattern_for(node) is not None else ctx.output(node)
