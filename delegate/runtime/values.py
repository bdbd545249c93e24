"""The value table of one loaded method: ExecuTorch EValues as Python objects.

`vals[i]` holds value i: a torch.Tensor (a view into the arena, a constant, or a bounded
owned buffer), an int / float / bool / str, or None. List values are kept as their item
indices and assembled when an instruction reads them, because an IntList's items are value
indices of Ints that symbolic-shape ops may rewrite during execution.
"""
from __future__ import annotations

import torch

from delegate.errors import InputError, ProgramError, UnsupportedError
from delegate.runtime.memory import (
    CAPACITY_MARK, DYNAMIC_UNBOUND, EXTERNAL, STATIC, dim_order_strides, nbytes_of,
    owned_region, tensor_over, torch_dtype)

_KINDS = {
    "Null": "null", "Int": "int", "Double": "double", "Bool": "bool", "String": "string",
    "Tensor": "tensor", "IntList": "int_list", "DoubleList": "double_list",
    "BoolList": "bool_list", "TensorList": "tensor_list",
    "OptionalTensorList": "opt_tensor_list",
}


def _literal(kind: str, x):
    # The deserializer hands non-finite doubles back as strings ("-inf", "nan").
    return float(x) if kind in ("double", "double_list") else x


class TensorMeta:
    """What the plan declares for a tensor value: dtype, (upper-bound) sizes, dynamism."""

    __slots__ = ("dtype", "sizes", "dynamism", "planned", "constant")

    def __init__(self, dtype, sizes, dynamism, planned, constant):
        self.dtype, self.sizes, self.dynamism = dtype, sizes, dynamism
        self.planned, self.constant = planned, constant


class ValueTable:
    def __init__(self, values: list, program, arena, written: set[int]):
        self.vals: list = [None] * len(values)
        self.kind: list[str] = []
        self.items: dict[int, list] = {}
        self.meta: dict[int, TensorMeta] = {}
        self.written = written
        self.preloaded: set[int] = set()  # tensors holding data at load: constants, buffers
        self._program, self._arena = program, arena
        for i, ev in enumerate(values):
            self._add(i, getattr(ev, "val", None))

    # -- construction ---------------------------------------------------------------------
    def _add(self, i: int, v) -> None:
        kind = _KINDS.get(type(v).__name__)
        if kind is None:
            raise ProgramError(f"value {i}: expected an EValue of {sorted(_KINDS)}, got {v!r}")
        self.kind.append(kind)
        if kind == "tensor":
            self.vals[i] = self._tensor(i, v)
        elif kind in ("int", "double", "bool", "string"):
            self.vals[i] = _literal(kind, getattr(v, f"{kind}_val"))
        elif kind != "null":
            self.items[i] = [_literal(kind, x) for x in v.items]
            if kind in ("int_list", "tensor_list", "opt_tensor_list"):
                self._check_items(i, kind)

    def _check_items(self, i: int, kind: str) -> None:
        n = len(self.vals)
        low = -1 if kind == "opt_tensor_list" else 0
        for j in self.items[i]:
            if not low <= j < n:
                raise ProgramError(f"value {i} ({kind}) item: expected a value index in "
                                   f"[{low}, {n}), got {j}")

    def _tensor(self, i: int, t) -> torch.Tensor:
        dtype = torch_dtype(t.scalar_type)
        sizes = [int(s) for s in t.sizes]
        if any(s < 0 for s in sizes):
            raise ProgramError(f"value {i} sizes: expected non-negative, got {sizes}")
        if t.storage_offset:
            raise UnsupportedError(f"value {i} storage_offset: expected 0, got {t.storage_offset}")
        strides = dim_order_strides(sizes, list(t.dim_order))
        nbytes = nbytes_of(sizes, dtype)
        dynamism = int(t.shape_dynamism)
        ext = t.extra_tensor_info
        external = ext is not None and int(ext.location) == EXTERNAL
        planned = t.allocation_info is not None
        constant = not planned and (external or t.data_buffer_idx > 0)
        self.meta[i] = TensorMeta(dtype, sizes, dynamism, planned, constant)
        if constant:
            self.preloaded.add(i)
        if planned:
            return self._planned(i, t, dtype, sizes, strides, nbytes, ext if external else None)
        if external:
            region = self._program.named_region(ext.fully_qualified_name, nbytes)
            return tensor_over(region, dtype, sizes, strides)
        if t.data_buffer_idx > 0:
            region = self._program.constant_region(t.data_buffer_idx, nbytes)
            return tensor_over(region, dtype, sizes, strides)
        if dynamism == DYNAMIC_UNBOUND:  # the runtime owns it and may grow it freely
            return torch.empty(sizes, dtype=dtype)
        # Not planned (graph inputs/outputs the planner skipped, control-flow placeholders):
        # an owned buffer of the declared capacity, bounded like a planned one.
        return tensor_over(owned_region(nbytes), dtype, sizes, strides)

    def _planned(self, i, t, dtype, sizes, strides, nbytes, ext) -> torch.Tensor:
        ai = t.allocation_info
        offset = int(ai.memory_offset_low) + (int(ai.memory_offset_high) << 32)
        tensor = tensor_over(self._arena.region(int(ai.memory_id), offset, nbytes),
                             dtype, sizes, strides)
        # A planned tensor with data is a mutable buffer with an initial state.
        if ext is not None:
            initial = self._program.named_region(ext.fully_qualified_name, nbytes)
        elif t.data_buffer_idx > 0:
            initial = self._program.mutable_region(t.data_buffer_idx, nbytes)
        else:
            return tensor
        self.preloaded.add(i)
        tensor.copy_(tensor_over(initial, dtype, sizes, strides))
        return tensor

    # -- access, used to build instruction closures -----------------------------------------
    def check(self, i: int, what: str) -> int:
        if not 0 <= i < len(self.vals):
            raise ProgramError(f"{what}: expected a value index in [0, {len(self.vals)}), got {i}")
        return i

    def getter(self, i: int):
        """Function vals -> the argument value i, constant-folded when nothing writes it."""
        kind = self.kind[self.check(i, "argument")]
        if kind == "tensor":
            return lambda vals: vals[i]
        if kind in ("int", "double", "bool", "string", "null"):
            if i in self.written:
                return lambda vals: vals[i]
            const = self.vals[i]
            return lambda vals: const
        items = self.items[i]
        if kind == "int_list":
            if not any(j in self.written for j in items):
                const = [self.vals[j] for j in items]
                return lambda vals: const
            return lambda vals: [vals[j] for j in items]
        if kind == "tensor_list":
            return lambda vals: [vals[j] for j in items]
        if kind == "opt_tensor_list":
            return lambda vals: [None if j < 0 else vals[j] for j in items]
        const = list(items)  # double_list / bool_list hold literals
        return lambda vals: const

    def tensor_indices(self, i: int) -> list[int]:
        kind = self.kind[i]
        if kind == "tensor":
            return [i]
        if kind in ("tensor_list", "opt_tensor_list"):
            return [j for j in self.items[i] if j >= 0]
        return []

    def dynamism(self, i: int) -> int:
        meta = self.meta.get(i)
        return STATIC if meta is None else meta.dynamism

    def storer(self, i: int):
        """Function (vals, result) that writes a kernel's result into value i."""
        if self.kind[i] != "tensor":
            def store(vals, r):
                vals[i] = r
            return store

        def store(vals, r):
            slot = vals[i]
            if r is slot:
                return
            if r.shape != slot.shape:
                resize_within(slot, r.shape, i)
            slot.copy_(r)
        return store

    def replacer(self, i: int):
        def replace(vals, r):
            vals[i] = r
        return replace


def resize_within(slot: torch.Tensor, shape, i: int) -> None:
    """Resize a value's tensor in place; beyond its planned bytes is an InputError."""
    try:
        slot.resize_(shape)
    except RuntimeError as e:
        if CAPACITY_MARK not in str(e):
            raise
        raise InputError(
            f"value {i}: expected a shape within its planned {slot.untyped_storage().nbytes()}"
            f" bytes, got {list(shape)}") from None
