"""prefill_attention vs naive: varlen chunks with cached prefixes of various lengths, GQA, odd head dim and page
size, scrambled pages; and the prefill pipeline rope_kv_write -> prefill_attention against the naive pair."""

import pytest
import torch

from _device import DEVICE, DOT_IO_DTYPES, ON_GPU
from _paged import random_paged_cache
from ninfer.fast.ops.prefill_attention import prefill_attention, prefill_attention_naive
from ninfer.fast.ops.rope_kv_write import rope_kv_write, rope_kv_write_naive
from ninfer.testing.numerics import assert_close

# (chunk lengths, prefix lengths, nh, nkv, d, page_size): the GPU checks the 9B dims at real lengths. Query blocks
# whose first query sits past a key block's end walk unmasked blocks first (prefix 70 + 150 queries; d=256 fp32),
# the others only masked diagonal blocks
CASES = ([([2048], [0], 16, 4, 256, 16), ([1000, 37, 513], [0, 4000, 100], 16, 4, 256, 16),
          ([63, 200], [65, 0], 24, 4, 256, 32), ([8192], [0], 16, 4, 256, 16)] if ON_GPU
         else [([5, 1, 13], [0, 7, 20], 6, 2, 60, 6), ([70], [3], 4, 1, 16, 16),
               ([150, 9], [70, 130], 4, 2, 60, 16), ([100], [40], 2, 1, 256, 8)])


def _varlen(lens, prefixes):
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return cu.to(DEVICE), torch.tensor(prefixes, dtype=torch.int32, device=DEVICE)


def _tol(dtype):
    return 1e-2 if dtype == torch.bfloat16 else (2e-3 if ON_GPU else 1e-5)


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("lens,prefixes,nh,nkv,d,page_size", CASES)
def test_prefill_attention(lens, prefixes, nh, nkv, d, page_size, dtype):
    k_pages, v_pages, table = random_paged_cache([n + p for n, p in zip(lens, prefixes)], nkv, d, page_size, dtype,
                                                 DEVICE)
    cu, prefix = _varlen(lens, prefixes)
    q = torch.randn(sum(lens), nh, d, device=DEVICE).to(dtype)
    ref = prefill_attention_naive(q, k_pages, v_pages, table, cu, prefix)
    out = prefill_attention(q, k_pages, v_pages, table, cu, prefix, max_seqlen=max(lens))
    assert_close("prefill_attention", ref, out, _tol(dtype))


# a short chunk over a long prefix with its key walk split: shares with no unmasked block (prefix 5), uneven shares,
# a varlen batch, more shares than blocks
SPLIT_CASES = ([([192], [8000], 16, 4, 256, 16, 4), ([37, 300], [5000, 130], 16, 4, 256, 16, 8)] if ON_GPU
               else [([9], [150], 4, 2, 60, 16, 3), ([5, 20], [5, 97], 2, 1, 16, 8, 4), ([3], [40], 2, 2, 16, 4, 8)])


@pytest.mark.parametrize("lens,prefixes,nh,nkv,d,page_size,splits", SPLIT_CASES)
def test_prefill_attention_split_key_walk(lens, prefixes, nh, nkv, d, page_size, splits):
    dtype = DOT_IO_DTYPES[0]
    k_pages, v_pages, table = random_paged_cache([n + p for n, p in zip(lens, prefixes)], nkv, d, page_size, dtype,
                                                 DEVICE)
    cu, prefix = _varlen(lens, prefixes)
    q = torch.randn(sum(lens), nh, d, device=DEVICE).to(dtype)
    ref = prefill_attention_naive(q, k_pages, v_pages, table, cu, prefix)
    out = prefill_attention(q, k_pages, v_pages, table, cu, prefix, max_seqlen=max(lens), splits=splits)
    assert_close("prefill_attention.split", ref, out, _tol(dtype))
    if ON_GPU:  # the chosen split (9B's 192-token suffix over 8000 keys splits) equals the forced one
        chosen = prefill_attention(q, k_pages, v_pages, table, cu, prefix, max_seqlen=max(lens),
                                   max_prefix=max(prefixes))
        assert_close("prefill_attention.chosen_split", ref, chosen, _tol(dtype))


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
def test_prefill_pipeline_writes_chunk_then_attends(dtype):
    lens, prefixes, nh, nkv, d, rd, page_size = ([6, 3], [5, 0], 4, 2, 32, 16, 4)
    k_pages, v_pages, table = random_paged_cache([n + p for n, p in zip(lens, prefixes)], nkv, d, page_size, dtype,
                                                 DEVICE)
    cu, prefix = _varlen(lens, prefixes)
    T = sum(lens)
    q, k, v = (torch.randn(T, h, d, device=DEVICE).to(dtype) for h in (nh, nkv, nkv))
    # token i of sequence b goes to cache position prefix[b] + i, through the block table
    pos = torch.cat([torch.arange(p, p + n) for n, p in zip(lens, prefixes)]).to(DEVICE)
    seq = torch.cat([torch.full((n,), b) for b, n in enumerate(lens)]).to(DEVICE)
    slots = (table[seq, pos // page_size].long() * page_size + pos % page_size)
    wq, wk = (0.1 * torch.randn(d, device=DEVICE)).to(dtype), (0.1 * torch.randn(d, device=DEVICE)).to(dtype)
    kp_ref, vp_ref = k_pages.clone(), v_pages.clone()
    q_ref = rope_kv_write_naive(q, k, v, pos, slots, kp_ref, vp_ref, rd, 1e7, wq, wk)
    o_ref = prefill_attention_naive(q_ref, kp_ref, vp_ref, table, cu, prefix)
    qr = rope_kv_write(q, k, v, pos, slots, k_pages, v_pages, rd, 1e7, wq, wk)
    o = prefill_attention(qr, k_pages, v_pages, table, cu, prefix, max_seqlen=max(lens))
    assert_close("prefill_pipeline", o_ref, o, _tol(dtype))


# (lens, prefixes, grid shares, keys a share): prefixes that earn one share (short, or under 4x the chunk), fewer
# shares than the grid has, and as many; a varlen batch whose sequences earn different counts
DEVICE_SPLIT_CASES = ([([192], [8000], 8, 1024), ([37, 300], [5000, 130], 4, 1024), ([512], [600], 4, 1024)]
                      if ON_GPU else [([9], [150], 4, 32), ([5, 20], [5, 97], 4, 16), ([3], [40], 8, 16),
                                      ([30], [70], 3, 16)])


@pytest.mark.parametrize("lens,prefixes,splits,split_keys", DEVICE_SPLIT_CASES)
def test_prefill_attention_shares_from_the_device_prefix(lens, prefixes, splits, split_keys):
    """A graph's attention: the grid has a fixed number of shares and each sequence walks as many as its prefix on
    the device earns (the rest store an empty softmax the merge weighs 0)."""
    dtype = DOT_IO_DTYPES[0]
    k_pages, v_pages, table = random_paged_cache([n + p for n, p in zip(lens, prefixes)], 2, 16, 8, dtype, DEVICE)
    cu, prefix = _varlen(lens, prefixes)
    q = torch.randn(sum(lens), 4, 16, device=DEVICE).to(dtype)
    ref = prefill_attention_naive(q, k_pages, v_pages, table, cu, prefix)
    out = prefill_attention(q, k_pages, v_pages, table, cu, prefix, max_seqlen=max(lens), splits=splits,
                            device_splits=True, split_keys=split_keys)
    assert_close("prefill_attention.device_shares", ref, out, _tol(dtype))
