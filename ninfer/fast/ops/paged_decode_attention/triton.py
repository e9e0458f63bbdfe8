"""Paged decode attention with split-K over the context (flash-decoding).

One program per (sequence, KV head, split) serves all the query heads of its GQA group at once, so each K/V page is
read once per group; keys are gathered token by token through the block table, so any page size works. With more
than one split each program writes a partial output and its log-sum-exp, and a second kernel merges the splits.
The split count depends only on shapes, so it is CUDA-graph safe; each split's key range is cut from the live
context length inside the kernel, so the work stays balanced however large the block table's capacity is.
With ``gate`` the kernel that writes the output (the merge, or the single split) multiplies it by sigmoid(gate), the
output gate of Qwen3.5's attention, so the gated output costs no launch of its own.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, first_ptr, o_ptr, po_ptr, lse_ptr, g_ptr, scale,
                   stride_qb, stride_qh, stride_page, stride_tok, stride_kvh, stride_bt, stride_ob, stride_oh,
                   stride_gb, stride_gh, G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                   NUM_SPLITS: tl.constexpr, BG: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
                   HAS_FIRST: tl.constexpr, GATE: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b)
    g = tl.arange(0, BG)
    d = tl.arange(0, BD)
    mg = g < G
    md = d < D
    heads = kvh * G + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=mg[:, None] & md[None, :],
                other=0.0)  # [BG, BD]
    first = 0
    if HAS_FIRST:  # a sliding window: keys first..ctx-1 only
        first = tl.load(first_ptr + b)
    # splits share the live key range evenly (in whole key blocks), however large the block table is
    split_len = tl.cdiv(tl.cdiv(tl.maximum(ctx - first, 0), NUM_SPLITS), BN) * BN
    start = first + sp * split_len
    end = tl.minimum(start + split_len, ctx)
    m_i = tl.full([BG], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BG], dtype=tl.float32)
    acc = tl.zeros([BG, BD], dtype=tl.float32)
    for s in range(start, end, BN):
        n = s + tl.arange(0, BN)
        mn = n < end
        page = tl.load(bt_ptr + b * stride_bt + n // PAGE, mask=mn, other=0).to(tl.int64)
        kv_off = page * stride_page + (n % PAGE) * stride_tok + kvh * stride_kvh  # [BN]
        kvmask = mn[:, None] & md[None, :]
        k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=kvmask, other=0.0)  # [BN, BD]
        s_ij = tl.where(mn[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))  # [BG, BN] fp32
        m_new = tl.maximum(m_i, tl.max(s_ij, axis=1))
        p = tl.exp(s_ij - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=kvmask, other=0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    # an empty range (context 0, or a split past the context) leaves l_i = 0: emit zeros and lse = -inf
    has = l_i > 0.0
    o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    omask = mg[:, None] & md[None, :]
    if NUM_SPLITS == 1:
        if GATE:
            o *= _sigmoid_gate(g_ptr + b * stride_gb + heads[:, None] * stride_gh + d[None, :], omask)
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=omask)
    else:
        row = (b * G * tl.num_programs(1) + heads) * NUM_SPLITS + sp  # [BG] index into [B, nh, NUM_SPLITS]
        tl.store(po_ptr + row[:, None] * D + d[None, :], o, mask=omask)
        tl.store(lse_ptr + row, tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf")), mask=mg)


@triton.jit
def _sigmoid_gate(g_ptrs, mask):
    # sigmoid(gate) in fp32, the gate rounded to its io dtype as an unfused sigmoid's input is
    return tl.sigmoid(tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32))


@triton.jit
def _merge_kernel(po_ptr, lse_ptr, o_ptr, g_ptr, stride_ob, stride_oh, stride_gb, stride_gh, NH: tl.constexpr,
                  D: tl.constexpr, NUM_SPLITS: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr,
                  GATE: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BS)
    d = tl.arange(0, BD)
    ms = s < NUM_SPLITS
    row = (b * NH + h) * NUM_SPLITS + s
    lse = tl.load(lse_ptr + row, mask=ms, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp(lse - tl.where(m == float("-inf"), 0.0, m))  # all -inf (context 0) gives all-zero weights
    po = tl.load(po_ptr + row[:, None] * D + d[None, :], mask=ms[:, None] & (d < D)[None, :], other=0.0)
    total = tl.sum(w, axis=0)
    o = tl.sum(w[:, None] * po, axis=0) / tl.where(total > 0.0, total, 1.0)
    if GATE:
        o *= _sigmoid_gate(g_ptr + b * stride_gb + h * stride_gh + d, d < D)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, o.to(o_ptr.dtype.element_ty), mask=d < D)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H200's count, so the interpreter exercises the same split choices


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """About four programs per SM, but no split shorter than 256 keys (measured on the H200: B=1 at 32k context
    reads 2.9 TB/s with 128 splits against 2.3 with 64)."""
    per_split_min = 256
    want = triton.cdiv(4 * _num_sms(device), batch * num_kv_heads)
    return max(1, min(want, triton.cdiv(max_context, per_split_min), 128))


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                           context_lens: torch.Tensor, scale: float | None = None, num_splits: int | None = None,
                           out: torch.Tensor | None = None, first_keys: torch.Tensor | None = None,
                           gate: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, nh, d]; k_pages, v_pages [P, page_size, nkv, d]; block_table [B, max_pages] int32; context_lens [B]
    int32 (keys per sequence, the current token included; 0 yields zeros); first_keys [B] int32 (optional) the
    first key each row attends to (a sliding window); gate [B, nh, d] (optional, any strides with a contiguous last
    dim): the output is multiplied by sigmoid(gate) in fp32 before its one rounding. Returns [B, nh, d] in q's
    dtype.
    ``num_splits`` defaults to ``choose_num_splits`` over the block table's capacity."""
    B, nh, D = q.shape
    _, page, nkv, _ = k_pages.shape
    assert nh % nkv == 0 and q.stride(2) == 1 and k_pages.stride() == v_pages.stride() and k_pages.stride(3) == 1
    assert gate is None or (gate.shape == q.shape and gate.stride(2) == 1), "gate must be [B, nh, d], rows contiguous"
    G = nh // nkv
    scale = D ** -0.5 if scale is None else scale
    capacity = block_table.shape[1] * page
    ns = choose_num_splits(B, nkv, capacity, q.device) if num_splits is None else num_splits
    BN = 32 if D > 128 else 64  # BN 32, 4 warps, 2 stages: the best of a sweep at head_dim 256
    out = q.new_empty(B, nh, D) if out is None else out
    if ns > 1:
        po = torch.empty(B, nh, ns, D, device=q.device, dtype=torch.float32)
        lse = torch.empty(B, nh, ns, device=q.device, dtype=torch.float32)
    else:
        po = lse = out
    BG, BD = max(16, triton.next_power_of_2(G)), triton.next_power_of_2(D)
    g = q if gate is None else gate
    on = pdl.active(q)
    _decode_kernel[(B, nkv, ns)](
        q, k_pages, v_pages, block_table, context_lens, context_lens if first_keys is None else first_keys, out, po,
        lse, g, scale,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), block_table.stride(0),
        out.stride(0), out.stride(1), g.stride(0), g.stride(1), G=G, D=D, PAGE=page, NUM_SPLITS=ns, BG=BG, BD=BD,
        BN=BN, HAS_FIRST=first_keys is not None, GATE=gate is not None, PDL=on, num_warps=4, num_stages=2,
        **pdl.launch(on))
    if ns > 1:
        _merge_kernel[(B, nh)](po, lse, out, g, out.stride(0), out.stride(1), g.stride(0), g.stride(1), NH=nh, D=D,
                               NUM_SPLITS=ns, BS=triton.next_power_of_2(ns), BD=BD, GATE=gate is not None,
                               PDL=on, **pdl.launch(on))
    return out
