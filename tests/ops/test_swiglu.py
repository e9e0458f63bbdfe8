"""swiglu vs naive on odd widths (and the 9B / MoE widths on the GPU)."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.swiglu import swiglu, swiglu_naive
from ninfer.testing.numerics import assert_close

SHAPES = [(1, 12288), (37, 12288), (64, 512)] if ON_GPU else [(3, 60), (1, 1500), (5, 1)]


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("T,I", SHAPES)
def test_swiglu(T, I, dtype):
    x = (3 * torch.randn(T, 2 * I, device=DEVICE)).to(dtype)
    assert_close("swiglu", swiglu_naive(x), swiglu(x), 1e-2 if dtype == torch.bfloat16 else 1e-5)
