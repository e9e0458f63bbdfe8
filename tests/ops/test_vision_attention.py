"""vision_attention vs naive: packed segments of awkward lengths (one row, exactly one block, one past a block),
head dims that are not powers of two (72, the released towers', split 64 + 16), every tile the tower measures,
q/k/v as strided views of one qkv projection, nothing leaking across segments, and the torch SDPA path over equal
frames."""

import pytest
import torch
from triton.runtime.errors import OutOfResources

from _device import DEVICE, DOT_IO_DTYPES, ON_GPU
from ninfer.fast.ops.vision_attention import TILES, frames_sdpa, vision_attention, vision_attention_naive
from ninfer.fast.ops.vision_attention.sdpa import BACKENDS
from ninfer.testing.numerics import assert_close, nan_like

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


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("tile", TILES, ids=str)
def test_every_tile(tile, dtype):
    """The tiles the tower measures at start all give the same attention (a segment longer than every block). In
    fp32 a large tile may not fit the SM's shared memory: the tower's measure skips it the same way (bf16, the
    serving dtype, must fit)."""
    lens, nh, d = ([700, 129], 16, 72) if ON_GPU else ([130, 3], 2, 72)
    q, k, v = torch.randn(3, sum(lens), nh, d, device=DEVICE).to(dtype).unbind(0)
    try:
        out = vision_attention(q, k, v, _cu(lens), max_seqlen=max(lens), out=nan_like(q), tile=tile)
    except OutOfResources as e:
        if dtype == torch.bfloat16:
            raise
        pytest.skip(f"fp32 {tile}: {e}")
    assert_close(f"vision_attention {tile}", vision_attention_naive(q, k, v, _cu(lens)), out, _tol(dtype))


@pytest.mark.parametrize("d", [72, 64, 24, 16, 80])
def test_split_head_dims(d):
    """Head dims split into a power of two and a padded remainder (72 = 64 + 16, 80 = 64 + 16, 24 = 16 + 16) or
    not split (64, 16)."""
    lens, nh = [70, 5], 2
    q, k, v = torch.randn(3, sum(lens), nh, d, device=DEVICE).unbind(0)
    out = vision_attention(q, k, v, _cu(lens), max_seqlen=70, out=nan_like(q))
    assert_close(f"vision_attention d={d}", vision_attention_naive(q, k, v, _cu(lens)), out, _tol(torch.float32))


@pytest.mark.parametrize("backend", list(BACKENDS) if ON_GPU else ["flash"])
@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
def test_frames_through_sdpa(backend, dtype):
    """torch's SDPA backends over equal frames (a batch) as strided views of one qkv projection: the same
    block-diagonal attention as the packed kernel's."""
    frames, L, nh, d = (2, 1024, 16, 72) if ON_GPU else (2, 9, 2, 72)
    qkv = torch.randn(frames * L, 3, nh, d, device=DEVICE).to(dtype)
    q, k, v = qkv.unbind(1)
    try:
        out = frames_sdpa(q, k, v, L, backend)
    except RuntimeError as e:  # a backend this torch build or GPU lacks: the tower skips it the same way
        pytest.skip(f"{backend}: {e}")
    assert_close(f"frames_sdpa {backend}", vision_attention_naive(q, k, v, _cu([L] * frames)), out, _tol(dtype))
