"""A loaded ExecuTorch method: its value table, delegates and precomputed instruction list.

Everything is decided at load: operators are resolved, delegate calls split into inputs and
outputs, and each instruction becomes a closure `run(vals) -> next pc or None`, so execute()
is a tight loop over that list.

How a DelegateCall's args split (the .pte does not record it; the emitter writes the
flattened inputs, then the flattened outputs, and the C++ runtime leaves the split to the
backend): the outputs are the longest run of trailing tensor args whose value is not yet
available at that instruction. Available means a method input, a constant, a buffer with
initial state, a value written by an earlier instruction, or a value written only *later*
(a mutable buffer read before its copy_ back). Non-tensor args count as inputs. The backend
must return exactly that many outputs, which execute() checks.
"""
from __future__ import annotations

import threading

import torch

from delegate.errors import DelegateError, InputError, ProgramError, UnsupportedError
from delegate.runtime.backends import InitContext, get_backend
from delegate.runtime.memory import CAPACITY_MARK, DYNAMIC_BOUND, STATIC, Arena
from delegate.runtime.operators import Resolved, build_kernel_call, kernel_writes
from delegate.runtime.shapes import check_tensor_kind
from delegate.runtime.values import ValueTable, resize_within


class Method:
    def __init__(self, program, plan, device: str, options: dict):
        self.name = plan.name
        self._program = program
        self._delegates: list[tuple] = []  # (backend, handle) in plan.delegates order
        self._alive = True
        self._lock = threading.RLock()
        if len(plan.chains) > 1:  # ExecuTorch itself only ever emits one chain
            raise UnsupportedError(f"method {self.name!r} chains: expected 1, "
                                   f"got {len(plan.chains)}")
        instrs = list(plan.chains[0].instructions) if plan.chains else []
        arena = Arena(list(plan.non_const_buffer_sizes or []))
        table = ValueTable(list(plan.values), program, arena, written=set())
        self._table = table
        self._inputs = [table.check(i, "method input") for i in plan.inputs]
        self._outputs = [table.check(i, "method output") for i in plan.outputs]
        ops = self._resolve_ops(plan.operators, instrs)
        writes, splits = self._analyse(instrs, ops, len(plan.delegates))
        table.written = set(self._inputs).union(*writes)
        try:
            self._init_delegates(plan.delegates, device, options)
            direct, self._fresh = _boundary(instrs, writes, splits, self._inputs,
                                            self._outputs, table, self._delegates)
            self._slots = {i: table.vals[i] for i in direct}
            self._returns = [(i, i not in self._fresh and table.kind[i] == "tensor")
                             for i in self._outputs]
            self._run, self._labels = self._build(instrs, ops, splits)
        except BaseException:
            self.destroy()
            raise

    # -- load ---------------------------------------------------------------------------------
    @staticmethod
    def _resolve_ops(operators, instrs) -> dict[int, Resolved]:
        ops = {}
        for ins in instrs:
            a = ins.instr_args
            if type(a).__name__ == "KernelCall" and a.op_index not in ops:
                if not 0 <= a.op_index < len(operators):
                    raise ProgramError(f"KernelCall op_index: expected [0, {len(operators)}), "
                                       f"got {a.op_index}")
                op = operators[a.op_index]
                ops[a.op_index] = Resolved(op.name, op.overload)
        return ops

    @property
    def delegates(self) -> list:
        """(backend, handle) for each delegate of this method, in plan order (profiling,
        inspection); the handles stay owned by the Program."""
        return list(self._delegates)

    def time_instructions(self, record):
        """Profiling hook: until the returned undo is called, each instruction run also calls
        record(pc, label, seconds); labels are the operator ("aten::add.out") or the kind
        ("DelegateCall"). execute() itself is untouched when no profile asks for this."""
        import time

        original = self._run

        def timed(pc, step, label):
            def run(vals):
                t0 = time.perf_counter()
                nxt = step(vals)
                record(pc, label, time.perf_counter() - t0)
                return nxt
            return run

        self._run = [timed(pc, s, lab) for pc, (s, lab) in enumerate(zip(original, self._labels))]
        return lambda: setattr(self, "_run", original)

    def _analyse(self, instrs, ops, n_delegates):
        """Per-instruction written values, and each DelegateCall's (inputs, outputs)."""
        table = self._table
        writes: list[set[int]] = []
        for ins in instrs:
            a = ins.instr_args
            kind = type(a).__name__
            args = [table.check(i, f"{kind} arg") for i in getattr(a, "args", [])]
            if kind == "KernelCall":
                writes.append(kernel_writes(ops[a.op_index], args, table))
            elif kind == "MoveCall":
                table.check(a.move_from, "MoveCall source")
                writes.append({table.check(a.move_to, "MoveCall target")})
            else:
                writes.append(set())
        available = set(self._inputs) | table.preloaded
        return writes, _split_delegate_calls(instrs, writes, available, table, n_delegates)

    def _init_delegates(self, delegates, device, options) -> None:
        program = self._program
        for d in delegates:
            backend = get_backend(d.id)
            ctx = InitContext(
                compile_specs={cs.key: bytes(cs.value) for cs in d.compile_specs or []},
                named_data=program.named_bytes, device=device, options=dict(options or {}))
            handle = backend.init(program.delegate_bytes(d.processed), ctx)
            self._delegates.append((backend, handle))

    def _build(self, instrs, ops, splits):
        run, labels = [], []
        n = len(instrs)
        for k, ins in enumerate(instrs):
            a = ins.instr_args
            kind = type(a).__name__
            if kind == "KernelCall":
                run.append(build_kernel_call(ops[a.op_index], list(a.args), self._table))
                labels.append(ops[a.op_index].label)
                continue
            labels.append(kind)
            if kind == "DelegateCall":
                run.append(self._delegate_call(a.delegate_index, *splits[k]))
            elif kind == "MoveCall":
                run.append(_move(a.move_from, a.move_to))
            elif kind == "JumpFalseCall":
                if not 0 <= a.destination_instruction <= n:
                    raise ProgramError(f"jump destination: expected [0, {n}], "
                                       f"got {a.destination_instruction}")
                self._table.check(a.cond_value_index, "JumpFalseCall condition")
                run.append(_jump_false(a.cond_value_index, a.destination_instruction))
            elif kind == "FreeCall":
                # Frees an unbounded tensor's memory in C++; here the tensor simply stays.
                run.append(lambda vals: None)
            else:
                raise ProgramError(f"instruction {k}: expected one of KernelCall, DelegateCall, "
                                   f"MoveCall, JumpFalseCall, FreeCall, got {a!r}")
        return run, labels

    def _delegate_call(self, index: int, ins: list[int], outs: list[int]):
        backend, handle = self._delegates[index]
        getters = [self._table.getter(i) for i in ins]
        writes = backend.writes_outputs   # the backend fills the tensors it is handed itself
        fresh = [i in self._fresh for i in outs]
        storers = [_checked_storer(self._table, i, replace=f) for i, f in zip(outs, fresh)]
        label = f"delegate {index} ({type(backend).__name__})"
        execute = backend.execute
        # a static output is made at its shape: no resize in the backend
        kinds = [(self._table.meta[i].dtype, _static_sizes(self._table.meta[i])) if f else None
                 for i, f in zip(outs, fresh)]

        def targets(vals):   # a fresh tensor becomes the returned output itself: no clone
            return [torch.empty(k[1], dtype=k[0]) if k is not None else vals[i]
                    for i, k in zip(outs, kinds)]

        def run(vals):
            ins = [g(vals) for g in getters]
            results = execute(handle, ins, targets(vals)) if writes else execute(handle, ins)
            if len(results) != len(storers):
                raise ProgramError(f"{label} outputs: expected {len(storers)}, "
                                   f"got {len(results)}")
            for store, r in zip(storers, results):
                store(vals, r)
        return run

    # -- run ----------------------------------------------------------------------------------
    def execute(self, inputs) -> list:
        """Run the method. Executes of one Method are serialised (its values and delegates
        are one mutable state); separate Methods run in parallel."""
        with self._lock:
            if not self._alive:
                raise ProgramError(f"method {self.name!r}: expected a loaded method, "
                                   f"got a destroyed one")
            if torch.is_grad_enabled():   # out= kernels refuse tensors that need grad
                with torch.no_grad():
                    return self._execute(inputs)
            return self._execute(inputs)

    def _execute(self, inputs) -> list:
        vals = self._table.vals
        try:
            self._set_inputs(inputs)
            self._loop(vals)
        finally:
            for i, slot in self._slots.items():   # hold no caller tensor past the execute
                vals[i] = slot
        # the one copy at the boundary, unless a delegate wrote a fresh tensor: a returned
        # tensor never shares a later execute's memory
        return [vals[i].clone() if clone else vals[i] for i, clone in self._returns]

    def _loop(self, vals) -> None:
        run, n, pc = self._run, len(self._run), 0
        try:
            while pc < n:
                nxt = run[pc](vals)
                pc = pc + 1 if nxt is None else nxt
        except DelegateError:
            raise
        except Exception as e:  # noqa: BLE001 - a kernel's raw error gets its instruction
            where = f"instruction {pc} ({self._labels[pc]})"
            if isinstance(e, RuntimeError) and CAPACITY_MARK in str(e):
                raise InputError(f"{where}: expected a result within its out tensor's planned "
                                 f"capacity, got a larger one ({e})") from None
            raise ProgramError(f"{where}: expected it to run, got {type(e).__name__}: {e}") from e

    def _set_inputs(self, inputs) -> None:
        if not isinstance(inputs, (list, tuple)):
            raise InputError(f"inputs: expected a list, got {type(inputs).__name__}")
        if len(inputs) != len(self._inputs):
            raise InputError(f"method {self.name!r} input count: expected "
                             f"{len(self._inputs)}, got {len(inputs)}")
        vals, table = self._table.vals, self._table
        for pos, (i, x) in enumerate(zip(self._inputs, inputs)):
            meta = table.meta.get(i)
            if meta is None:
                _check_scalar(pos, table.kind[i], vals[i], x)
                continue
            _check_tensor(pos, meta, x)
            if i in self._slots and x.is_contiguous():   # read, never written: no copy
                vals[i] = x
                continue
            slot = vals[i]
            if slot.shape != x.shape:
                resize_within(slot, x.shape, i)
            slot.copy_(x)

    def destroy(self) -> None:
        """Release every delegate this method initialised; safe to call twice."""
        with self._lock:
            self._destroy()

    def _destroy(self) -> None:
        self._alive = False
        self._run, self._table = [], None  # drop the arenas now, not at garbage collection
        delegates, self._delegates = self._delegates, []
        for backend, handle in delegates:
            backend.destroy(handle)


def _boundary(instrs, writes, splits, inputs, outputs, table, delegates) -> tuple[set, set]:
    """(inputs a delegate or kernel may read in place, outputs a delegate may write fresh).

    An input is read in place when no instruction writes or moves it and it is not an output:
    the caller's contiguous tensor then stands in its slot for one execute. An output is
    written fresh when exactly one DelegateCall writes it, to a backend that `writes_outputs`,
    and nothing moves it: the backend fills a new tensor that execute() returns as it is, instead of cloning the planned one.
    """
    moved = set()
    for ins in instrs:
        a = ins.instr_args
        if type(a).__name__ == "MoveCall":
            moved |= {a.move_from, a.move_to}
    writers: dict[int, int] = {}
    for w in writes:
        for i in w:
            writers[i] = writers.get(i, 0) + 1
    outs, shared = set(outputs), _sharing_memory(table)
    direct = {i for i in inputs if i in table.meta and i not in writers and i not in moved
              and i not in outs and i not in shared and table.vals[i].is_contiguous()}
    by_delegate = {i for k, (_, outs_k) in splits.items()
                   if delegates[instrs[k].instr_args.delegate_index][0].writes_outputs
                   for i in outs_k}
    fresh = {i for i in outs if i in by_delegate and writers.get(i) == 1 and i not in moved
             and i not in inputs and outputs.count(i) == 1 and i in table.meta
             and i not in shared}
    return direct, fresh


def _sharing_memory(table) -> set:
    """Tensor values whose planned bytes overlap another value's: a view the emitter planned
    over them (or a reuse) reads those bytes, so they must hold the data."""
    storages = [(i, t.untyped_storage()) for i, t in enumerate(table.vals)
                if isinstance(t, torch.Tensor)]
    spans = sorted((st.data_ptr(), st.data_ptr() + st.nbytes(), i) for i, st in storages
                   if st.nbytes())
    shared, reach, owner = set(), -1, None
    for start, end, i in spans:
        if start < reach:
            shared |= {i, owner}
        if end > reach:
            reach, owner = end, i
    return shared


def _split_delegate_calls(instrs, writes, available, table, n_delegates) -> dict:
    """{instruction index: (input args, output args)} by the rule in the module docstring.

    Fills writes[k] for each DelegateCall k with its outputs, in program order.
    """
    later = [set() for _ in instrs]
    for k in range(len(instrs) - 2, -1, -1):
        later[k] = later[k + 1] | writes[k + 1]
    splits = {}
    for k, ins in enumerate(instrs):
        a = ins.instr_args
        if type(a).__name__ == "DelegateCall":
            if not 0 <= a.delegate_index < n_delegates:
                raise ProgramError(f"DelegateCall delegate_index: expected [0, {n_delegates}), "
                                   f"got {a.delegate_index}")
            args = list(a.args)
            n_in = len(args)
            while n_in and table.kind[args[n_in - 1]] == "tensor" and \
                    args[n_in - 1] not in available and args[n_in - 1] not in later[k]:
                n_in -= 1
            splits[k] = (args[:n_in], args[n_in:])
            writes[k] = set(args[n_in:])
        available |= writes[k]
    return splits


def _move(src: int, dst: int):
    def run(vals):
        # EValue copy in C++: a tensor is shared by pointer, a scalar copied.
        vals[dst] = vals[src]
    return run


def _jump_false(cond: int, dest: int):
    def run(vals):
        c = vals[cond]
        if isinstance(c, torch.Tensor):
            c = bool(c.all())
        return None if c else dest
    return run


def _checked_storer(table, i: int, replace: bool = False):
    store = table.replacer(i) if replace else table.storer(i)
    meta = table.meta.get(i)
    if meta is None:
        return store

    def checked(vals, r):
        if not isinstance(r, torch.Tensor) or r.dtype != meta.dtype:
            got = r.dtype if isinstance(r, torch.Tensor) else type(r).__name__
            raise ProgramError(f"delegate output value {i}: expected a {meta.dtype} tensor, "
                               f"got {got}")
        store(vals, r)
    return checked


def _static_sizes(meta) -> tuple:
    """A planned output's shape when it is static, else (0,) for the backend to resize."""
    return tuple(meta.sizes) if meta.dynamism == STATIC else (0,)


def _check_tensor(pos: int, meta, x) -> None:
    what = f"input {pos}"
    check_tensor_kind(what, x, meta.dtype, len(meta.sizes))
    shape = list(x.shape)
    if meta.dynamism == STATIC and shape != meta.sizes:
        raise InputError(f"{what} shape: expected {meta.sizes}, got {shape}")
    if meta.dynamism == DYNAMIC_BOUND and any(s > b for s, b in zip(shape, meta.sizes)):
        raise InputError(f"{what} shape: expected each dim <= the upper bound {meta.sizes}, "
                         f"got {shape}")


_SCALAR_TYPES = {"int": (int,), "double": (float, int), "bool": (bool,), "string": (str,)}


def _check_scalar(pos: int, kind: str, stored, x) -> None:
    """Non-tensor inputs were specialised at export; like ExecuTorch, they must match."""
    types = _SCALAR_TYPES.get(kind)
    if types is None:
        if x is not None:
            raise InputError(f"input {pos}: expected None, got {type(x).__name__}")
        return
    if not isinstance(x, types) or (kind != "bool" and isinstance(x, bool)):
        raise InputError(f"input {pos}: expected {kind}, got {type(x).__name__}")
    if x != stored:
        raise InputError(f"input {pos} value (specialised at export): expected {stored!r}, "
                         f"got {x!r}")
