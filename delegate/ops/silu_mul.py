"""silu_mul: the SwiGLU product silu(gate) * up, in one elementwise pass.

    out = gate * sigmoid(gate) * up,   sigmoid(g) = 1 / (1 + e^-g)

It has no edge target: only the graph pass delegate/passes/swiglu.py emits it, for
`silu(g) * up` or `sigmoid(g) * g * up`, over two float32 tensors of one shape (no
broadcasting). Its kernels are kernels_cpu/elementwise.py and kernels_wgsl/elementwise.*.
"""
from __future__ import annotations

from delegate.errors import DelegateError, UnsupportedError, expect
from delegate.ops import register_op
from delegate.ops._common import one_input


def _infer_silu_mul(in_shapes, attrs):
    one_input(in_shapes, 2)
    gate, up = tuple(in_shapes[0]), tuple(in_shapes[1])
    expect(gate == up, DelegateError, "silu_mul up", f"the gate's shape {gate}", up)
    return [gate]


def _lower_silu_mul(ctx, node):
    # unreachable through the registry (no targets); says so if a plugin routes a node here
    raise UnsupportedError(f"node {node.name}: expected silu_mul only from the swiglu pass "
                           f"(delegate/passes/swiglu.py), got an edge node lowered as it")


register_op("silu_mul", (), _infer_silu_mul, _lower_silu_mul,
            doc="silu(gate) * up over equal shapes; emitted by the swiglu pass", attrs={},
            arity=(2, 1))
