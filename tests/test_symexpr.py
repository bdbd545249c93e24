"""symexpr: the blob's symbolic sizes evaluate as sympy (their writer) evaluates them."""
import pytest
import sympy

from delegate import symexpr
from delegate.errors import BlobError, DelegateError

# Forms torch.export and sympy write: FloorDiv/Mod from torch, floor(a/b) from sympy's own
# simplification (a padded chunk count), ceiling from pad-to-multiple, Max/Min from slicing.
EXPRS = [
    "s0", "2*s0 + 1", "(s0//2)", "s0 - 1", "-s0 + 7", "Mod(s0, 64)", "Mod(-s0, 64)",
    "floor(s0/64 + Mod(-s0, 64)/64)", "ceiling(s0/64)", "64*ceiling(s0/64) - s0",
    "Max(1, s0 - 3)", "Min(s0, 2048)", "floor(s0/3)", "FloorDiv(s0 + s1, 4)", "s0*s1",
    "floor((s0 + s1)/7)", "Mod(s0*s1, 5)",
]
VALUES = [1, 2, 3, 7, 13, 63, 64, 65, 127, 511, 2047]


def _sympy_value(expr, env):
    locals_ = {"Mod": sympy.Mod, "FloorDiv": lambda a, b: sympy.floor(a / b),
               "floor": sympy.floor, "ceiling": sympy.ceiling, "Max": sympy.Max,
               "Min": sympy.Min, **{k: sympy.Symbol(k, integer=True, positive=True) for k in env}}
    return int(sympy.sympify(expr, locals=locals_).subs({locals_[k]: v for k, v in env.items()}))


@pytest.mark.parametrize("expr", EXPRS)
def test_evaluate_agrees_with_sympy_on_prime_and_power_of_two_sizes(expr):
    for s0 in VALUES:
        env = {"s0": s0, "s1": (s0 * 7) % 31 + 1}
        assert symexpr.evaluate(expr, env) == _sympy_value(expr, env), (expr, env)


def test_sympys_padded_chunk_count_is_the_ceiling():
    for s0 in range(1, 300):
        assert symexpr.evaluate("floor(s0/64 + Mod(-s0, 64)/64)", {"s0": s0}) == -(-s0 // 64)


def test_a_true_division_that_is_not_an_integer_is_refused_not_rounded():
    assert symexpr.evaluate("s0/2", {"s0": 6}) == 3
    with pytest.raises(BlobError, match=r"expected an integer, got 7/2"):
        symexpr.evaluate("s0/2", {"s0": 7})


@pytest.mark.parametrize("bad, why", [
    ("floor(s0, 2)", r"floor\(\) of 1 argument"),
    ("Mod(s0)", r"Mod\(\) of 2 argument"),
    ("Max()", r"Max\(\) of one or more"),
    ("exp(s0)", "expected calls of"),
    ("s0 * 0.5", "expected"),
    ("s0 ** 2", "expected"),
    ("__import__('os')", "expected calls of"),
    ("s0 +", "symbolic size"),
])
def test_malformed_expressions_are_blob_errors_that_say_what_was_expected(bad, why):
    with pytest.raises(BlobError, match=why) as err:
        symexpr.evaluate(bad, {"s0": 4})
    assert isinstance(err.value, DelegateError)


def test_an_unbound_symbol_is_named():
    with pytest.raises(BlobError, match=r"expected symbol 's1' bound"):
        symexpr.evaluate("floor(s1/2)", {"s0": 4})
    assert symexpr.symbols_of("floor(s0/64 + Mod(-s1, 64)/64)") == {"s0", "s1"}
