"""Fuse a layer's q/k rope_pair with its KV cache writes into one rope_cache
(delegate/ops/rope.py).

After the rope pass (q' = rope(q), k' = rope(k) as one rope_pair) and the cache_write pass
(k and v written into their caches as one slice_scatter_pair), ExecuTorch's Llama layer runs
two dispatches where k' exists only to be copied into its cache:

    q', k' = rope_pair(q, k, cos, sin);  v_cache' = slice_scatter_pair(v_cache, v, k_cache, k')
        ─► v_cache', q' = rope_cache(v_cache, v, k_cache, k, q, cos, sin, rotated=1)

It fires where one of the paired writes copies a rotated k that nothing else reads (through
the permutes the write reads it through, each read only on the way), the other write's
source is computed before the rope, and the other rotation is q. The node is emitted at the
rope's root, so the caches are written there, before their writes in graph order: sound
because the cache_write pass pairs only caches that their writes alone read. Everything else
of the two matches emits nothing; the earlier write's result is its cache, as in a
slice_scatter_pair. A rope_pair or write pair that does not match lowers as before.
"""
from __future__ import annotations

from delegate.ops.shape import write_broadcasts, write_inputs, write_source, write_target
from delegate.passes import cache_write, rope
from delegate.passes._match import lower_nothing


def detect(graph) -> dict:
    rewrites = {}
    place = {n: i for i, n in enumerate(graph.nodes)}
    writes = cache_write.pairs(graph)
    for group in rope.groups(graph):
        found = _match(group, writes, place)
        if found is None:
            continue
        q_match, k_match, chain, first, second, rotated = found
        for root, *_, absorbed in group:
            rewrites.update((n, lower_nothing) for n in [root, *absorbed])
        rewrites.update((n, lower_nothing) for n in chain)
        rewrites[first] = cache_write.lower_first(first, second)
        rewrites[second] = _lower_later_write(first, second)
        rewrites[group[-1][0]] = _lower(group, q_match, k_match, first, second, rotated)
    return rewrites


def _match(group, writes, place):
    """(q's match, k's match, the permutes from k' to its write, the earlier write, the later,
    rotated: 1 where k's is the earlier) of a rope_pair group and a write pair it feeds, else
    None."""
    if len(group) != 2:
        return None
    for first, second in writes:
        for rotated, k_write, v_write in ((1, first, second), (0, second, first)):
            chain = _chain(k_write)
            k = next((j for j, m in enumerate(group) if chain and m[0] is chain[0]), None)
            v_src = write_source(v_write)[0]
            if k is not None and not write_broadcasts(v_write) and \
                    place[v_src] < place[group[-1][0]]:
                return group[1 - k], group[k], chain[1:], first, second, rotated
    return None


def _chain(write):
    """[the node the write copies, the permutes it reads it through...], each read only by
    the next and the last only by the write, else None."""
    if write_broadcasts(write):
        return None
    chain = [write_source(write)[0]]
    while True:
        users = list(chain[-1].users)
        if len(users) != 1:
            return None
        if users[0] is write:
            return chain
        chain.append(users[0])


def _lower_later_write(first, second):
    """Nothing where rope_cache wrote the caches; else the write as cache_write lowers it."""
    def lower(ctx, node):
        if not cache_write.states(ctx, first, second):
            cache_write.lower_second(first, second)(ctx, node)

    return lower


def _lower(group, q_match, k_match, first, second, rotated):
    """rope_cache at the rope's later root: the later write's cache in place as output 0,
    then q'; k's write reads k itself, unrotated. Caches that are not delegate states (a
    caller's inputs, which cache_write's pair may not write in place either) keep the
    rope_pair, and their writes lower as the cache_write pass lowers them."""
    q_root, q, cos, sin, style, rotary_dim, _ = q_match
    k = k_match[1]

    def sources(ctx, write, is_k: bool) -> tuple:
        if not is_k:
            return write_inputs(ctx, write)
        dst, dim, start = write_target(ctx, write)
        return dst, ctx.tensor(k), dim, start, write_source(write)[1]

    def lower(ctx, node):
        if not cache_write.states(ctx, first, second):
            return rope.lower_group(group)(ctx, node)
        dst1, src1, _, _, perm1 = sources(ctx, first, rotated == 1)
        dst, src, dim, start, perm = sources(ctx, second, rotated == 0)
        ins = [dst, src, dst1, src1] + [ctx.tensor(t) for t in (q, cos, sin)]
        ctx.emit("rope_cache", ins, [cache_write.written(ctx, second), ctx.output(q_root)],
                 style=style, rotary_dim=rotary_dim, dim=dim, start=start, src_dims=perm,
                 src_dims1=perm1, rotated=rotated)

    return lower
