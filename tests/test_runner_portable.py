"""The pure-Python .pte runner agrees with ExecuTorch's own C++ runtime on delegate-free
programs: the reference is `executorch.runtime` running the very same bytes."""
import pytest
import torch
from executorch.exir import ExecutorchBackendConfig, to_edge
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
from executorch.runtime import Runtime as ETRuntime

from delegate.runtime import Runtime


def _pte(module, args, dynamic_shapes=None, config=None) -> bytes:
    ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    return to_edge(ep).to_executorch(config).buffer


def _methods(pte: bytes):
    ours = Runtime.get().load_program(pte).load_method("forward")
    theirs = ETRuntime.get().load_program(pte).load_method("forward")
    return ours, theirs


def _assert_same(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if isinstance(b, torch.Tensor):
            # ATen and ExecuTorch's portable kernels may round a matmul differently.
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            assert a == b


def _run_both(pte: bytes, *input_lists):
    ours, theirs = _methods(pte)
    for inputs in input_lists:
        _assert_same(ours.execute(list(inputs)), theirs.execute(list(inputs)))


def _plan(pte: bytes):
    return deserialize_pte_binary(pte).program.execution_plan[0]


def _op_names(pte: bytes) -> set[str]:
    return {f"{o.name}.{o.overload}" for o in _plan(pte).operators}


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(7, 11), torch.nn.Linear(11, 5)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).softmax(-1)


class MultiOutput(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.max(x, 1)
        top_v, top_i = torch.topk(x, 2)
        left, right = torch.split(x, [2, 3], 1)
        return (values, indices, top_v, top_i, left, right, *torch.unbind(x, 0),
                *torch.chunk(x, 2, 1))


class ElidedView(torch.nn.Module):
    def forward(self, x):
        h = (x * 2).view(3, 4)
        return h + 1, h.sum(0)


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.arange(5.0))

    def forward(self, x):
        self.state.add_(x)
        return self.state * 2


class Ragged(torch.nn.Module):
    def forward(self, x):
        y = torch.cat([x, x[:1]]) * 2
        return y, x.shape[0] + 1, y.sum(0)


class Scalars(torch.nn.Module):
    def forward(self, x, k: int, f: float, b: bool):
        return x * k * f if b else x


class Branchy(torch.nn.Module):
    def forward(self, x, y):
        return torch.cond(x.sum() > 0, lambda a, b: a + b, lambda a, b: a - b, (x, y))


class DynamicView(torch.nn.Module):
    def forward(self, x):
        return (x * 2).view(-1) + 1, x.reshape(x.shape[0] * 3)


class RunningSum(torch.nn.Module):
    def forward(self, init, xs):
        from torch._higher_order_ops.scan import scan

        def step(carry, x):
            nxt = carry + x
            return nxt, nxt * 2
        return scan(step, init, xs)


class NonFinite(torch.nn.Module):
    def forward(self, x):
        return x.masked_fill(x > 0, float("-inf")) + float("nan"), x.clamp(float("-inf"), 0.5)


class Uninitialised(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(3))

    def forward(self, x):
        self.acc.add_(x)
        return self.acc + 0


class Gather(torch.nn.Module):
    def forward(self, x, idx):
        return x[idx], x.to(torch.int32) + 1, (x > 0).float(), x.permute(1, 0).contiguous()


def test_mlp_matches_executorch():
    x = torch.randn(3, 7)
    _run_both(_pte(MLP(), (x,)), [x], [torch.randn(3, 7)])


def test_ops_with_several_outputs_match_executorch():
    pte = _pte(MultiOutput(), (torch.randn(3, 5),))
    ops = _op_names(pte)
    assert "aten::max.dim_max" in ops and "aten::topk.values" in ops
    assert any(name.startswith("aten::split") for name in ops)  # a TensorList out
    _run_both(pte, [torch.randn(3, 5)])


def test_elided_views_alias_one_planned_offset():
    pte = _pte(ElidedView(), (torch.randn(12),))
    offsets = {}
    for v in _plan(pte).values:
        t = v.val
        if type(t).__name__ == "Tensor" and t.allocation_info is not None:
            key = (t.allocation_info.memory_id, t.allocation_info.memory_offset_low)
            offsets.setdefault(key, set()).add(tuple(t.sizes))
    assert any({(12,), (3, 4)} <= shapes for shapes in offsets.values()), offsets
    _run_both(pte, [torch.randn(12)], [torch.randn(12)])


def test_mutable_buffer_state_persists_across_executes():
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["state"])])
    pte = _pte(Counter(), (torch.ones(5),), config=config)
    ours, theirs = _methods(pte)
    expected = torch.arange(5.0)
    for step in range(3):
        x = torch.full((5,), float(step + 1))
        expected = expected + x
        got = ours.execute([x])
        _assert_same(got, theirs.execute([x]))
        torch.testing.assert_close(got[0], expected * 2, rtol=0, atol=0)


def test_dynamic_dimension_runs_at_several_sizes():
    n = torch.export.Dim("n", min=2, max=10)
    pte = _pte(Ragged(), (torch.randn(6, 3),), dynamic_shapes=({0: n},))
    _run_both(pte, [torch.randn(4, 3)], [torch.randn(10, 3)], [torch.randn(2, 3)])


def test_scalar_inputs_match_executorch():
    x = torch.randn(6, 3)
    _run_both(_pte(Scalars(), (x, 3, 2.0, True)), [x, 3, 2.0, True])


def test_cond_runs_both_branches_through_jump_false():
    pte = _pte(Branchy(), (torch.randn(3), torch.randn(3)))
    kinds = {type(i.instr_args).__name__ for i in _plan(pte).chains[0].instructions}
    assert {"JumpFalseCall", "MoveCall"} <= kinds
    _run_both(pte, [torch.ones(3), torch.randn(3)], [-torch.ones(3), torch.randn(3)])


def test_dynamic_view_goes_through_et_view():
    n = torch.export.Dim("n", min=2, max=8)
    pte = _pte(DynamicView(), (torch.randn(4, 3),), dynamic_shapes=({0: n},))
    assert "executorch_prim::et_view.default" in _op_names(pte)
    _run_both(pte, [torch.randn(2, 3)], [torch.randn(8, 3)], [torch.randn(5, 3)])


def test_scan_loop_with_et_copy_index_matches_executorch():
    pte = _pte(RunningSum(), (torch.zeros(3), torch.randn(5, 3)))
    assert "executorch_prim::et_copy_index.tensor" in _op_names(pte)
    _run_both(pte, [torch.zeros(3), torch.randn(5, 3)], [torch.ones(3), torch.randn(5, 3)])


def test_non_finite_scalars_match_executorch():
    _run_both(_pte(NonFinite(), (torch.randn(7),)), [torch.randn(7)])


def test_uninitialised_mutable_buffer_starts_at_zero_like_executorch():
    pte = _pte(Uninitialised(), (torch.ones(3),))
    _run_both(pte, *[[torch.full((3,), float(k))] for k in range(3)])


def test_program_with_two_methods():
    x = torch.randn(3, 7)
    programs = {"forward": torch.export.export(MLP(), (x,)),
                "double": torch.export.export(ElidedView(), (torch.randn(12),))}
    pte = to_edge(programs).to_executorch().buffer
    prog = Runtime.get().load_program(pte)
    assert prog.method_names == {"forward", "double"}
    theirs = ETRuntime.get().load_program(pte)
    _assert_same(prog.load_method("forward").execute([x]),
                 theirs.load_method("forward").execute([x]))
    y = torch.randn(12)
    _assert_same(prog.load_method("double").execute([y]),
                 theirs.load_method("double").execute([y]))


def test_integer_bool_and_index_tensors_match_executorch():
    x = torch.randn(6, 3)
    _run_both(_pte(Gather(), (x, torch.tensor([0, 2, 5]))), [x, torch.tensor([5, 1, 1])])


def test_outputs_are_copies_not_arena_views():
    x = torch.randn(3, 7)
    method = Runtime.get().load_program(_pte(MLP(), (x,))).load_method("forward")
    first = method.execute([x])[0]
    kept = first.clone()
    method.execute([torch.randn(3, 7)])
    torch.testing.assert_close(first, kept, rtol=0, atol=0)


def test_channels_last_dim_order_matches_eager():
    class ToChannelsLast(torch.nn.Module):
        def forward(self, x):
            return x.contiguous(memory_format=torch.channels_last).relu()

    x = torch.randn(2, 3, 4, 5)
    pte = _pte(ToChannelsLast(), (x,))
    assert any(type(v.val).__name__ == "Tensor" and list(v.val.dim_order) == [0, 2, 3, 1]
               for v in _plan(pte).values)
    got = Runtime.get().load_program(pte).load_method("forward").execute([x])[0]
    torch.testing.assert_close(got, x.relu(), rtol=0, atol=0)


def test_load_from_path_and_method_names(tmp_path):
    x = torch.randn(3, 7)
    path = tmp_path / "mlp.pte"
    path.write_bytes(_pte(MLP(), (x,)))
    with Runtime.get().load_program(str(path)) as prog:
        assert prog.method_names == {"forward"}
        ours = prog.load_method("forward").execute([x])
    _assert_same(ours, ETRuntime.get().load_program(str(path)).load_method("forward").execute([x]))


@pytest.mark.parametrize("n", [1, 2])
def test_each_loaded_method_has_its_own_state(n):
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["state"])])
    prog = Runtime.get().load_program(_pte(Counter(), (torch.ones(5),), config=config))
    methods = [prog.load_method("forward") for _ in range(n)]
    outs = [m.execute([torch.ones(5)])[0] for m in methods]
    for out in outs:  # every method starts from the serialized initial state
        torch.testing.assert_close(out, (torch.arange(5.0) + 1) * 2, rtol=0, atol=0)
