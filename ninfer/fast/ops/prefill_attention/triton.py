"""Causal flash attention for prefill chunks over the paged KV cache (varlen batch packed along T).

The chunk's own keys/values are already in the pages (``rope_kv_write`` runs first), so a query block simply walks
the sequence's keys 0 .. its last query position through the block table, with an online softmax in fp32.
One program per (query block, query head, sequence); query blocks past a sequence's end do no work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, o_ptr, bt_ptr, cu_ptr, prefix_ptr, scale,
                    sq0, sq1, so0, so1, stride_page, stride_tok, stride_kvh, stride_bt,
                    G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    mb = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // G
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    prefix = tl.load(prefix_ptr + b)
    i = mb * BM + tl.arange(0, BM)
    mi = i < q_len
    d = tl.arange(0, BD)
    md = d < D
    rows = (q_start + i).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * sq0 + h * sq1 + d[None, :], mask=mi[:, None] & md[None, :], other=0.0)
    q_pos = prefix + i  # [BM] cache positions of these queries
    # keys up to the block's last real query; 0 for a block entirely past this sequence's chunk
    end = tl.where(mb * BM < q_len, prefix + tl.minimum(q_len, mb * BM + BM), 0)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    for s in range(0, end, BN):
        n = s + tl.arange(0, BN)
        mn = n < end
        page = tl.load(bt_ptr + b * stride_bt + n // PAGE, mask=mn, other=0).to(tl.int64)
        kv_off = page * stride_page + (n % PAGE) * stride_tok + kvh * stride_kvh
        kvmask = mn[:, None] & md[None, :]
        k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=kvmask, other=0.0)  # [BN, BD]
        allowed = mn[None, :] & (n[None, :] <= q_pos[:, None])
        s_ij = tl.where(allowed, tl.dot(q, tl.trans(k)) * scale, float("-inf"))  # [BM, BN]
        m_new = tl.maximum(m_i, tl.max(s_ij, axis=1))
        # rows with nothing allowed yet keep m = -inf; shift by 0 there so exp gives 0, not NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s_ij - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=kvmask, other=0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(o_ptr + rows[:, None] * so0 + h * so1 + d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=mi[:, None] & md[None, :])


def prefill_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                      cu_seqlens: torch.Tensor, prefix_lens: torch.Tensor, max_seqlen: int,
                      scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as ``prefill_attention_naive``; ``max_seqlen`` (a host int, the longest chunk) sizes the grid
    so no device value is read back. cu_seqlens [B+1] and prefix_lens [B] are int32 on q's device."""
    T, nh, D = q.shape
    _, page, nkv, _ = k_pages.shape
    assert nh % nkv == 0 and q.stride(2) == 1 and k_pages.stride() == v_pages.stride() and k_pages.stride(3) == 1
    B = prefix_lens.shape[0]
    scale = D ** -0.5 if scale is None else scale
    out = q.new_empty(T, nh, D) if out is None else out
    BD = triton.next_power_of_2(D)
    # BM 128, BN 64, 8 warps, 3 stages: 297 TFLOP/s at head_dim 256, T=8192 on the H200 (64/32: 122); fp32 tiles
    # that size exceed shared memory, so fp32 io keeps the small blocks
    if BD <= 128:
        BM, BN, warps = 64, 64, 4
    else:
        BM, BN, warps = (128, 64, 8) if q.element_size() == 2 else (64, 32, 8)
    grid = (triton.cdiv(max(max_seqlen, 1), BM), nh, B)
    _prefill_kernel[grid](
        q, k_pages, v_pages, out, block_table, cu_seqlens, prefix_lens, scale, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), block_table.stride(0),
        G=nh // nkv, D=D, PAGE=page, BM=BM, BN=BN, BD=BD, num_warps=warps, num_stages=3)
    return out
