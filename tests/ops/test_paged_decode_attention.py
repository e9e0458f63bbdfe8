"""paged_decode_attention vs the naive gather + softmax: GQA groups of odd size, odd head dim and page size,
scrambled pages, empty rows, and split-K on and off."""

import pytest
import torch

from _device import DEVICE, DOT_IO_DTYPES, ON_GPU
from _paged import random_paged_cache
from ninfer.fast.ops.paged_decode_attention import paged_decode_attention, paged_decode_attention_naive
from ninfer.testing.numerics import assert_close

# (context lengths, nh, nkv, d, page_size): the GPU checks the 9B attention dims (16/4 heads, head_dim 256)
CASES = ([([4097], 16, 4, 256, 16), ([1, 700, 5000, 33, 129, 16, 17, 2048], 16, 4, 256, 16),
          ([30000], 16, 4, 256, 32), ([100, 9000, 3], 24, 4, 256, 16)] if ON_GPU
         else [([1, 17, 300], 6, 2, 60, 5), ([9, 0], 4, 4, 16, 8)])


def _tol(dtype, fp32_gpu=2e-3):
    """bf16 rounding; fp32 on the GPU runs the dots in TF32 (10-bit mantissa), exact elsewhere."""
    return 1e-2 if dtype == torch.bfloat16 else (fp32_gpu if ON_GPU else 1e-5)


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["splits1", "splits3", "auto"])
@pytest.mark.parametrize("lengths,nh,nkv,d,page_size", CASES)
def test_paged_decode_attention(lengths, nh, nkv, d, page_size, num_splits, dtype):
    k_pages, v_pages, table = random_paged_cache(lengths, nkv, d, page_size, dtype, DEVICE)
    q = torch.randn(len(lengths), nh, d, device=DEVICE).to(dtype)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    ref = paged_decode_attention_naive(q, k_pages, v_pages, table, ctx)
    out = paged_decode_attention(q, k_pages, v_pages, table, ctx, num_splits=num_splits)
    assert_close("paged_decode_attention", ref, out, _tol(dtype))


@pytest.mark.parametrize("num_splits", [1, 3], ids=["splits1", "splits3"])
def test_first_keys_bound_the_window(num_splits):
    """first_keys [B]: each row attends to keys first..context-1 only (a draft window), equal to the naive form
    and to attention over the window's keys alone."""
    lengths, first = [40, 9, 300, 5], [13, 0, 250, 5]  # the last row has no keys in its window
    k_pages, v_pages, table = random_paged_cache(lengths, 2, 32, 8, torch.float32, DEVICE)
    q = torch.randn(len(lengths), 4, 32, device=DEVICE)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    fk = torch.tensor(first, dtype=torch.int32, device=DEVICE)
    ref = paged_decode_attention_naive(q, k_pages, v_pages, table, ctx, first_keys=fk)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, k_pages, v_pages, table, ctx, num_splits=num_splits, out=out, first_keys=fk)
    assert_close("windowed paged_decode_attention", ref, out, 2e-3 if ON_GPU else 1e-5)
    full = paged_decode_attention_naive(q, k_pages, v_pages, table, ctx)
    assert not torch.allclose(ref[0], full[0]) and torch.equal(ref[1], full[1]) and not ref[3].any()


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("num_splits", [1, 3], ids=["splits1", "splits3"])
def test_output_gate(num_splits, dtype):
    """gate [B, nh, d], the strided half of the fused q projection as the model passes it: out = attention *
    sigmoid(gate), written by whichever kernel stores the output, into a NaN-poisoned buffer."""
    lengths, nh, nkv, d = CASES[0][0], *CASES[0][1:4]
    k_pages, v_pages, table = random_paged_cache(lengths, nkv, d, CASES[0][4], dtype, DEVICE)
    qg = (torch.randn(len(lengths), nh, 2 * d, device=DEVICE) * 2).to(dtype)
    q, gate = qg[..., :d].contiguous(), qg[..., d:]
    ctx = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    ref = paged_decode_attention_naive(q, k_pages, v_pages, table, ctx, gate=gate)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, k_pages, v_pages, table, ctx, num_splits=num_splits, out=out, gate=gate)
    # q x 2 sharpens the softmax, which scales TF32's score error: 2.5e-3 measured on the H100
    assert_close("gated paged_decode_attention", ref, out, _tol(dtype, fp32_gpu=5e-3))
    plain = paged_decode_attention_naive(q, k_pages, v_pages, table, ctx)
    assert not torch.allclose(ref, plain)
