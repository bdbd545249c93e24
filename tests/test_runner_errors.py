"""Bad programs and bad inputs get a named DelegateError that says what was expected and
what came; never a raw exception, a crash or a hang."""
import copy
import random

import pytest
import torch
from executorch.exir import to_edge
from executorch.exir._serialize._program import (
    PTEFile, deserialize_pte_binary, serialize_pte_binary)
from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

from delegate.errors import (
    BackendNotFoundError, DelegateError, InputError, ProgramError, UnknownOperatorError)
from delegate.runtime import Runtime
from delegate.runtime import backends
from delegate.runtime.backends import PyBackend, register_backend

DEMO_ID = "BackendWithCompilerDemo"


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).relu()


class Ragged(torch.nn.Module):
    def forward(self, x):
        return torch.cat([x, x[:1]]) * 2


class AddThenMul(torch.nn.Module):
    def forward(self, x, y, z):
        return torch.relu((x + y) * z) - 1


def _pte(module, args, dynamic_shapes=None) -> bytes:
    return to_edge(torch.export.export(module, args, dynamic_shapes=dynamic_shapes)) \
        .to_executorch().buffer


@pytest.fixture(scope="module")
def affine_pte() -> bytes:
    return _pte(Affine(), (torch.randn(2, 4),))


@pytest.fixture(scope="module")
def ragged_pte() -> bytes:
    n = torch.export.Dim("n", min=2, max=6)
    return _pte(Ragged(), (torch.randn(4, 3),), dynamic_shapes=({0: n},))


@pytest.fixture(scope="module")
def demo_pte() -> bytes:
    args = tuple(torch.randn(2, 3) for _ in range(3))
    edge = to_edge(torch.export.export(AddThenMul(), args)).to_backend(AddMulPartitionerDemo())
    return edge.to_executorch().buffer


@pytest.fixture
def registry(monkeypatch):
    """An isolated backend registry that loads the built-ins itself; both the dict and the
    loaded flag are restored afterwards, so later tests never see a flagged-but-empty one."""
    monkeypatch.setattr(backends, "_BACKENDS", {})
    monkeypatch.setattr(backends, "_loaded", False)
    return backends._BACKENDS


def _rebuild(pte: bytes, edit) -> bytes:
    """Deserialize, let `edit(program)` change it, serialize again."""
    pte_file = deserialize_pte_binary(pte)
    program = copy.deepcopy(pte_file.program)
    edit(program)
    return bytes(serialize_pte_binary(PTEFile(program=program, mutable_data=pte_file.mutable_data,
                                              named_data=pte_file.named_data)))


def _load(source):
    return Runtime.get().load_program(source)


# -- the file ---------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0, 3, 7, 40, 0.5, 0.9, 0.999])
def test_truncated_file_is_a_program_error(affine_pte, keep):
    n = keep if isinstance(keep, int) else int(len(affine_pte) * keep)
    with pytest.raises(ProgramError, match="expected"):
        _load(affine_pte[:n])


def test_empty_file_is_a_program_error(tmp_path):
    path = tmp_path / "empty.pte"
    path.write_bytes(b"")
    with pytest.raises(ProgramError, match="expected at least 8 bytes"):
        _load(path)


def test_missing_path_is_a_program_error(tmp_path):
    with pytest.raises(ProgramError, match="expected a readable file"):
        _load(tmp_path / "nope.pte")


def test_bad_magic_is_a_program_error(affine_pte):
    bad = affine_pte[:4] + b"XT99" + affine_pte[8:]
    with pytest.raises(ProgramError, match=r"expected b'ET12', got b'XT99'"):
        _load(bad)


def test_bad_root_offset_is_a_program_error(affine_pte):
    bad = (2**31).to_bytes(4, "little") + affine_pte[4:]
    with pytest.raises(ProgramError, match="root table offset: expected"):
        _load(bad)


@pytest.mark.parametrize("seed", range(40))
def test_flipped_bytes_never_escape_as_raw_errors(affine_pte, seed):
    rng = random.Random(seed)
    data = bytearray(affine_pte)
    for _ in range(rng.choice([1, 4, 16])):
        pos = rng.randrange(8, len(data))
        data[pos] ^= 1 << rng.randrange(8)
    try:
        out = _load(bytes(data)).load_method("forward").execute([torch.randn(2, 4)])
    except DelegateError as e:
        assert "expected" in str(e)
    else:  # a flip in padding or in weights still runs
        assert out[0].shape == (2, 3)


def test_garbage_flatbuffer_is_a_program_error(affine_pte):
    data = bytearray(affine_pte)
    data[64:192] = b"\xff" * 128
    with pytest.raises(ProgramError, match="expected"):
        _load(bytes(data)).load_method("forward")


def test_unknown_method_name_is_a_program_error(affine_pte):
    with pytest.raises(ProgramError, match=r"expected one of \['forward'\], got 'backward'"):
        _load(affine_pte).load_method("backward")


def test_unknown_operator_is_named(affine_pte):
    def rename(program):
        program.execution_plan[0].operators[0].name = "aten::definitely_not_an_op"

    with pytest.raises(UnknownOperatorError, match="definitely_not_an_op"):
        _load(_rebuild(affine_pte, rename)).load_method("forward")


# -- inputs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("inputs, what", [
    ([], "input count: expected 1, got 0"),
    ([torch.randn(2, 4), torch.randn(2, 4)], "input count: expected 1, got 2"),
    ([torch.randn(2, 4, dtype=torch.float64)], "dtype: expected torch.float32, got torch.float64"),
    ([torch.randn(8)], "rank: expected 2, got 1"),
    ([torch.randn(2, 5)], r"shape: expected \[2, 4\], got \[2, 5\]"),
    ([3.0], "expected a torch.float32 tensor, got float"),
])
def test_bad_inputs_are_input_errors(affine_pte, inputs, what):
    method = _load(affine_pte).load_method("forward")
    with pytest.raises(InputError, match=what):
        method.execute(inputs)


def test_dynamic_dim_over_its_bound_is_an_input_error(ragged_pte):
    method = _load(ragged_pte).load_method("forward")
    assert method.execute([torch.randn(6, 3)])[0].shape == (7, 3)
    with pytest.raises(InputError, match=r"upper bound \[6, 3\], got \[7, 3\]"):
        method.execute([torch.randn(7, 3)])


def test_result_beyond_planned_capacity_is_an_input_error(ragged_pte):
    def shrink_cat_out(program):
        plan = program.execution_plan[0]
        cat = next(i for i, o in enumerate(plan.operators) if o.name == "aten::cat")
        call = next(ins.instr_args for ins in plan.chains[0].instructions
                    if getattr(ins.instr_args, "op_index", None) == cat)
        plan.values[call.args[-1]].val.sizes = [3, 3]  # planned for 3 rows, not 7

    method = _load(_rebuild(ragged_pte, shrink_cat_out)).load_method("forward")
    method.execute([torch.randn(2, 3)])  # 3 rows fit
    with pytest.raises(InputError, match="expected"):
        method.execute([torch.randn(4, 3)])


def test_specialised_scalar_input_must_match():
    class Scale(torch.nn.Module):
        def forward(self, x, k: int):
            return x * k

    method = _load(_pte(Scale(), (torch.randn(3), 3))).load_method("forward")
    with pytest.raises(InputError, match="expected 3, got 4"):
        method.execute([torch.randn(3), 4])


# -- delegates --------------------------------------------------------------------------------
def test_unknown_backend_id_fails_at_load_method(demo_pte, registry):
    prog = _load(demo_pte)
    with pytest.raises(BackendNotFoundError, match=DEMO_ID):
        prog.load_method("forward")


class FakeDemoBackend(PyBackend):
    """Stands in for the demo backend, whose partition here is the `x + y`."""

    backend_id = DEMO_ID

    def __init__(self, n_outputs: int = 1):
        self.calls: list[tuple] = []
        self.n_outputs = n_outputs

    def init(self, processed, ctx):
        self.calls.append(("init", processed, dict(ctx.compile_specs), ctx.device))
        return object()

    def execute(self, handle, inputs):
        self.calls.append(("execute", handle, len(inputs)))
        return [inputs[0] + inputs[1]] * self.n_outputs

    def destroy(self, handle):
        self.calls.append(("destroy", handle))


def test_fake_backend_is_initialised_executed_and_destroyed(demo_pte, registry):
    fake = FakeDemoBackend()
    register_backend(DEMO_ID, fake)
    x, y, z = (torch.randn(2, 3) for _ in range(3))
    with _load(demo_pte) as prog:
        method = prog.load_method("forward")
        (kind, blob, specs, device), = fake.calls
        assert kind == "init" and blob and specs == {"max_value": b"\x04"} and device == "auto"
        for _ in range(2):
            torch.testing.assert_close(method.execute([x, y, z])[0],
                                       AddThenMul()(x, y, z), rtol=0, atol=0)
        handle = fake.calls[1][1]
        assert [c[0] for c in fake.calls] == ["init", "execute", "execute"]
        assert fake.calls[1][2] == 2  # inputs: x and y; the trailing arg is the output
    assert fake.calls[-1] == ("destroy", handle)
    prog.destroy()  # idempotent
    assert [c[0] for c in fake.calls].count("destroy") == 1
    with pytest.raises(ProgramError, match="destroyed"):
        method.execute([x, y, z])


class Accumulate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(2, 3))

    def forward(self, x):
        out = x + self.acc
        self.acc.copy_(out)
        return out.relu()


def test_buffer_read_by_a_delegate_before_its_copy_back_is_an_input(registry):
    """The delegated `x + acc` gets args [x, acc, out]; acc is written only later (copy_)."""
    fake = FakeDemoBackend()
    register_backend(DEMO_ID, fake)
    x = torch.randn(2, 3)
    pte = to_edge(torch.export.export(Accumulate(), (x,))).to_backend(AddMulPartitionerDemo()) \
        .to_executorch().buffer
    method = _load(pte).load_method("forward")
    eager = Accumulate()
    for _ in range(3):
        torch.testing.assert_close(method.execute([x])[0], eager(x), rtol=0, atol=0)
    assert {c[2] for c in fake.calls if c[0] == "execute"} == {2}


def test_backend_returning_wrong_output_count_is_a_program_error(demo_pte, registry):
    register_backend(DEMO_ID, FakeDemoBackend(n_outputs=2))
    method = _load(demo_pte).load_method("forward")
    with pytest.raises(ProgramError, match="outputs: expected 1, got 2"):
        method.execute([torch.randn(2, 3) for _ in range(3)])


def test_named_data_getter_raises_for_absent_keys(affine_pte):
    with pytest.raises(ProgramError, match="named data key: expected"):
        _load(affine_pte).named_bytes("no-such-key")
