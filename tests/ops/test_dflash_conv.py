"""dflash_conv vs naive on packed blocks of awkward lengths (odd block sizes, more taps than slots, a strided side of
the kernel projection), and the naive form against the reference drafter's one-block convolution."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.dflash_conv import dflash_conv, dflash_conv_naive
from ninfer.testing.numerics import assert_close

# (blocks, block, H, group, taps): the published 2 taps over groups of 16 at 5120 (Qwen3.8 27B), 6656 (Muse) on GPU
SHAPES = [(8, 8, 5120, 16, 2), (4, 16, 6656, 16, 2), (3, 5, 5120, 16, 3)] if ON_GPU else \
    [(3, 5, 48, 16, 2), (2, 8, 40, 8, 3), (1, 2, 24, 8, 4), (4, 1, 16, 16, 2)]


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("blocks,block,H,group,taps", SHAPES)
def test_dflash_conv(blocks, block, H, group, taps, dtype):
    N, G = blocks * block, H // group
    x = torch.randn(N, H, device=DEVICE).to(dtype)
    proj = (0.5 * torch.randn(N, 2, taps, G, device=DEVICE)).to(dtype)  # both sides, as the projection gives them
    base = torch.randn(taps, H, device=DEVICE).to(dtype)
    dyn = proj[:, 1]  # the finish side: a strided view
    assert_close("dflash_conv", dflash_conv_naive(x, dyn, base, block), dflash_conv(x, dyn, base, block),
                 1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_naive_equals_the_reference_drafter_convolution():
    from ninfer.models.qwen3_5.drafter import DrafterConfig, DrafterKind
    from ninfer.reference.dflash_conv import _convolve

    cfg = DrafterConfig(DrafterKind.DFLASH2, 32, 1, 2, 1, 16, 64, 1e-6, 1e4, 40, 4, (0,), 8, 0, conv_kernel_size=2,
                        conv_group_size=8, selector_rank=4, selector_top_k=4)
    x, dyn, base = torch.randn(2 * 7, 32), torch.randn(2 * 7, 2, 4), torch.randn(2, 32)
    want = torch.cat([_convolve(x[i * 7:(i + 1) * 7], dyn[i * 7:(i + 1) * 7], base, cfg) for i in range(2)])
    assert_close("dflash_conv_naive", want, dflash_conv_naive(x, dyn, base, 7), 1e-6)
