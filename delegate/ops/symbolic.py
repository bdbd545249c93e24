"""Size queries (aten.sym_size.int). They run no kernel: the IR records every dynamic size as
an expression over the delegate's input dims, so a sym_size node only needs to stay inside
its partition to keep the SymInt from becoming a delegate input or output."""
from delegate.ops import register_op


def _lower_nothing(ctx, node) -> None:
    """Users read the size through ctx.dim(node), which takes its symbolic value from meta."""


register_op(
    "sym_size",
    targets=("aten.sym_size.int",),
    infer=lambda in_shapes, attrs: [],
    lower=_lower_nothing,
    dtypes=(),
    doc="size of a dim; folded into symbolic sizes at lowering",
    folded=True,
    attrs={},
    arity=(0, 0),
)
