"""The op table the fast model calls, chosen once at construction: the Triton kernels (the fast path) or the ops'
``naive.py`` references behind the same signatures (a debugging path, and the way to run the model in bf16 on a
CPU, where the Triton interpreter's bf16 ``tl.dot`` is wrong; ecosystem-notes.md section 7).

Each backend imports its implementation lazily, so the naive table never imports Triton.

Quantized weights (``ninfer.fast.ops.qlinear.QuantWeight``) take the same entries: ``linear`` runs the quantized
GEMV at decode row counts, the FP8 block-scaled GEMM with 8-bit activations where every Use of the weight allows A8,
and dequantize-then-GEMM otherwise; ``moe_experts`` takes quantized expert stacks; a ``Segments`` projection runs
its parts one by one (docs/quantization.md, "fast Program").

The residual stream between sublayers is a ``Residual``: ``norm_linear`` (and its SwiGLU form) norms it into a
projection, ``linear_residual`` adds a sublayer's output projection to it. With the "triton-fused" table, where the
decode GEMV runs those projections the norm sits in its prologue and the add in its epilogue (one launch each
instead of a norm, a GEMV and an add); elsewhere, and in the default "triton" table, the output waits in
``Residual.delta`` for the next norm, the fused add + RMSNorm kernel. ``moe_block`` is the MoE block after the router:
over dense experts the ``moe_decode`` op's two launches, which add the block to ``Residual.h`` in their epilogue, in
the default table at one row (where it measured faster) and in "triton-fused" at every decode row count; elsewhere
route, experts, the shared expert and its gate, output in ``delta``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class Residual:
    """The residual stream h [T, H], updated in place, and ``delta``: the last sublayer's output where no GEMV
    epilogue added it (cuBLAS shapes, MoE blocks, quantized weights), which the next norm adds."""
    h: torch.Tensor
    delta: torch.Tensor | None = None

    def value(self) -> torch.Tensor:
        """h + delta as a new tensor (the later sublayers update h in place)."""
        return self.h.clone() if self.delta is None else self.h + self.delta


@dataclass(frozen=True)
class Kernels:
    name: str
    # (x, weight, eps, residual | None) -> (y, h); h may be ``residual`` updated in place
    rmsnorm: Callable
    # x [T, 2I] = [gate | up] -> [T, I]
    swiglu: Callable
    # (q, k, v, positions, slot_mapping, k_pages, v_pages, rotary_dim, theta, q_norm_w, k_norm_w, eps) -> rotated q
    rope_kv_write: Callable
    # same arguments as gdn_decode_naive -> y [B, HV*dv]; conv/ssm slots updated in place
    gdn_decode: Callable
    # (m [T, C], window [C, K-1] updated in place, conv_weight, length=None) -> out [T, C]
    gdn_conv_prefill: Callable
    # same arguments as gdn_chunk_naive (length, final_state included) -> (y, states)
    gdn_chunk: Callable
    # (q, k_pages, v_pages, block_table, context_lens, first_keys=None, gate=None) -> [B, nh, d]
    paged_decode_attention: Callable
    # (q, k_pages, v_pages, block_table, cu_seqlens, prefix_lens, max_seqlen, max_prefix, device_splits) -> [T, nh, d]
    prefill_attention: Callable
    # (logits [T, E], top_k, renormalize) -> (weights fp32, ids int32)
    moe_route: Callable
    # (x, w_gate_up, w_down, weights, ids) -> [T, H]
    moe_experts: Callable
    # (x [T, K], w [N, K]) -> [T, N]: F.linear without bias
    linear: Callable
    # (x [T, K], w [2I, K] = [gate | up]) -> silu(gate) * up [T, I]
    linear_swiglu: Callable
    # (pool [L, S, ...], src [B], dst [B], dst_offset) -> None: pool[:, dst_offset + dst[b]] = pool[:, src[b]]
    slot_copy: Callable
    # (x [N, H], dyn [N, taps, G], base [taps, H], block) -> [N, H]: DFlash2's convolution over packed blocks
    dflash_conv: Callable
    # (unary [R, K], cand [R, K], proj [R, r], prev [R], pred [V, r], succ [V, r]) -> fp32 [R, K]: a selector step
    dflash_select: Callable
    # (unary, cand [R, k, K], proj [R, k, r], anchor [R], pred, succ [V, r], room [R] int32, drafts, num) ->
    # (drafts [R, k], num [R]): the greedy selector walk over a whole block (a lean greedy round's draws)
    dflash_walk: Callable
    # (res, norm_w, eps) -> rmsnorm(h + delta) [T, H]; the sum becomes res.h
    norm: Callable
    # (res, norm_w, eps, w [N, H]) -> norm(res) @ w^T [T, N]
    norm_linear: Callable
    # (res, norm_w, eps, w [2I, H] = [gate | up]) -> swiglu(norm(res) @ w^T) [T, I]
    norm_linear_swiglu: Callable
    # (x [T, K], w [H, K], res) -> None: res gains x @ w^T (in res.h, or as res.delta)
    linear_residual: Callable
    # (block_tables [R, P], rows [B], positions [B], page_size) -> (table [B, P] int32, slot_mapping [B] int64)
    decode_slots: Callable
    # same arguments as draft_start_naive: the MTP draft's private tables, scratch pages and seeded chain
    draft_start: Callable
    # (y [T, H], logits [T, E (+1)], w_gate_up, w_down, shared_gate_up | None, shared_down | None, top_k,
    #  renormalize, res) -> None: res gains the MoE block's output (routed experts + gated shared expert)
    moe_block: Callable
    # same arguments as gdn_verify_naive: the verify pass's GDN recurrence over whole blocks (None: ``gdn_decode``
    # once per block position)
    gdn_verify: Callable | None = None


# decode-sized row counts (measured against cuBLAS at 1 and 8 rows) stream the weight through the GEMV kernel;
# larger ones are GEMMs for cuBLAS
_GEMV_ROWS = 8
# every dense decode projection through the GEMV instead of cuBLAS (opt-in, for the A/B of an all-Triton decode step,
# whose launches chain by PDL where cuBLAS's do not: bench_quant.py's "allgemv" form; nineteenth session, unmeasured)
GEMV_EVERY_PROJECTION = False


def unfused_moe_block(route: Callable, experts: Callable, linear: Callable, linear_swiglu: Callable) -> Callable:
    """The MoE block from its ops: route, the routed experts, the shared expert's two projections and its sigmoid
    gate; the output waits in ``res.delta`` for the next norm."""
    def block(y, logits, w_gate_up, w_down, shared_gate_up, shared_down, top_k, renormalize, res):
        E = logits.shape[1] - (shared_gate_up is not None)
        weights, ids = route(logits[:, :E], top_k, renormalize)
        out = experts(y, w_gate_up, w_down, weights, ids)
        if shared_gate_up is not None:
            shared = linear(linear_swiglu(y, shared_gate_up), shared_down)
            out = out + torch.sigmoid(logits[:, E:]) * shared
        res.delta = out
    return block


def _stream_norm(rmsnorm: Callable) -> Callable:
    def norm(res: Residual, weight, eps):
        if res.delta is None:
            return rmsnorm(res.h, weight, eps)[0]
        y, res.h = rmsnorm(res.delta, weight, eps, res.h)
        res.delta = None
        return y
    return norm


def triton_kernels(fused_decode: bool = False) -> Kernels:
    """The fast path's op table. ``fused_decode`` ("triton-fused") takes the GEMVs with the RMSNorm in their prologue
    and the residual add in their epilogue where the shape rules below pick them; off (the default "triton"), every
    norm is the add + RMSNorm kernel and every projection the plain GEMV or cuBLAS. The fused forms are opt-in
    because on the H200 they slowed the 0.8B executor step at B=1 from 1.14 to 1.91 ms (docs/performance.md, fourth
    session) and no measurement yet says which pair lost; ``bench_fast.py --kernels triton,triton-fused`` (run.sh
    micro) times both in one call so the rules can be set per shape. The MoE block over dense experts is
    ``moe_decode`` at one row in both tables, and in "triton-fused" at every decode row count."""
    from ninfer.fast.ops import (decode_slots, draft_start, gdn_chunk, gdn_decode, gemv, moe, moe_decode,
                                 paged_decode_attention, prefill_attention, rmsnorm, rope_kv_write, slot_copy, swiglu)
    from ninfer.fast.ops.dflash_conv import dflash_conv
    from ninfer.fast.ops.dflash_select import dflash_select
    from ninfer.fast.ops.dflash_walk import dflash_walk
    from ninfer.fast.ops.fp8_gemm.triton import fp8_gemm
    from ninfer.fast.ops.qlinear import QuantWeight, Segments
    from ninfer.fast.ops.qlinear import triton as qlinear
    from ninfer.fast.ops.qlinear.layout import a8_block
    from ninfer.fast.ops.qmoe.triton import qmoe_experts

    def norm(x, weight, eps, residual=None):
        # the residual stream is updated in place: one buffer per step instead of one per layer
        return rmsnorm.rmsnorm(x, weight, eps, residual=residual, residual_out=residual)

    def conv_prefill(m, window, conv_weight, length=None):
        return gdn_chunk.gdn_conv_prefill(m, window, conv_weight, window_out=window, length=length)[0]

    def linear(x, w):
        if isinstance(w, QuantWeight):
            if x.shape[0] > _GEMV_ROWS and a8_block(w) is not None:
                return fp8_gemm(x, w)
            return qlinear.qgemv(x, w) if x.shape[0] <= _GEMV_ROWS else qlinear.qlinear(x, w)
        if isinstance(w, Segments):
            return torch.cat([linear(x, p) for p in w.parts], dim=-1)
        return gemv.gemv(x, w) if _gemv_wins(x, w, fused=False) else F.linear(x, w)

    def linear_swiglu(x, w):
        if isinstance(w, QuantWeight) and x.shape[0] <= _GEMV_ROWS:
            return qlinear.qgemv(x, w, swiglu=True)
        if isinstance(w, (QuantWeight, Segments)):
            return swiglu.swiglu(linear(x, w))
        return gemv.gemv_swiglu(x, w) if _gemv_wins(x, w, fused=True) else swiglu.swiglu(F.linear(x, w))

    def experts(x, w_gate_up, w_down, weights, ids):
        if isinstance(w_gate_up, QuantWeight) or isinstance(w_down, QuantWeight):
            return qmoe_experts(x, w_gate_up, w_down, weights, ids)
        return moe.moe_experts(x, w_gate_up, w_down, weights, ids)

    stream_norm = _stream_norm(norm)

    def norm_linear(res, weight, eps, w):
        if fused_decode and res.delta is None and _norm_gemv_wins(res.h, w):
            return gemv.gemv(res.h, w, norm_weight=weight, eps=eps)
        return linear(stream_norm(res, weight, eps), w)

    def norm_linear_swiglu(res, weight, eps, w):
        if fused_decode and res.delta is None and isinstance(w, torch.Tensor) and _gemv_wins(res.h, w, fused=True):
            return gemv.gemv_swiglu(res.h, w, norm_weight=weight, eps=eps)
        return linear_swiglu(stream_norm(res, weight, eps), w)

    def linear_residual(x, w, res):
        assert res.delta is None, "linear_residual: the stream's last output was never added"
        if fused_decode and _residual_gemv_wins(x, w):
            gemv.gemv(x, w, out=res.h, residual=res.h)
        else:
            res.delta = linear(x, w)

    unfused_moe = unfused_moe_block(moe.moe_route, experts, linear, linear_swiglu)
    moe_decode_rows = moe_decode.MAX_ROWS if fused_decode else _MOE_DECODE_ROWS

    def moe_block(y, logits, w_gate_up, w_down, shared_gate_up, shared_down, top_k, renormalize, res):
        if not _moe_decode_applies(y, w_gate_up, w_down, shared_gate_up, shared_down, moe_decode_rows):
            return unfused_moe(y, logits, w_gate_up, w_down, shared_gate_up, shared_down, top_k, renormalize, res)
        assert res.delta is None, "moe_block: the stream's last output was never added"
        # two launches, the block added to the stream in the down kernel's epilogue (the next norm can then go
        # into its GEMV's prologue)
        moe_decode.moe_decode(y, logits, w_gate_up, w_down, top_k, renormalize, shared_gate_up, shared_down,
                              residual=res.h)

    return Kernels("triton-fused" if fused_decode else "triton", norm, swiglu.swiglu, rope_kv_write.rope_kv_write,
                   gdn_decode.gdn_decode, conv_prefill, gdn_chunk.gdn_chunk,
                   paged_decode_attention.paged_decode_attention, prefill_attention.prefill_attention, moe.moe_route, experts, linear, linear_swiglu,
                   slot_copy.slot_copy, dflash_conv, dflash_select, dflash_walk, stream_norm, norm_linear,
                   norm_linear_swiglu,
                   linear_residual, decode_slots.decode_slots, draft_start.draft_start, moe_block,
                   gdn_verify=_gdn_verify() if GDN_BLOCK_VERIFY else None)


# the rows up to which the default table's MoE block is ``moe_decode``: measured on the H100 at 35B-A3B per block in
# a CUDA graph (bench_moe.py, docs/performance.md), B = 1 33.1 us against today's 47.2, B = 2 73.7 against 63.6
# (every swept configuration slower still); B = 4 and 8 not measured yet
_MOE_DECODE_ROWS = 1
# FP8 expert stacks through ``moe_decode`` (their bytes as stored, scales applied per tile) instead of ``qmoe``'s
# per-pair GEMVs and separate router, shared expert and combine: 35B-A3B FP8 decode through the Engine at B = 1 3.74
# ms against qmoe's 4.75 (bf16 3.67; B = 2..8 equal within 1%; sixteenth session, H100, one call). bench_quant.py's
# recipe "fp8:qmoe" turns it off for its build
FP8_MOE_DECODE = True
# the verify pass's GDN recurrence in one launch a layer over whole blocks (``gdn_verify``) instead of ``gdn_decode``
# once per block position: the 9B MTP verify graph (k = 3, H100, fifteenth session, one warm machine) 7.11 / 7.07 /
# 7.63 / 8.13 ms at B = 1 / 2 / 4 / 8 against 7.30 / 7.31 / 7.61 / 8.36, the replay graph 6.95 against 7.11.
# bench_spec.py's --gdn-verify positions (run.sh GDN_VERIFY=positions) builds with it off, for the A/B
GDN_BLOCK_VERIFY = True


def _gdn_verify() -> Callable:
    from ninfer.fast.ops.gdn_verify import gdn_verify  # the op table's ops load with the table

    return gdn_verify


def _moe_decode_applies(y, w_gate_up, w_down, shared_gate_up, shared_down, max_rows: int) -> bool:
    """The fused MoE block (``moe_decode``) takes at most ``max_rows`` rows (the default table 1, "triton-fused" up
    to the op's 8, so that its step measures the rest) over dense expert stacks (and a dense shared expert, or none)
    of one dtype, or with ``FP8_MOE_DECODE`` FP8 stacks of one block (``moe_decode.fp8_stacks``); other quantized
    experts keep the ``qmoe`` path. The rule is on shapes only, so each exact-B graph keeps its path."""
    parts = [w_gate_up, w_down] + ([] if shared_gate_up is None else [shared_gate_up, shared_down])
    if y.shape[0] > max_rows:
        return False
    if all(isinstance(p, torch.Tensor) for p in parts):
        return len({p.dtype for p in parts}) == 1
    if not FP8_MOE_DECODE:
        return False
    from ninfer.fast.ops.moe_decode.triton import fp8_stacks  # the op table's ops load with the table

    return fp8_stacks(*parts)


def _gemv_wins(x, w, fused: bool) -> bool:
    """Where the decode GEMV beats cuBLAS inside the model, from shapes alone (so a captured graph stays valid).
    Measured on the H200 (docs/performance.md): cuBLAS streams large weights at ~4.2 TB/s and wins every projection
    whose output has more than 1024 rows, but picks slow GEMV-shaped kernels plus a split-K reduce for narrow
    outputs (N <= 1024: 5 us against 7-12 us at 4-7 MB) and for the gate_up projections up to ~16 MB, where the
    GEMV also fuses SwiGLU. Below ~2 MB neither streams and cuBLAS's lighter launch wins."""
    if x.shape[0] > _GEMV_ROWS:
        return False
    if GEMV_EVERY_PROJECTION:
        return True
    size = w.numel() * w.element_size()
    if fused:
        return size <= 16 << 20
    return w.shape[0] <= 1024 and size >= 2 << 20


def _residual_gemv_wins(x, w) -> bool:
    """Where the GEMV adding the residual in its epilogue beats the projection alone: where it wins bare, and below
    2 MB, where both are launch-bound and the add it takes lets the next sublayer's norm move into that one's GEMV
    prologue (a whole norm launch saved)."""
    if not isinstance(w, torch.Tensor) or x.shape[0] > _GEMV_ROWS:
        return False
    return _gemv_wins(x, w, fused=False) or w.numel() * w.element_size() < 2 << 20


def _norm_gemv_wins(x, w) -> bool:
    """Where the GEMV with the RMSNorm in its prologue beats a norm launch plus the projection. Estimated from the
    H200's GEMV table (docs/performance.md): at M = 1 the GEMV trails cuBLAS by ~0.1 us per MB on wide outputs
    (0.8B in_proj, 16.8 MB: 8.3 against 6.5 us), and the norm it saves costs ~2 us plus a launch gap, so wide
    projections up to 24 MB (the 0.8B class) take the GEMV and the 9B class (84 MB and more) stays on cuBLAS."""
    if not isinstance(w, torch.Tensor) or x.shape[0] > _GEMV_ROWS:
        return False
    return _gemv_wins(x, w, fused=False) or w.numel() * w.element_size() <= 24 << 20


def naive_kernels() -> Kernels:
    from ninfer.fast.ops.dflash_conv.naive import dflash_conv_naive
    from ninfer.fast.ops.decode_slots.naive import decode_slots_naive
    from ninfer.fast.ops.draft_start.naive import draft_start_naive
    from ninfer.fast.ops.dflash_select.naive import dflash_select_naive
    from ninfer.fast.ops.dflash_walk.naive import dflash_walk_naive
    from ninfer.fast.ops.gdn_chunk.naive import gdn_chunk_naive, gdn_conv_prefill_naive
    from ninfer.fast.ops.gdn_decode.naive import gdn_decode_naive
    from ninfer.fast.ops.gdn_verify.naive import gdn_verify_naive
    from ninfer.fast.ops.moe.naive import moe_experts_naive, moe_route_naive
    from ninfer.fast.ops.paged_decode_attention.naive import paged_decode_attention_naive
    from ninfer.fast.ops.prefill_attention.naive import prefill_attention_naive
    from ninfer.fast.ops.qlinear import QuantWeight, Segments, dequantize_naive, qlinear_a8_naive, qlinear_naive
    from ninfer.fast.ops.qlinear.layout import a8_block
    from ninfer.fast.ops.rmsnorm.naive import rmsnorm_naive
    from ninfer.fast.ops.rope_kv_write.naive import rope_kv_write_naive
    from ninfer.fast.ops.slot_copy.naive import slot_copy_naive
    from ninfer.fast.ops.swiglu.naive import swiglu_naive

    def conv_prefill(m, window, conv_weight, length=None):
        out, new_window = gdn_conv_prefill_naive(m, window, conv_weight, length)
        window.copy_(new_window)
        return out

    def prefill_attn(q, k_pages, v_pages, block_table, cu_seqlens, prefix_lens, max_seqlen, max_prefix=0,
                     device_splits=False):
        return prefill_attention_naive(q, k_pages, v_pages, block_table, cu_seqlens, prefix_lens)

    def linear(x, w):
        if isinstance(w, QuantWeight):
            # the A8 form where the triton table takes it (prefill rows, an FP8 weight every Use allows A8 for)
            a8 = x.shape[0] > _GEMV_ROWS and a8_block(w) is not None
            return qlinear_a8_naive(x, w) if a8 else qlinear_naive(x, w)
        if isinstance(w, Segments):
            return torch.cat([linear(x, p) for p in w.parts], dim=-1)
        return F.linear(x, w)

    def linear_swiglu(x, w):
        return swiglu_naive(linear(x, w))

    def experts(x, w_gate_up, w_down, weights, ids):
        def dense(w):
            return dequantize_naive(w) if isinstance(w, QuantWeight) else w
        return moe_experts_naive(x, dense(w_gate_up), dense(w_down), weights, ids)

    stream_norm = _stream_norm(rmsnorm_naive)

    def linear_residual(x, w, res):
        assert res.delta is None, "linear_residual: the stream's last output was never added"
        res.delta = linear(x, w)

    return Kernels("naive", rmsnorm_naive, swiglu_naive, rope_kv_write_naive, gdn_decode_naive, conv_prefill,
                   gdn_chunk_naive, paged_decode_attention_naive, prefill_attn, moe_route_naive, experts,
                   linear, linear_swiglu, slot_copy_naive, dflash_conv_naive, dflash_select_naive,
                   dflash_walk_naive, stream_norm,
                   lambda res, weight, eps, w: linear(stream_norm(res, weight, eps), w),
                   lambda res, weight, eps, w: linear_swiglu(stream_norm(res, weight, eps), w), linear_residual,
                   decode_slots_naive, draft_start_naive,
                   unfused_moe_block(moe_route_naive, experts, linear, linear_swiglu),
                   gdn_verify=gdn_verify_naive)


def get_kernels(name: str) -> Kernels:
    if name in ("triton", "triton-fused"):
        return triton_kernels(fused_decode=name == "triton-fused")
    if name == "naive":
        return naive_kernels()
    raise ValueError(f"unknown kernel backend {name!r}; expected 'triton', 'triton-fused' or 'naive'")
