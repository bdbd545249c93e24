"""batch_norm (inference) on both executors against float64 torch, and its fold into a
preceding convolution (delegate/passes/fold_batch_norm.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate import blob
from delegate.aot import undelegated_ops
from delegate.errors import DelegateError
from delegate.models import seeded
from delegate.partitioner import WgpuPartitioner
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from tests.test_kernels_cpu import run1
from tests.test_kernels_wgsl import run_wgsl
from tests.test_models import run_pte
from tests.tolerances import tol

DEVICES = ["cpu", "webgpu"]


def _params(c, affine=True):
    mean, var = torch.randn(c, dtype=torch.float64), torch.rand(c, dtype=torch.float64) + 0.1
    w, b = (torch.randn(c, dtype=torch.float64) for _ in range(2)) if affine else (None, None)
    return w, b, mean, var


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 5, 7, 11), (3, 7, 13), (5, 3)], ids=["2d", "1d", "flat"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_batch_norm_op_matches_float64(device, shape, affine):
    x = torch.randn(shape, dtype=torch.float64)
    w, b, mean, var = _params(shape[1], affine)
    want = F.batch_norm(x, mean, var, w, b, training=False, eps=1e-3)
    ins = [x, w, b, mean, var]
    if device == "cpu":
        got = run1("batch_norm", [None if t is None else t.float() for t in ins], eps=1e-3)
    else:
        got = run_wgsl("batch_norm", ins, {"eps": 1e-3}, consts=(1, 2, 3, 4))[0]
    torch.testing.assert_close(got.double(), want, **tol("normalization", device))


def test_batch_norm_infer_rejects_a_parameter_of_the_wrong_length():
    from delegate.ops import get_op

    with pytest.raises(DelegateError, match="expected"):
        get_op("batch_norm").infer([(2, 5, 3), (5,), (5,), (4,), (5,)], {"eps": 1e-5})


# ---- whole models through the partitioner, preprocess and the runner ----------------------
class ConvBn(nn.Module):
    def __init__(self, c_in=3, c_out=5, bias=True, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=bias, groups=groups)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x):
        return self.bn(self.conv(x))


class BnOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return torch.relu(self.bn(x + 1.0))


class ConvShared(nn.Module):
    """The convolution's output is read by the batch norm and the residual: no fold."""
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


def _randomize_bn(model):
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.running_mean.normal_()
            m.running_var.uniform_(0.2, 2.0)
            m.weight.data.normal_()
            m.bias.data.normal_()
    return model.eval()


def _lower(model, x, device, passes=None):
    ep = torch.export.export(model, (x,))
    edge = to_edge_transform_and_lower(ep, partitioner=[WgpuPartitioner(device, passes=passes)],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch()


def _blobs(pm) -> list:
    gm = pm.exported_program().graph_module
    return [m.processed_bytes for _, m in gm.named_children() if hasattr(m, "processed_bytes")]


def _ops(pm) -> list:
    return [n.op for b in _blobs(pm) for n in blob.decode(b).nodes]


def _model(cls, *args):
    torch.manual_seed(0)
    return _randomize_bn(seeded(cls(*args)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False], ids=["conv-bias", "conv-nobias"])
def test_conv_bn_folds_to_one_convolution(device, bias):
    model, x = _model(ConvBn, 3, 5, bias), torch.randn(2, 3, 7, 9)
    pm = _lower(model, x, device)
    assert undelegated_ops(pm) == []
    assert _ops(pm) == ["convolution"]
    (got,), = run_pte(pm, [(x,)], device)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))


@pytest.mark.parametrize("device", DEVICES)
def test_conv_bn_with_the_fold_off_keeps_batch_norm(device):
    model, x = _model(ConvBn), torch.randn(2, 3, 7, 9)
    pm = _lower(model, x, device, passes="none")
    assert _ops(pm) == ["convolution", "batch_norm"]
    (got,), = run_pte(pm, [(x,)], device)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [BnOnly, ConvShared])
def test_unmatched_graph_lowers_byte_identically_and_runs_batch_norm(device, cls):
    model, x = _model(cls), torch.randn(2, 3, 5, 7)
    on, off = _lower(model, x, device), _lower(model, x, device, passes="none")
    assert _blobs(on) == _blobs(off)
    assert "batch_norm" in _ops(on)
    assert undelegated_ops(on) == []
    (got,), = run_pte(on, [(x,)], device)
    torch.testing.assert_close(got, model(x).detach(), **tol("model", device))


def test_unknown_pass_name_is_a_typed_error():
    with pytest.raises(DelegateError, match="expected 'none' or names"):
        WgpuPartitioner("cpu", passes="fold_everything")


# ---- end to end: resnet-like blocks on webgpu ----------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class DepthwiseSeparable(nn.Module):
    def __init__(self, c_in=8, c_out=12):
        super().__init__()
        self.dw, self.bn1 = nn.Conv2d(c_in, c_in, 3, stride=2, padding=1, groups=c_in,
                                      bias=False), nn.BatchNorm2d(c_in)
        self.pw, self.bn2 = nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out)

    def forward(self, x):
        return torch.relu(self.bn2(self.pw(torch.relu(self.bn1(self.dw(x))))))


@pytest.mark.parametrize("cls", [BasicBlock, DepthwiseSeparable])
def test_resnet_like_block_is_whole_on_webgpu_and_matches_eager(cls):
    model, x = _model(cls), torch.randn(2, 8, 11, 9)
    pm = _lower(model, x, "webgpu")
    assert undelegated_ops(pm) == []
    assert len(_blobs(pm)) == 1
    assert "batch_norm" not in _ops(pm)
    (got,), = run_pte(pm, [(x,)], "webgpu")
    torch.testing.assert_close(got, model(x).detach(), **tol("model", "webgpu"))
