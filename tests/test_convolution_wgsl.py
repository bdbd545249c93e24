"""convolution on WebGPU (lavapipe in CI) against torch's float64 conv1d / conv2d /
conv_transpose1d / conv_transpose2d, on prime sizes. Cases with at least 4 output channels per
group run the 4-channel tile (ragged tiles included); the others (depthwise) the scalar route."""
import pytest
import torch
import torch.nn.functional as F

from tests.test_kernels_wgsl import check, rand, run_wgsl

CASES = [
    # (x shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
    ("1d-k3", (2, 3, 13), (5, 3, 3), [1], [1], [1], False, [0], 1),
    ("1d-grouped-s2", (2, 6, 11), (6, 2, 5), [2], [2], [1], False, [0], 3),
    ("1d-transposed", (2, 3, 7), (3, 5, 4), [3], [1], [1], True, [2], 1),
    ("3x3-s1-p1", (2, 3, 11, 13), (7, 3, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    ("3x3-s2-p1", (2, 5, 13, 11), (8, 5, 3, 3), [2, 2], [1, 1], [1, 1], False, [0, 0], 1),
    ("1x1-pointwise", (2, 5, 7, 9), (11, 5, 1, 1), [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    ("5x5-dil2-p2", (2, 3, 13, 11), (4, 3, 5, 5), [1, 1], [2, 2], [2, 2], False, [0, 0], 1),
    ("asymmetric", (2, 4, 9, 13), (5, 4, 3, 5), [2, 1], [0, 2], [1, 2], False, [0, 0], 1),
    ("depthwise-3x3", (2, 5, 11, 7), (5, 1, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 5),
    ("depthwise-s2", (2, 4, 13, 13), (4, 1, 3, 3), [2, 2], [1, 1], [1, 1], False, [0, 0], 4),
    ("depthwise-mult2", (2, 3, 9, 7), (6, 1, 3, 3), [1, 1], [0, 0], [2, 1], False, [0, 0], 3),
    ("grouped-2-tile", (2, 4, 7, 9), (10, 2, 3, 3), [1, 2], [1, 1], [1, 1], False, [0, 0], 2),
    ("transposed-s2-op1", (2, 5, 7, 5), (5, 3, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 0], 1),
    ("transposed-tile", (2, 3, 5, 7), (3, 9, 3, 3), [1, 1], [0, 1], [1, 1], True, [0, 0], 1),
    ("transposed-grouped-dil", (2, 4, 5, 7), (4, 5, 3, 2), [2, 1], [1, 0], [2, 1], True,
     [1, 0], 2),
]


def _reference(x, w, b, stride, padding, dilation, transposed, out_pad, groups):
    if transposed:
        fn = F.conv_transpose1d if x.dim() == 3 else F.conv_transpose2d
        return fn(x, w, b, stride=stride, padding=padding, output_padding=out_pad,
                  groups=groups, dilation=dilation)
    fn = F.conv1d if x.dim() == 3 else F.conv2d
    return fn(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_convolution_matches_float64(case, bias):
    _, xs, ws, stride, padding, dilation, transposed, out_pad, groups = case
    x, w = rand(*xs), rand(*ws)
    b = rand(ws[1] * groups if transposed else ws[0]) if bias else None
    attrs = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                 output_padding=out_pad, groups=groups)
    got = run_wgsl("convolution", [x, w, b], attrs, consts=(1, 2))[0]
    want = _reference(x, w, b, stride, padding, dilation, transposed, out_pad, groups)
    assert got.shape == want.shape
    check(got, want, "matmul")


def test_convolution_at_a_model_shape():
    """resnet's stage-2 3x3 (64 channels, 4 tiles of 4 per group of 1) at a small image."""
    x, w, b = rand(1, 64, 14, 14), rand(64, 64, 3, 3) / 24, rand(64)
    attrs = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], transposed=False,
                 output_padding=[0, 0], groups=1)
    got = run_wgsl("convolution", [x, w, b], attrs, consts=(1, 2))[0]
    check(got, F.conv2d(x, w, b, padding=1), "matmul")


def test_convolution_is_claimed_on_webgpu():
    import kernels_wgsl

    assert kernels_wgsl.has_kernel("convolution")
