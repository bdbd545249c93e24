"""torchvision's resnet18 and mobilenet_v3_small, exported and lowered whole: at least 98% of
their ops (as `python -m delegate inspect` counts them) in our delegate, in one delegate call,
matching eager, on cpu and webgpu.

torchvision cannot be imported beside the pinned torch, so both networks are re-implemented
here layer for layer (torchvision/models/resnet.py, mobilenetv3.py and ops/misc.py): the same
modules in the same order, so the same edge ops. resnet18 runs at a quarter of its width and
both on 64x64 inputs, so the test stays fast. Weights are random; batch norms get non-trivial
running statistics, so folding them into the convolutions is exercised.
"""
from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from delegate.aot import lower
from delegate.runtime.inspect import delegation_of, describe_outside
from tests.test_batch_norm import _ops
from tests.test_models import run_pte
from tests.tolerances import tol


# --- resnet18 (torchvision.models.resnet, BasicBlock, layers [2, 2, 2, 2]) -------------------

def _conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(inplanes, planes, stride), nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = _conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's resnet18; `width` is the stem's channel count (torchvision: 64), the four
    stages have width, 2, 4 and 8 times width."""

    def __init__(self, width: int = 64, num_classes: int = 1000):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, 2)
        self.layer2 = self._make_layer(width * 2, 2, stride=2)
        self.layer3 = self._make_layer(width * 4, 2, stride=2)
        self.layer4 = self._make_layer(width * 8, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(_conv1x1(self.inplanes, planes, stride),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --- mobilenet_v3_small (torchvision.models.mobilenetv3, ops.misc) ----------------------------

def _make_divisible(v, divisor=8):
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class Conv2dNormActivation(nn.Sequential):
    def __init__(self, cin, cout, kernel_size=3, stride=1, groups=1, norm_layer=None,
                 activation_layer=nn.ReLU):
        layers = [nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2,
                            groups=groups, bias=False), norm_layer(cout)]
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze_channels):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, channels, 1)
        self.activation, self.scale_activation = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x):
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


class InvertedResidual(nn.Module):
    def __init__(self, cin, kernel, expanded, cout, use_se, use_hs, stride, norm_layer):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act = nn.Hardswish if use_hs else nn.ReLU
        layers = []
        if expanded != cin:
            layers.append(Conv2dNormActivation(cin, expanded, 1, norm_layer=norm_layer,
                                               activation_layer=act))
        layers.append(Conv2dNormActivation(expanded, expanded, kernel, stride, groups=expanded,
                                           norm_layer=norm_layer, activation_layer=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4)))
        layers.append(Conv2dNormActivation(expanded, cout, 1, norm_layer=norm_layer,
                                           activation_layer=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


# (input channels, kernel, expanded, out channels, use_se, activation, stride): "small", no
# reduced tail, no dilation
_SMALL = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2),
          (24, 3, 88, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
          (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
          (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1),
          (48, 5, 288, 96, True, "HS", 2), (96, 5, 576, 96, True, "HS", 1),
          (96, 5, 576, 96, True, "HS", 1)]


class MobileNetV3Small(nn.Module):
    def __init__(self, width_mult: float = 1.0, num_classes: int = 1000, dropout: float = 0.2):
        super().__init__()
        norm_layer = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        adjust = lambda c: _make_divisible(c * width_mult)  # noqa: E731
        setting = [(adjust(i), k, adjust(e), adjust(o), se, a == "HS", s)
                   for i, k, e, o, se, a, s in _SMALL]
        layers = [Conv2dNormActivation(3, setting[0][0], 3, 2, norm_layer=norm_layer,
                                       activation_layer=nn.Hardswish)]
        layers += [InvertedResidual(*cnf, norm_layer) for cnf in setting]
        last_in = setting[-1][3]
        layers.append(Conv2dNormActivation(last_in, 6 * last_in, 1, norm_layer=norm_layer,
                                           activation_layer=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        last_channel = adjust(1024)
        self.classifier = nn.Sequential(nn.Linear(6 * last_in, last_channel),
                                        nn.Hardswish(inplace=True),
                                        nn.Dropout(p=dropout, inplace=True),
                                        nn.Linear(last_channel, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def random_weights(model: nn.Module, seed: int = 0) -> nn.Module:
    """torchvision's init shapes (kaiming fan-out convs, small linears), random BN affine and
    running statistics so that folding them into the convolutions matters; eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1] // m.groups
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2 / fan_out) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(1 + 0.2 * torch.randn(c, generator=g))
                m.bias.copy_(0.1 * torch.randn(c, generator=g))
                m.running_mean.copy_(0.2 * torch.randn(c, generator=g))
                m.running_var.copy_(0.5 + torch.rand(c, generator=g))
            elif isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * m.in_features ** -0.5)
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return model.eval()


# --- lowering and measuring ------------------------------------------------------------------

def delegation(pm) -> tuple:
    """(ops in the delegates, ops outside, delegate calls), as `python -m delegate inspect`
    counts them: IR nodes of our delegates (a folded batch norm is none) and ATen kernel calls
    left outside."""
    return delegation_of(pm.buffer)


MODELS = {
    # width 16 (torchvision: 64): a quarter of every channel count, the same 69 edge ops
    "resnet18": lambda: ResNet18(width=16),
    "mobilenet_v3_small": lambda: MobileNetV3Small(width_mult=1.0),
}
DEVICES = ["cpu", "webgpu"]


def _model_and_input(name):
    torch.manual_seed(0)
    return random_weights(MODELS[name]()), torch.randn(1, 3, 64, 64)


# Measured (1x3x64x64, to_edge_transform_and_lower), identical on cpu and webgpu:
#   resnet18            edge ops 69 (20 convolution, 20 batch norm, 17 relu, 8 add, max_pool2d,
#                       mean, view, linear): 49 IR ops in / 0 out (the 20 batch norms fold into
#                       their convolutions), 1 delegate call; max |err| cpu 2.7e-6,
#                       webgpu 2.9e-6 (|y| <= 4.4)
#   mobilenet_v3_small  edge ops 156 (52 convolution, 34 batch norm, 19 hardswish, 14 relu,
#                       10 mean, 9 hardsigmoid, 9 mul, 6 add, view, 2 linear): 122 in / 0 out,
#                       1 delegate call; max |err| cpu 2.1e-7, webgpu 1.9e-7 (|y| <= 0.49)
# At torchvision's widths on 1x3x224x224 the counts are the same (max |err| resnet18 5.7e-6 cpu,
# 7.6e-6 webgpu; mobilenet_v3_small 1.5e-7, 2.2e-7). The first measurement: resnet18
# cpu 47/22, webgpu 27/42; mobilenet_v3_small cpu 215/100, webgpu 107/208.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(MODELS))
def test_cnn_is_delegated_in_one_call_and_matches_eager(name, device):
    model, x = _model_and_input(name)
    pm = lower(model, (x,), device=device)
    n_in, n_out, calls = delegation(pm)
    assert n_in / (n_in + n_out) >= 0.98, (n_in, n_out)
    assert calls == 1
    assert "batch_norm" not in _ops(pm)   # every one folded into its convolution
    with torch.no_grad():
        (got,), = run_pte(pm, [(x,)], device)
        torch.testing.assert_close(got, model(x), **tol("model", device))


class ConvPool(nn.Module):
    """resnet18's stem: convolution, batch norm, relu, 3x3/2 max pooling."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        return F.max_pool2d(torch.relu(self.bn(self.conv(x))), 3, 2, 1)


# resnet18 itself through to_backend: 50 ops in (linear becomes permute + addmm), 0 out, one
# delegate call on cpu and webgpu (was 49 in / 1 out, in 2 calls, before the pattern)
@pytest.mark.parametrize("device", DEVICES)
def test_to_backend_claims_max_pool2d_with_indices_when_its_indices_are_unread(device):
    """to_edge decomposes max_pool2d into max_pool2d_with_indices and a getitem of the maxima;
    with the indices unread the node is still ours, so the stem stays one delegate call."""
    torch.manual_seed(0)
    model, x = random_weights(ConvPool()), torch.randn(2, 3, 17, 15)
    pm = lower(model, (x,), device=device, flow="to_backend")
    assert delegation(pm) == (3, 0, 1)   # convolution (batch norm folded), relu, max_pool2d
    with torch.no_grad():
        (got,), = run_pte(pm, [(x,)], device)
        torch.testing.assert_close(got, model(x), **tol("model", device))


class PoolWithIndices(nn.Module):
    def forward(self, x):
        values, indices = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        return values * 2.0, indices


def test_max_pool2d_with_its_indices_read_stays_with_aten():
    x = torch.randn(1, 2, 9, 7)
    pm = lower(PoolWithIndices(), (x,), device="cpu")
    assert "aten::max_pool2d_with_indices.out" in describe_outside(pm.buffer)
    (got_values, got_indices), = run_pte(pm, [(x,)], "cpu")
    values, indices = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    torch.testing.assert_close(got_values, values * 2.0, rtol=0, atol=0)
    assert torch.equal(got_indices, indices)
