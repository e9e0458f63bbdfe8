"""MoE routing and the grouped GEMMs behind the routed experts.

``moe_route``: one program per token does the fp32 softmax over all experts, k rounds of argmax and the top-k
renormalisation. ``moe_align`` (one kernel for decode-sized batches, torch ops beyond; no host sync) sorts the
(token, slot) pairs by expert and pads every expert's group to a multiple of the block, so ``grouped_gemm`` programs
each own one block of pairs of a single expert and stream that expert's weight tile once for all of them.
``moe_experts`` chains the gate_up GEMM with SwiGLU fused into its epilogue (the [pairs, 2I] projection never reaches
memory) -> the down GEMM scaled by the routing weights -> ``_combine_kernel``, which sums each token's k slots in slot
order (deterministic, unlike atomics) and rounds once.

Tiles: decode (at most DECODE_PAIRS pairs) pads groups to 16 rows, prefill to 64 so that tl.dot gets full tiles. On
CUDA the N/K tiles, warps and stages are autotuned per (N, K, pair bucket) at first use: the graph runner's warm-up
reaches every decode bucket before capture, and prefill shares one bucket.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BM = 16  # decode block (pairs per program)
BM_PREFILL = 64
DECODE_PAIRS = 256
_PREFILL_BUCKET = 1 << 16
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# (BN, BK, warps, stages); the first is the interpreter's fixed choice
_TILES = ((64, 64, 4, 3), (32, 128, 4, 4), (64, 128, 4, 3), (32, 256, 4, 3), (128, 64, 8, 3), (128, 64, 4, 4))


@triton.jit
def _route_kernel(logit_ptr, w_ptr, id_ptr, E, stride_l, TOPK: tl.constexpr, RENORM: tl.constexpr,
                  BE: tl.constexpr, BK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BE)
    me = e < E
    x = tl.load(logit_ptr + t * stride_l + e, mask=me, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = tl.where(me, p / tl.sum(p, axis=0), -1.0)
    k = tl.arange(0, BK)
    w_sel = tl.zeros([BK], dtype=tl.float32)
    id_sel = tl.zeros([BK], dtype=tl.int32)
    for j in tl.static_range(TOPK):
        best = tl.max(p, axis=0)
        idx = tl.argmax(p, axis=0)
        w_sel = tl.where(k == j, best, w_sel)
        id_sel = tl.where(k == j, idx.to(tl.int32), id_sel)
        p = tl.where(e == idx, -1.0, p)
    if RENORM:
        w_sel = w_sel / tl.sum(tl.where(k < TOPK, w_sel, 0.0), axis=0)
    tl.store(w_ptr + t * TOPK + k, w_sel, mask=k < TOPK)
    tl.store(id_ptr + t * TOPK + k, id_sel, mask=k < TOPK)


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, bexp_ptr, P, E, max_rows, num_blocks, BLOCK: tl.constexpr, PC: tl.constexpr,
                  NPC: tl.constexpr, BE: tl.constexpr, BR: tl.constexpr, BNB: tl.constexpr):
    # one program does the whole bookkeeping of a decode-sized batch; pairs are visited in chunks of PC so no tile
    # exceeds [PC, BE]
    e = tl.arange(0, BE)
    counts = tl.zeros([BE], dtype=tl.int32)
    for c in tl.static_range(NPC):
        pc = c * PC + tl.arange(0, PC)
        idc = tl.load(ids_ptr + pc, mask=pc < P, other=-1)
        counts += tl.sum((idc[:, None] == e[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK - 1) // BLOCK * BLOCK
    ends = tl.cumsum(padded, axis=0)  # [BE] end row of each expert's group
    starts = ends - padded
    r = tl.arange(0, BR)
    tl.store(sorted_ptr + r, tl.zeros([BR], dtype=tl.int32) + P, mask=r < max_rows)
    # the padding fill above must land before the scatter below overwrites some of the same rows
    tl.debug_barrier()
    for c in tl.static_range(NPC):
        pc = c * PC + tl.arange(0, PC)
        idc = tl.load(ids_ptr + pc, mask=pc < P, other=-1)
        start = tl.sum(tl.where(idc[:, None] == e[None, :], starts[None, :], 0), axis=1)  # [PC]
        # rank among earlier pairs of the same expert keeps the sort stable
        rank = tl.zeros([PC], dtype=tl.int32)
        for c2 in range(0, c + 1):
            qc = c2 * PC + tl.arange(0, PC)
            idq = tl.load(ids_ptr + qc, mask=qc < P, other=-2)
            earlier = (idc[:, None] == idq[None, :]) & (qc[None, :] < pc[:, None])
            rank += tl.sum(earlier.to(tl.int32), axis=1)
        tl.store(sorted_ptr + start + rank, pc, mask=pc < P)
    # block j belongs to the first expert whose group ends after row j * BLOCK (-1 past the last group)
    j = tl.arange(0, BNB)
    done = (ends[None, :] <= (j * BLOCK)[:, None]) & (e < E)[None, :]
    be = tl.sum(done.to(tl.int32), axis=1)
    tl.store(bexp_ptr + j, tl.where(be < E, be, -1), mask=j < num_blocks)


@triton.jit
def _grouped_gemm_kernel(a_ptr, w_ptr, o_ptr, sorted_ptr, bexp_ptr, pw_ptr, N, K, num_pairs, MB, stride_a,
                         stride_we, stride_wn, stride_o, TOPK: tl.constexpr, A_PER_PAIR: tl.constexpr,
                         HAS_PW: tl.constexpr, SWIGLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr):
    # MB (the pair bucket) only keys the autotuner. SWIGLU: w holds [gate (N rows) | up (N rows)] and the program
    # writes silu(gate) * up for its N columns
    pid_m = tl.program_id(0)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    mn = n < N
    e = tl.load(bexp_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ptr + pid_m * BM + tl.arange(0, BM))  # [BM] flat (token, slot) ids; padding = num_pairs
    valid = pairs < num_pairs
    # gate_up reads the token's row, down reads the pair's own activation row
    rows = (pairs if A_PER_PAIR else pairs // TOPK).to(tl.int64)
    kk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc_up = tl.zeros([BM, BN], dtype=tl.float32)
    k_end = tl.where(e >= 0, K, 0)  # blocks past the last expert group do no work
    w_rows = w_ptr + e * stride_we + n[:, None] * stride_wn
    for k0 in range(0, k_end, BK):
        mk = k0 + kk < K
        a = tl.load(a_ptr + rows[:, None] * stride_a + (k0 + kk)[None, :], mask=valid[:, None] & mk[None, :],
                    other=0.0)
        wm = mn[:, None] & mk[None, :]
        acc += tl.dot(a, tl.trans(tl.load(w_rows + (k0 + kk)[None, :], mask=wm, other=0.0)))
        if SWIGLU:
            w_up = tl.load(w_rows + N * stride_wn + (k0 + kk)[None, :], mask=wm, other=0.0)
            acc_up += tl.dot(a, tl.trans(w_up))
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc_up
    if HAS_PW:
        acc *= tl.load(pw_ptr + pairs, mask=valid, other=0.0)[:, None]
    tl.store(o_ptr + pairs.to(tl.int64)[:, None] * stride_o + n[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=valid[:, None] & mn[None, :])


@triton.jit
def _combine_kernel(y_ptr, o_ptr, H, TOPK: tl.constexpr, BH: tl.constexpr):
    # out[t] = sum_j y[t * k + j] in slot order: y [T*k, H] fp32 -> o [T, H]
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    mh = h < H
    acc = tl.zeros([BH], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(y_ptr + (t * TOPK + j) * H + h, mask=mh, other=0.0)
    tl.store(o_ptr + t * H + h, acc.to(o_ptr.dtype.element_ty), mask=mh)


if _INTERPRET:
    _grouped_gemm = _grouped_gemm_kernel
else:
    _grouped_gemm = triton.autotune([triton.Config({"BN": bn, "BK": bk}, num_warps=w, num_stages=st)
                                     for bn, bk, w, st in _TILES], key=["N", "K", "MB", "SWIGLU"])(_grouped_gemm_kernel)


def moe_route(logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int32), highest probability first."""
    T, E = logits.shape
    assert logits.stride(1) == 1
    w = torch.empty(T, top_k, device=logits.device, dtype=torch.float32)
    ids = torch.empty(T, top_k, device=logits.device, dtype=torch.int32)
    _route_kernel[(T,)](logits, w, ids, E, logits.stride(0), TOPK=top_k, RENORM=renormalize,
                        BE=triton.next_power_of_2(E), BK=triton.next_power_of_2(top_k))
    return w, ids


def moe_align(ids: torch.Tensor, num_experts: int, block: int = BM) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort the flat (token, slot) pairs of ids [T, k] by expert, each expert's group padded to ``block`` rows.

    Returns (sorted_pairs [max_rows] int32, padding = T*k; block_expert [max_rows/block] int32, -1 past the last
    group). Sizes depend only on T*k, so no device value is read back (CUDA-graph safe). Decode-sized batches
    (T*k <= 256) take one kernel launch; larger ones a few torch ops, whose launch cost a prefill amortises.
    """
    P = ids.numel()
    max_rows = triton.cdiv(P + min(num_experts, P) * (block - 1), block) * block
    if P > 256:
        return _moe_align_torch(ids, num_experts, block, max_rows)
    assert ids.dtype == torch.int32 and ids.is_contiguous()
    sorted_pairs = torch.empty(max_rows, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(max_rows // block, dtype=torch.int32, device=ids.device)
    PC = 32
    _align_kernel[(1,)](ids, sorted_pairs, block_expert, P, num_experts, max_rows, max_rows // block, BLOCK=block,
                        PC=PC, NPC=triton.cdiv(P, PC), BE=triton.next_power_of_2(num_experts),
                        BR=triton.next_power_of_2(max_rows), BNB=triton.next_power_of_2(max_rows // block),
                        num_warps=8)
    return sorted_pairs, block_expert


def _moe_align_torch(ids: torch.Tensor, num_experts: int, block: int,
                     max_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = ids.flatten().long()
    P = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    ends = padded.cumsum(0)  # [E] end row of each expert's group
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    rank = torch.arange(P, device=ids.device) - (counts.cumsum(0) - counts)[by_expert]
    sorted_pairs = torch.full((max_rows,), P, dtype=torch.int32, device=ids.device)
    sorted_pairs.scatter_(0, (ends - padded)[by_expert] + rank, order.to(torch.int32))
    starts = torch.arange(0, max_rows, block, device=ids.device)
    block_expert = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_pairs, block_expert


def pair_block(num_pairs: int) -> int:
    """Rows per grouped-GEMM program: 16 keeps decode's padding small, 64 gives prefill full tensor-core tiles."""
    return BM if num_pairs <= DECODE_PAIRS else BM_PREFILL


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor,
                 top_k: int, a_per_pair: bool, pair_weights: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None, swiglu: bool = False) -> torch.Tensor:
    """out[p] = w[expert(p)] @ a[row(p)] for every (token, slot) pair p, row(p) = p if ``a_per_pair`` else
    p // top_k; optionally scaled by pair_weights [T*k]. a [rows, K]; w [E, N, K]. Returns [T*k, N], or with
    ``swiglu`` (w = [gate | up] rows, N even) silu(gate) * up [T*k, N/2]. sorted_pairs/block_expert come from
    ``moe_align`` with ``pair_block(T*k)`` rows per block."""
    E, N, K = w.shape
    assert a.stride(1) == 1 and w.stride(2) == 1
    num_pairs = a.shape[0] if a_per_pair else a.shape[0] * top_k
    n_out = N // 2 if swiglu else N
    out = torch.empty(num_pairs, n_out, device=a.device, dtype=out_dtype or a.dtype)
    block = pair_block(num_pairs)
    pw = pair_weights if pair_weights is not None else out
    bucket = triton.next_power_of_2(num_pairs) if num_pairs <= DECODE_PAIRS else _PREFILL_BUCKET
    fixed = dict(BN=_TILES[0][0], BK=_TILES[0][1]) if _INTERPRET else {}
    grid = (block_expert.numel(), triton.cdiv(n_out, fixed.get("BN", 1))) if _INTERPRET else \
        (lambda meta: (block_expert.numel(), triton.cdiv(n_out, meta["BN"])))
    _grouped_gemm[grid](a, w, out, sorted_pairs, block_expert, pw, n_out, K, num_pairs, bucket, a.stride(0),
                        w.stride(0), w.stride(1), out.stride(0), TOPK=top_k, A_PER_PAIR=a_per_pair,
                        HAS_PW=pair_weights is not None, SWIGLU=swiglu, BM=block, **fixed)
    return out


def moe_experts(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor) -> torch.Tensor:
    """Same contract as ``moe_experts_naive``: x [T, H] -> [T, H] in x's dtype."""
    T, k = ids.shape
    H = w_down.shape[1]
    sorted_pairs, block_expert = moe_align(ids, w_gate_up.shape[0], pair_block(T * k))
    act = grouped_gemm(x, w_gate_up, sorted_pairs, block_expert, k, a_per_pair=False, swiglu=True)  # [T*k, I]
    y = grouped_gemm(act, w_down, sorted_pairs, block_expert, k, a_per_pair=True,
                     pair_weights=weights.flatten(), out_dtype=torch.float32)  # [T*k, H]
    out = torch.empty(T, H, device=x.device, dtype=x.dtype)
    BH = min(1024, triton.next_power_of_2(H))
    _combine_kernel[(T, triton.cdiv(H, BH))](y, out, H, TOPK=k, BH=BH)
    return out
