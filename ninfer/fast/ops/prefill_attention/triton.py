"""Causal flash attention for prefill chunks over the paged KV cache (varlen batch packed along T).

The chunk's own keys/values are already in the pages (``rope_kv_write`` runs first), so a query block simply walks
the sequence's keys 0 .. its last query position through the block table, with an online softmax in fp32 (exp2,
the log2(e) factor folded into the score scale). Per query block the key walk has two phases:

    keys  0 ............ full | full ........ end
          every query sees    | diagonal blocks: causal mask,
          them: no masks      | key-range mask, -inf-safe max

One program per (query head, query block, sequence), query blocks in reverse order: the grid's x is the head, so
the longest blocks (last in the sequence, most keys) start first and the short ones fill the tail of the launch.
Query blocks past a sequence's end do no work.

A short chunk over a long cached prefix (a prefix hit's suffix: 192 queries over 8000 keys) would leave most SMs
idle, each program walking every key alone; there the key walk is split (``SPLITS`` programs per query block, each
over its share of the unmasked blocks, the last also over the diagonal), each writing its unnormalised output and
softmax statistics, which one pass on the host side's tensors combines (flash-decoding's split-KV).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _attend(q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh_off, q_pos, s, end, qk_scale, stride_page, stride_tok,
            D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, MASK: tl.constexpr):
    # one [BN] key block starting at s; m_i is in log2 units (scores already scaled by qk_scale)
    n = s + tl.arange(0, BN)
    d = tl.arange(0, BD)
    if MASK:
        mn = n < end
        page = tl.load(bt_row + n // PAGE, mask=mn, other=0).to(tl.int64)
        kvmask = mn[:, None] & (d < D)[None, :]
    else:
        page = tl.load(bt_row + n // PAGE).to(tl.int64)
        kvmask = (d < D)[None, :]
    kv_off = page * stride_page + (n % PAGE) * stride_tok + kvh_off
    k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=kvmask, other=0.0)  # [BN, BD]
    s_ij = tl.dot(q, tl.trans(k)) * qk_scale  # [BM, BN]
    if MASK:
        s_ij = tl.where(mn[None, :] & (n[None, :] <= q_pos[:, None]), s_ij, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s_ij, axis=1))
    if MASK:
        # rows with nothing allowed yet keep m = -inf; shift by 0 there so exp2 gives 0, not NaN
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_shift = m_new  # every row has a key in an unmasked block
    p = tl.math.exp2(s_ij - m_shift[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=kvmask, other=0.0)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, o_ptr, bt_ptr, cu_ptr, prefix_ptr, qk_scale,
                    sq0, sq1, so0, so1, stride_page, stride_tok, stride_kvh, stride_bt, ml_ptr, n_rows_total,
                    split_keys, G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, SPLITS: tl.constexpr,
                    AUTO: tl.constexpr):
    h = tl.program_id(0)
    mb = tl.num_programs(1) - 1 - tl.program_id(1)
    b = tl.program_id(2) // SPLITS
    j = tl.program_id(2) % SPLITS  # this program's share of the key walk (0 without splits)
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    if mb * BM < q_len:
        prefix = tl.load(prefix_ptr + b)
        i = mb * BM + tl.arange(0, BM)
        mi = i < q_len
        d = tl.arange(0, BD)
        md = d < D
        rows = (q_start + i).to(tl.int64)
        q = tl.load(q_ptr + rows[:, None] * sq0 + h * sq1 + d[None, :], mask=mi[:, None] & md[None, :], other=0.0)
        q_pos = prefix + i  # [BM] cache positions of these queries
        # keys < full are visible to every query of the block (the first sits at prefix + mb*BM); the block's
        # last real query ends the walk
        full = (prefix + mb * BM + 1) // BN * BN
        end = prefix + tl.minimum(q_len, mb * BM + BM)
        bt_row = bt_ptr + b * stride_bt
        kvh_off = (h // G) * stride_kvh
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BD], dtype=tl.float32)
        n_full = full // BN
        shares = SPLITS
        if AUTO:
            # the shares this sequence's cached prefix earns (device data; the grid has SPLITS): the host rule of
            # _choose_splits, one share per split_keys keys; the shares past them walk nothing and store an empty
            # softmax (m = -inf, l = 0, acc = 0), which the merge weighs 0
            shares = tl.minimum(tl.maximum(prefix // split_keys, 1), SPLITS)
            shares = tl.where(prefix < tl.maximum(4 * q_len, 2 * split_keys), 1, shares)
        lo, hi = tl.minimum(j, shares), tl.minimum(j + 1, shares)
        for s in range(n_full * lo // shares * BN, n_full * hi // shares * BN, BN):
            acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh_off, q_pos, s, end, qk_scale,
                                    stride_page, stride_tok, D, PAGE, BN, BD, False)
        # only the last share walks the diagonal blocks (so every row's statistics there are finite)
        for s in range(full + (end - full) * (j != shares - 1).to(tl.int32), end, BN):
            acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh_off, q_pos, s, end, qk_scale,
                                    stride_page, stride_tok, D, PAGE, BN, BD, True)
        if SPLITS == 1:
            o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
            tl.store(o_ptr + rows[:, None] * so0 + h * so1 + d[None, :], o.to(o_ptr.dtype.element_ty),
                     mask=mi[:, None] & md[None, :])
        else:
            # partials [SPLITS, T, nh, D] fp32 in o_ptr, (m, l) [2, SPLITS, T, nh] in ml_ptr
            nh = tl.num_programs(0)
            part = (j * n_rows_total + rows) * nh + h  # [BM]
            tl.store(o_ptr + part[:, None] * D + d[None, :], acc, mask=mi[:, None] & md[None, :])
            tl.store(ml_ptr + part, m_i, mask=mi)
            tl.store(ml_ptr + SPLITS * n_rows_total * nh + part, l_i, mask=mi)


# candidates for 2-byte io on a GPU, timed once per (head dim, GQA group, dtypes) at first use (prefill is never
# graph-captured). (BM, BN, warps, stages), for d=256 on sm_90: 128/64/8: the [128, 256] fp32 accumulator in 128
# registers a thread, K/V double buffers + Q in 192 KB of shared memory (the old fixed choice, 297 TFLOP/s on the
# H200); 128/32/8: 131 KB; 64/32/4: 98 KB and 255 registers, so two programs share an SM and one's softmax overlaps
# the other's MMAs. BN 128 spills at d=256.
_TUNED = [(128, 64, 8, 3), (128, 32, 8, 3), (64, 32, 4, 3), (64, 32, 4, 2)]
_prefill_tuned = triton.autotune([triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=st)
                                  for bm, bn, w, st in _TUNED], key=["D", "G"])(_prefill_kernel)


def _fixed_blocks(BD: int, io_bytes: int) -> tuple[int, int, int, int]:
    """(BM, BN, num_warps, num_stages) without tuning: fp32 io (128-row tiles of it exceed shared memory) and the
    CPU interpreter."""
    if BD <= 128:
        return 64, 64, 4, 3
    return (128, 64, 8, 3) if io_bytes == 2 else (64, 32, 8, 2)


def _choose_splits(q: torch.Tensor, programs: int, max_prefix: int, n_rows: int) -> int:
    """Key-walk shares per query block: enough programs for the SMs when the cached prefix dwarfs the chunk (each
    share at least 1024 keys), else 1."""
    if not q.is_cuda or max_prefix < max(4 * n_rows, 2 * SPLIT_KEYS):
        return 1
    return max(1, min(grid_splits(q, programs), max_prefix // SPLIT_KEYS))


def grid_splits(q: torch.Tensor, programs: int) -> int:
    """The most shares a grid of `programs` query blocks fills the SMs with (1 off CUDA): shapes only, so a
    captured graph's grid; each sequence's own count then comes from its prefix on the device."""
    if not q.is_cuda:
        return 1
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return max(1, min(MAX_SPLITS, sms // programs))


SPLIT_KEYS, MAX_SPLITS = 1024, 8


def prefill_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                      cu_seqlens: torch.Tensor, prefix_lens: torch.Tensor, max_seqlen: int,
                      scale: float | None = None, out: torch.Tensor | None = None, max_prefix: int = 0,
                      splits: int | None = None, device_splits: bool = False,
                      split_keys: int = 0) -> torch.Tensor:
    """Same contract as ``prefill_attention_naive``; ``max_seqlen`` (a host int, the longest chunk) sizes the grid
    so no device value is read back. cu_seqlens [B+1] and prefix_lens [B] are int32 on q's device. ``max_prefix``
    (a host int, the longest cached prefix) lets a short chunk over a long prefix split its key walk; ``splits``
    forces a number of shares (tests). ``device_splits``: no host prefix (a CUDA graph's body): the grid has
    `grid_splits` shares (or ``splits``) and each sequence walks as many as its prefix on the device earns, one per
    ``split_keys`` keys (default `SPLIT_KEYS`; tests pass fewer)."""
    T, nh, D = q.shape
    _, page, nkv, _ = k_pages.shape
    assert nh % nkv == 0 and q.stride(2) == 1 and k_pages.stride() == v_pages.stride() and k_pages.stride(3) == 1
    B = prefix_lens.shape[0]
    scale = D ** -0.5 if scale is None else scale
    out = q.new_empty(T, nh, D) if out is None else out
    BD = triton.next_power_of_2(D)
    args = (q, k_pages, v_pages, out, block_table, cu_seqlens, prefix_lens, scale * LOG2E, q.stride(0), q.stride(1),
            out.stride(0), out.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
            block_table.stride(0))
    dims = dict(G=nh // nkv, D=D, PAGE=page, BD=BD)
    n_rows = max(max_seqlen, 1)
    BM, BN, warps, stages = _fixed_blocks(BD, q.element_size())
    programs = nh * triton.cdiv(n_rows, BM) * B
    if device_splits:
        S = splits or grid_splits(q, programs)
    else:
        S = splits or _choose_splits(q, programs, max_prefix, n_rows)
    dims["split_keys"] = split_keys or SPLIT_KEYS
    if S > 1:  # fixed tiles: no autotuning of this variant in a request's path
        return _split_attention(args, dims, out, S, (BM, BN, warps, stages), (nh, triton.cdiv(n_rows, BM), B),
                                device_splits)
    if q.is_cuda and q.element_size() == 2:
        _prefill_tuned[lambda meta: (nh, triton.cdiv(n_rows, meta["BM"]), B)](*args, out, 0, **dims, SPLITS=1,
                                                                              AUTO=False)
    else:
        _prefill_kernel[(nh, triton.cdiv(n_rows, BM), B)](*args, out, 0, **dims, BM=BM, BN=BN, SPLITS=1,
                                                            AUTO=False, num_warps=warps, num_stages=stages)
    return out


def _split_attention(args: tuple, dims: dict, out: torch.Tensor, S: int, tiles: tuple[int, int, int, int],
                     grid: tuple[int, int, int], auto: bool) -> torch.Tensor:
    """The split key walk: S partial outputs and their (m, l), combined as one softmax."""
    T, nh, D = out.shape
    BM, BN, warps, stages = tiles
    f32 = dict(device=out.device, dtype=torch.float32)
    part = torch.empty(S, T, nh, D, **f32)  # unnormalised outputs
    ml = torch.empty(2, S, T, nh, **f32)  # running max (log2 units) and sum of each share
    args = (*args[:3], part, *args[4:])
    _prefill_kernel[(grid[0], grid[1], grid[2] * S)](*args, ml, T, **dims, BM=BM, BN=BN, SPLITS=S, AUTO=auto,
                                                     num_warps=warps, num_stages=stages)
    m = ml[0].amax(0)  # [T, nh]: finite, the last share saw each row's own key
    w = torch.exp2(ml[0] - m)  # [S, T, nh]; an empty share (m = -inf) weighs 0
    o = (w[..., None] * part).sum(0) / (w * ml[1]).sum(0)[..., None]
    return out.copy_(o)
