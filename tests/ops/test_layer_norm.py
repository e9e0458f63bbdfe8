"""layer_norm kernel vs its naive oracle: odd widths, with and without the bias folded into the residual (updated
in place), a strided output row."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.layer_norm import layer_norm, layer_norm_naive
from ninfer.testing.numerics import assert_close, nan_like

# (rows, hidden): the GPU checks the released towers' 1152 and the merger's; CPU tiny odd widths
SHAPES = [(4096, 1152), (7, 1280)] if ON_GPU else [(3, 60), (5, 129), (1, 64)]


def _tol(dtype):
    return 1e-2 if dtype == torch.bfloat16 else 1e-5


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", SHAPES)
@pytest.mark.parametrize("with_add", [False, True], ids=["plain", "add"])
def test_layer_norm(rows, hidden, dtype, with_add):
    x = (3.0 + torch.randn(rows, hidden, device=DEVICE)).to(dtype)  # a mean far from 0: centring matters
    w = (1.0 + 0.1 * torch.randn(hidden, device=DEVICE)).to(dtype)
    b = (0.1 * torch.randn(hidden, device=DEVICE)).to(dtype)
    add = torch.randn(hidden, device=DEVICE).to(dtype) if with_add else None
    x_ref = x.clone()
    y_ref = layer_norm_naive(x_ref, w, b, 1e-6, add)
    y = layer_norm(x, w, b, 1e-6, add, out=nan_like(x))
    assert_close("layer_norm.y", y_ref, y, _tol(dtype))
    assert_close("layer_norm.x", x_ref, x, _tol(dtype))


def test_layer_norm_into_a_strided_output():
    x = torch.randn(5, 60, device=DEVICE)
    w, b = torch.randn(60, device=DEVICE), torch.randn(60, device=DEVICE)
    wide = torch.full((5, 100), float("nan"), device=DEVICE)
    layer_norm(x, w, b, 1e-6, out=wide[:, :60])
    assert_close("layer_norm", layer_norm_naive(x, w, b, 1e-6), wide[:, :60], 1e-5)
    assert torch.isnan(wide[:, 60:]).all()
