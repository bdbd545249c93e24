"""once: a session cache for the tests' lowering helpers (a lowering is seconds of export and
edge passes; a test only reads the program manager it gets, and loads its own copy to run).

functools.lru_cache keys on the call as spelled, so f("cpu") and f("cpu", None) lower twice;
once keys on the bound arguments, defaults applied, so every spelling of a call shares one
lowering. fn itself stays reachable as __wrapped__, for a lowering that must not be shared
(one made under a monkeypatch)."""
import functools
import inspect


def once(fn):
    signature, results = inspect.signature(fn), {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = tuple((name, _hashable(value)) for name, value in bound.arguments.items())
        if key not in results:
            results[key] = fn(*bound.args, **bound.kwargs)
        return results[key]

    return call


def _hashable(value):
    """A **kwargs dict as its sorted items; anything else as it is."""
    return tuple(sorted(value.items())) if isinstance(value, dict) else value
