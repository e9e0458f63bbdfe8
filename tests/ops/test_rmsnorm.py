"""rmsnorm kernel vs its naive oracle: with and without the fused residual add, odd widths, in-place residual."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.rmsnorm import rmsnorm, rmsnorm_naive
from ninfer.testing.numerics import assert_close, nan_like

# (rows, hidden): the GPU checks real widths (9B hidden 4096, 27B 5120, head_dim 256 for q/k norm)
SHAPES = [(7, 4096), (3, 5120), (64 * 16, 256)] if ON_GPU else [(3, 60), (5, 129), (1, 64)]


def _tol(dtype):
    return 1e-2 if dtype == torch.bfloat16 else 1e-5


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rmsnorm(rows, hidden, dtype, with_residual):
    x = torch.randn(rows, hidden, device=DEVICE).to(dtype)
    w = (0.1 * torch.randn(hidden, device=DEVICE)).to(dtype)
    r = torch.randn(rows, hidden, device=DEVICE).to(dtype) if with_residual else None
    y_ref, h_ref = rmsnorm_naive(x, w, 1e-6, r)
    y, h = rmsnorm(x, w, 1e-6, r, out=nan_like(x), residual_out=nan_like(x) if with_residual else None)
    assert_close("rmsnorm.y", y_ref, y, _tol(dtype))
    assert_close("rmsnorm.h", h_ref, h, _tol(dtype))


def test_rmsnorm_in_place_residual_and_3d():
    # [B, heads, d] input (the q/k-norm use) and a residual stream updated in place
    x = torch.randn(3, 5, 60, device=DEVICE)
    w = 0.1 * torch.randn(60, device=DEVICE)
    r = torch.randn(3, 5, 60, device=DEVICE)
    y_ref, h_ref = rmsnorm_naive(x, w, 1e-6, r.clone())
    y, h = rmsnorm(x, w, 1e-6, r, residual_out=r)
    assert h.data_ptr() == r.data_ptr()
    assert_close("rmsnorm.y", y_ref, y, 1e-5)
    assert_close("rmsnorm.h", h_ref, r, 1e-5)
