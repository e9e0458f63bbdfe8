"""vision_rotary kernel vs its naive oracle: q and k of one qkv projection rotated in place (v untouched), head
dims that are not powers of two (72, the released towers'), several frames sharing one table, odd row counts."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.vision_rotary import vision_rotary, vision_rotary_naive
from ninfer.testing.numerics import assert_close

# (rows, table rows, heads, head dim)
CASES = [(4096, 4096, 16, 72), (2 * 300, 300, 16, 72)] if ON_GPU else [(7, 7, 3, 72), (2 * 5, 5, 2, 24), (9, 9, 1, 8)]


def _tol(dtype):
    return 1e-2 if dtype == torch.bfloat16 else 1e-6


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("n,L,nh,d", CASES)
def test_vision_rotary(n, L, nh, d, dtype):
    qkv = torch.randn(n, 3, nh, d, device=DEVICE).to(dtype)
    angles = torch.rand(L, d // 2, device=DEVICE) * 20
    cos, sin = angles.cos(), angles.sin()
    want = qkv.clone()
    vision_rotary_naive(want, cos, sin)
    v = qkv[:, 2].clone()
    vision_rotary(qkv, cos, sin)
    assert_close("vision_rotary", want, qkv, _tol(dtype))
    assert torch.equal(qkv[:, 2], v)


def test_naive_is_rotate_half():
    """The oracle is transformers' form: x * cos + rotate_half(x) * sin with the half table repeated."""
    n, nh, d = 4, 2, 8
    qkv = torch.randn(n, 3, nh, d, dtype=torch.float64)
    angles = torch.rand(n, d // 2, dtype=torch.float64)
    full = torch.cat([angles, angles], -1)[:, None]
    x = qkv[:, 0].clone()
    want = x * full.cos() + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * full.sin()
    vision_rotary_naive(qkv, angles.cos(), angles.sin())
    assert torch.allclose(qkv[:, 0], want)
