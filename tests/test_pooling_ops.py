"""Pooling and upsampling (max_pool2d, avg_pool2d, adaptive_avg_pool2d, upsample nearest and
bilinear) on both executors against float64 eager PyTorch on prime-sized planes, NaN and Inf
through max_pool2d, and a model using them end to end as one delegate call."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate.aot import lower, undelegated_ops
from delegate.errors import DelegateError
from delegate.models import seeded
from delegate.ops import get_op
from tests.test_models import run_pte
from tests.test_reduction_ops import check_family, run_on
from tests.test_unary_ops import delegate_calls
from tests.tolerances import tol


def check(got, want, executor):
    check_family(got, want, executor, "pooling")


def planes(*shape):
    return torch.randn(*shape, dtype=torch.float64).float().double()


EXECUTORS = ["cpu", "webgpu"]
MAX_POOL = [   # kernel, stride, padding, dilation, ceil_mode
    ([3, 3], [2, 2], [1, 1], [1, 1], False), ([3, 3], [2, 2], [1, 1], [1, 1], True),
    ([2, 3], [1, 2], [0, 1], [1, 1], False), ([3, 2], [2, 3], [1, 0], [2, 1], True),
    ([5, 5], [3, 3], [2, 2], [1, 2], True),
]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("k, s, p, d, ceil", MAX_POOL)
def test_max_pool2d(executor, k, s, p, d, ceil):
    x = planes(2, 3, 11, 13)
    attrs = {"kernel_size": k, "stride": s, "padding": p, "dilation": d, "ceil_mode": ceil}
    check(run_on(executor, "max_pool2d", x, attrs), F.max_pool2d(x, k, s, p, d, ceil), executor)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_max_pool2d_propagates_nan_and_keeps_inf(executor):
    x = planes(1, 2, 7, 7)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, 4, 4] = float("inf")
    x[0, 1, 0, 6] = float("-inf")
    attrs = {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
             "ceil_mode": False}
    want = F.max_pool2d(x, 3, 2, 1)
    got = run_on(executor, "max_pool2d", x, attrs)
    check(got, want, executor)
    assert torch.isnan(got[0, 0, :2, :2]).all()


AVG_POOL = [   # kernel, stride, padding, ceil_mode, count_include_pad
    ([3, 3], [2, 2], [1, 1], False, True), ([3, 3], [2, 2], [1, 1], True, True),
    ([3, 3], [2, 2], [1, 1], True, False), ([2, 3], [1, 2], [0, 1], False, False),
    ([5, 3], [3, 2], [2, 1], True, True),
]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("k, s, p, ceil, include", AVG_POOL)
def test_avg_pool2d(executor, k, s, p, ceil, include):
    x = planes(2, 3, 11, 13)
    attrs = {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": ceil,
             "count_include_pad": include}
    check(run_on(executor, "avg_pool2d", x, attrs),
          F.avg_pool2d(x, k, s, p, ceil, include), executor)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("size", [[1, 1], [2, 3], [5, 7], [11, 13], [4, 17]])
def test_adaptive_avg_pool2d(executor, size):
    x = planes(2, 3, 11, 13)
    check(run_on(executor, "adaptive_avg_pool2d", x, {"output_size": size}),
          F.adaptive_avg_pool2d(x, size), executor)


RESIZE = [   # output size, scale factors (None: from the sizes)
    ([22, 26], [2.0, 2.0]), ([7, 9], None), ([16, 19], [1.5, 1.5]), ([29, 13], None),
    ([5, 6], [0.5, 0.5]),
]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("size, scales", RESIZE)
def test_upsample_nearest2d(executor, size, scales):
    x = planes(2, 3, 11, 13)
    want = torch.ops.aten.upsample_nearest2d.vec(x, None if scales else size, scales)
    assert list(want.shape[-2:]) == size
    check(run_on(executor, "upsample_nearest2d", x, {"output_size": size, "scales": scales}),
          want, executor)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("size, scales", RESIZE + [([1, 1], None)])
def test_upsample_bilinear2d(executor, size, scales, align):
    x = planes(2, 3, 11, 13)
    want = torch.ops.aten.upsample_bilinear2d.vec(x, None if scales else size, align, scales)
    assert list(want.shape[-2:]) == size
    attrs = {"output_size": size, "align_corners": align, "scales": scales}
    check(run_on(executor, "upsample_bilinear2d", x, attrs), want, executor)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_rank3_input_pools_each_channel(executor):
    x = planes(3, 11, 13)
    attrs = {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True,
             "count_include_pad": False}
    check(run_on(executor, "avg_pool2d", x, attrs), F.avg_pool2d(x, 3, 2, 1, True, False),
          executor)


@pytest.mark.parametrize("op, shape, attrs, want", [
    ("max_pool2d", (11, 13), {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1],
                              "dilation": [1, 1], "ceil_mode": False}, "rank 2"),
    ("max_pool2d", (1, 3, 11, 13), {"kernel_size": [3, 3], "stride": [2, 2], "padding": [2, 2],
                                    "dilation": [1, 1], "ceil_mode": False}, "half the kernel"),
    ("avg_pool2d", (1, 3, 11, 13), {"kernel_size": [3, 3], "stride": [0, 2], "padding": [1, 1],
                                    "ceil_mode": False, "count_include_pad": True}, ">= 1"),
    ("adaptive_avg_pool2d", (1, 3, 11, 13), {"output_size": [0, 2]}, "sizes > 0"),
])
def test_bad_windows_are_typed_errors(op, shape, attrs, want):
    with pytest.raises(DelegateError, match=want):
        get_op(op).infer([shape], attrs)


class PoolZoo(nn.Module):
    """A conv-free vision head: each pooling and upsampling op after a pointwise linear."""

    def __init__(self, c: int = 3):
        super().__init__()
        self.mix = nn.Linear(c, c)

    def forward(self, x):
        h = self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
        m = F.max_pool2d(h, 3, 2, 1, ceil_mode=True)
        a = F.avg_pool2d(h, 3, 2, 1, count_include_pad=False)
        up = F.interpolate(m + a, size=(11, 13), mode="bilinear", align_corners=False)
        near = F.interpolate(F.adaptive_avg_pool2d(h, (3, 4)), size=(11, 13), mode="nearest")
        corners = F.interpolate(h, scale_factor=2.0, mode="bilinear", align_corners=True)
        return up + near + F.adaptive_avg_pool2d(corners, 1) * 0.5


@pytest.mark.parametrize("device", EXECUTORS)
def test_pooling_model_is_one_delegate_call_matching_eager(device):
    model = seeded(PoolZoo())
    x = torch.randn(2, 3, 11, 13)
    pm = lower(model, (x,), device=device)
    assert undelegated_ops(pm) == []
    assert delegate_calls(pm) == 1
    (got,), = run_pte(pm, [(x,)], device)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))
