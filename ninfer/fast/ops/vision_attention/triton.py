"""Non-causal flash attention of the vision tower over packed variable-length segments (one per image frame).

One program per (head, query block, segment); a query block walks every key block of its segment with an online
softmax in fp32 (exp2, log2(e) folded into the scale). Only the last key block of a segment is partial, so only it
is masked. A head dim that is not a power of two (72 in the released towers) is split for Q K^T into a power-of-two
part and a small padded remainder (72 = 64 + 16 columns, 8 of them masked), two dots instead of one padded to 128;
P V is one dot over V padded to the next power of two (128). The split form of P V (a second dot with N = 16) gave
wrong columns in bf16 on the H100 and H200 under Triton 3.6 (relative RMS ~1, NaNs) while fp32 passed. Query blocks
past a segment's end do no work, so the grid is sized by the longest segment (a host int: nothing is read back from
the device).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# (BM, BN, num_warps, num_stages): the default tile; the tower measures the others (``TILES``) at start. No
# 128x128 tile with 3 stages: it needs 280 KB of shared memory, over the Hopper SM's 227 KB
DEFAULT_TILE = (64, 64, 4, 2)
TILES = (DEFAULT_TILE, (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2))


@triton.jit
def _block(qa, qb, acc, m_i, l_i, k_ptr, v_ptr, rows0, s, seg_len, h, sk0, sk1, sv0, sv1, qk_scale,
           D: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, DV: tl.constexpr, SPLIT: tl.constexpr,
           BN: tl.constexpr, MASK: tl.constexpr):
    n = s + tl.arange(0, BN)
    da = tl.arange(0, DA)
    db = DA + tl.arange(0, DB)
    dv = tl.arange(0, DV)
    rows = (rows0 + n).to(tl.int64)[:, None]
    amask = (da < D)[None, :]
    bmask = (db < D)[None, :]
    vmask = (dv < D)[None, :]
    if MASK:
        amask = amask & (n < seg_len)[:, None]
        bmask = bmask & (n < seg_len)[:, None]
        vmask = vmask & (n < seg_len)[:, None]
    ka = tl.load(k_ptr + rows * sk0 + h * sk1 + da[None, :], mask=amask, other=0.0)  # [BN, DA]
    s_ij = tl.dot(qa, tl.trans(ka))  # [BM, BN], unscaled
    if SPLIT:
        kb = tl.load(k_ptr + rows * sk0 + h * sk1 + db[None, :], mask=bmask, other=0.0)  # [BN, DB]
        s_ij = tl.dot(qb, tl.trans(kb), acc=s_ij)
    if MASK:
        s_ij = tl.where((n < seg_len)[None, :], s_ij, float("-inf"))
    # m_i is in scaled (log2) units; the scale is positive, so max then scale equals scale then max, and the
    # scale and the subtraction are one FMA per score
    m_new = tl.maximum(m_i, tl.max(s_ij, axis=1) * qk_scale)  # finite: every block has at least one key
    p = tl.math.exp2(s_ij * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_ptr + rows * sv0 + h * sv1 + dv[None, :], mask=vmask, other=0.0)  # [BN, DV]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _vision_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, qk_scale, sq0, sq1, sk0, sk1, sv0, sv1, so0, so1,
                   D: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, DV: tl.constexpr, SPLIT: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr):
    h = tl.program_id(0)
    mb = tl.program_id(1)
    seg = tl.program_id(2)
    start = tl.load(cu_ptr + seg)
    seg_len = tl.load(cu_ptr + seg + 1) - start
    if mb * BM < seg_len:
        i = mb * BM + tl.arange(0, BM)
        da = tl.arange(0, DA)
        db = DA + tl.arange(0, DB)
        rows = (start + i).to(tl.int64)[:, None]
        amask = (i < seg_len)[:, None] & (da < D)[None, :]
        bmask = (i < seg_len)[:, None] & (db < D)[None, :]
        qa = tl.load(q_ptr + rows * sq0 + h * sq1 + da[None, :], mask=amask, other=0.0)
        qb = tl.load(q_ptr + rows * sq0 + h * sq1 + db[None, :], mask=bmask, other=0.0)
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, DV], dtype=tl.float32)
        full = seg_len // BN * BN
        for s in range(0, full, BN):
            acc, m_i, l_i = _block(qa, qb, acc, m_i, l_i, k_ptr, v_ptr, start, s, seg_len, h, sk0, sk1, sv0, sv1,
                                   qk_scale, D, DA, DB, DV, SPLIT, BN, False)
        if full < seg_len:
            acc, m_i, l_i = _block(qa, qb, acc, m_i, l_i, k_ptr, v_ptr, start, full, seg_len, h, sk0, sk1, sv0,
                                   sv1, qk_scale, D, DA, DB, DV, SPLIT, BN, True)
        dv = tl.arange(0, DV)
        vmask = (i < seg_len)[:, None] & (dv < D)[None, :]
        tl.store(o_ptr + rows * so0 + h * so1 + dv[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty),
                 mask=vmask)


def split_head_dim(D: int) -> tuple[int, int]:
    """(DA, DB, split): DA the largest power of two <= D (at least 16, tl.dot's smallest K), DB the remainder
    padded to a power of two >= 16; split False when D <= DA (DB's columns then unused)."""
    DA = max(16, 1 << (D.bit_length() - 1))
    rest = D - DA
    return DA, max(16, triton.next_power_of_2(max(rest, 1))), rest > 0


def vision_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     scale: float | None = None, out: torch.Tensor | None = None,
                     tile: tuple[int, int, int, int] = DEFAULT_TILE) -> torch.Tensor:
    """Same contract as ``vision_attention_naive``; cu_seqlens [S+1] int32 on q's device, ``max_seqlen`` the
    longest segment (host int). ``out`` [N, nh, d] may be a planned workspace region; ``tile`` one of ``TILES``
    (query rows, key rows, warps, pipeline stages)."""
    N, nh, D = q.shape
    assert k.shape == v.shape == q.shape and q.stride(2) == k.stride(2) == v.stride(2) == 1
    scale = D ** -0.5 if scale is None else scale
    out = q.new_empty(N, nh, D) if out is None else out
    DA, DB, split = split_head_dim(D)
    BM, BN, warps, stages = tile
    DV = triton.next_power_of_2(D)
    if DV > 128:  # keep the accumulator and the K/V tiles inside an SM's registers and shared memory
        BN = min(BN, 32)
    segments = cu_seqlens.shape[0] - 1
    grid = (nh, triton.cdiv(max(max_seqlen, 1), BM), segments)
    _vision_kernel[grid](q, k, v, out, cu_seqlens, scale * LOG2E, q.stride(0), q.stride(1), k.stride(0),
                         k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1), D=D, DA=DA, DB=DB,
                         DV=DV, SPLIT=split, BM=BM, BN=BN, num_warps=warps, num_stages=stages)
    return out
