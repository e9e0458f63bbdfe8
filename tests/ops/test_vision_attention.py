"""vision_attention vs naive: packed segments of awkward lengths (one row, exactly one block, one past a block),
head dims that are not powers of two (72, the released towers'), q/k/v as strided views of one qkv projection, and
nothing leaking across segments."""

import pytest
import torch

from _device import DEVICE, DOT_IO_DTYPES, ON_GPU
from ninfer.fast.ops.vision_attention import vision_attention, vision_attention_naive
from ninfer.testing.numerics import assert_close

# (segment lengths, heads, head dim): on the GPU the 9B tower's 16 x 72 at a 1024x1024 image (4096 patches) and a
# mixed batch; on CPU tiny ones through the interpreter
CASES = ([([4096], 16, 72), ([1024, 64, 2500, 1], 16, 72), ([300, 77], 12, 64)] if ON_GPU
         else [([5, 64, 65, 1], 2, 72), ([130], 1, 16), ([3, 9], 3, 24)])


def _tol(dtype):
    return 1e-2 if dtype == torch.bfloat16 else (2e-3 if ON_GPU else 1e-5)


def _cu(lens):
    return torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(DEVICE)


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("lens,nh,d", CASES)
def test_vision_attention(lens, nh, d, dtype):
    N = sum(lens)
    qkv = torch.randn(N, 3, nh, d, device=DEVICE).to(dtype)  # strided views, as the tower's qkv projection gives
    q, k, v = qkv.unbind(1)
    cu = _cu(lens)
    ref = vision_attention_naive(q, k, v, cu)
    out = vision_attention(q, k, v, cu, max_seqlen=max(lens))
    assert_close("vision_attention", ref, out, _tol(dtype))


def test_segments_do_not_see_each_other():
    lens, nh, d = [7, 40], 2, 72
    q, k, v = (torch.randn(sum(lens), nh, d, device=DEVICE) for _ in range(3))
    both = vision_attention(q, k, v, _cu(lens), max_seqlen=40)
    k2, v2 = k.clone(), v.clone()
    k2[7:], v2[7:] = torch.randn(40, nh, d, device=DEVICE), torch.randn(40, nh, d, device=DEVICE)
    changed = vision_attention(q, k2, v2, _cu(lens), max_seqlen=40)
    assert torch.equal(both[:7], changed[:7])
