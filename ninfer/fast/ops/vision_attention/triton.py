"""Non-causal flash attention of the vision tower over packed variable-length segments (one per image frame).

One program per (head, query block, segment); a query block walks every key block of its segment with an online
softmax in fp32 (exp2, log2(e) folded into the scale). Only the last key block of a segment is partial, so only it
is masked; head dims that are not a power of two (72 in the released towers) are padded to the next one with
masked loads. Query blocks past a segment's end do no work, so the grid is sized by the longest segment (a host
int: nothing is read back from the device).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _block(q, acc, m_i, l_i, k_ptr, v_ptr, rows0, s, seg_len, h, sk0, sk1, sv0, sv1, qk_scale,
           D: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, MASK: tl.constexpr):
    n = s + tl.arange(0, BN)
    d = tl.arange(0, BD)
    kvmask = (d < D)[None, :]
    if MASK:
        kvmask = kvmask & (n < seg_len)[:, None]
    rows = (rows0 + n).to(tl.int64)[:, None]
    k = tl.load(k_ptr + rows * sk0 + h * sk1 + d[None, :], mask=kvmask, other=0.0)  # [BN, BD]
    s_ij = tl.dot(q, tl.trans(k)) * qk_scale  # [BM, BN]
    if MASK:
        s_ij = tl.where((n < seg_len)[None, :], s_ij, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s_ij, axis=1))  # finite: every block has at least one key
    p = tl.math.exp2(s_ij - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    v = tl.load(v_ptr + rows * sv0 + h * sv1 + d[None, :], mask=kvmask, other=0.0)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _vision_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, qk_scale, sq0, sq1, sk0, sk1, sv0, sv1, so0, so1,
                   D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    h = tl.program_id(0)
    mb = tl.program_id(1)
    seg = tl.program_id(2)
    start = tl.load(cu_ptr + seg)
    seg_len = tl.load(cu_ptr + seg + 1) - start
    if mb * BM < seg_len:
        i = mb * BM + tl.arange(0, BM)
        d = tl.arange(0, BD)
        qmask = (i < seg_len)[:, None] & (d < D)[None, :]
        rows = (start + i).to(tl.int64)
        q = tl.load(q_ptr + rows[:, None] * sq0 + h * sq1 + d[None, :], mask=qmask, other=0.0)
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BD], dtype=tl.float32)
        full = seg_len // BN * BN
        for s in range(0, full, BN):
            acc, m_i, l_i = _block(q, acc, m_i, l_i, k_ptr, v_ptr, start, s, seg_len, h, sk0, sk1, sv0, sv1, qk_scale,
                                   D, BN, BD, False)
        if full < seg_len:
            acc, m_i, l_i = _block(q, acc, m_i, l_i, k_ptr, v_ptr, start, full, seg_len, h, sk0, sk1, sv0, sv1,
                                   qk_scale,
                                   D, BN, BD, True)
        o = acc / l_i[:, None]
        tl.store(o_ptr + rows[:, None] * so0 + h * so1 + d[None, :], o.to(o_ptr.dtype.element_ty), mask=qmask)


def vision_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as ``vision_attention_naive``; cu_seqlens [S+1] int32 on q's device, ``max_seqlen`` the
    longest segment (host int). ``out`` [N, nh, d] may be a planned workspace region."""
    N, nh, D = q.shape
    assert k.shape == v.shape == q.shape and q.stride(2) == k.stride(2) == v.stride(2) == 1
    scale = D ** -0.5 if scale is None else scale
    out = q.new_empty(N, nh, D) if out is None else out
    BD = triton.next_power_of_2(D)
    # 64 x 64 tiles keep a [64, 128] fp32 accumulator and two [64, 128] K/V tiles well inside an SM at d <= 128
    BM, BN = (64, 64) if BD <= 128 else (64, 32)
    segments = cu_seqlens.shape[0] - 1
    grid = (nh, triton.cdiv(max(max_seqlen, 1), BM), segments)
    _vision_kernel[grid](q, k, v, out, cu_seqlens, scale * LOG2E, q.stride(0), q.stride(1), k.stride(0),
                         k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1), D=D, BM=BM, BN=BN,
                         BD=BD,
                         num_warps=4, num_stages=2)
    return out
