"""Sublayer forwards of the fast model: the two mixers against the paged KV pool and the GDN state slots, in a
decode form (one token for each of B sequences) and a prefill form (T tokens of one sequence), and the FFNs.

Shape-only host logic: nothing here reads a device value back, so a decode step can be captured in a CUDA graph.
Every op, GEMMs included, is one of the ``Kernels``: ``k.linear`` streams the weight with the GEMV kernel at
decode row counts and hands larger ones to cuBLAS. Each sublayer reads the residual stream through its input norm
(``k.norm_linear``: the norm in the GEMV prologue where it can) and adds its output projection to it
(``k.linear_residual``: in the GEMV epilogue where it can), so a decode sublayer has no norm or add launch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ninfer.fast.ops.gdn_chunk.naive import chunk_ends, conv_window_at
from ninfer.models.qwen3_5.config import Qwen35Config

from .kernels import Kernels, Residual
from .weights import AttnWeights, FfnWeights, GdnWeights


@dataclass
class StepInputs:
    """Per-call addressing shared by all layers of one forward. Decode: T = B rows, one per sequence. Prefill:
    T tokens of one sequence, ``slot_ids`` = [slot] and ``block_table`` = [1, max_pages]. Multi-query decode
    (``FastModel.verify``): the blocks of B sequences packed along T (``cu_seqlens`` [B+1], ``prefix_lens`` [B] =
    the frontiers), the GDN recurrence stepped over ``gdn_steps``, each step reading one state slot per block and
    writing another (the verify pass keeps every block position's state) or the same one. A padded prefill piece
    (``FastModel.prefill_piece``, a CUDA graph's body): T rows of a bucket, the first ``length`` real, and every
    quantity that depends on the request (slot, table row, positions, the prefix attention sees, the length) device
    data. A mixed pass (``FastModel.mixed``): B decode rows (``decode_rows``), then a prefill piece's rows, packed
    as multi-query decode packs its blocks."""
    positions: torch.Tensor  # [T] int32 absolute positions
    slot_mapping: torch.Tensor  # [T] flat KV slot (page * page_size + offset) of every token
    slot_ids: torch.Tensor  # [B] int32 GDN state slots
    block_table: torch.Tensor  # [B, max_pages] int32
    context_lens: torch.Tensor | None = None  # decode: [B] keys per sequence, the current token included
    cu_seqlens: torch.Tensor | None = None  # prefill: [2] int32
    prefix_lens: torch.Tensor | None = None  # prefill: [1] int32, tokens already cached
    prefill_slot: int | None = None  # prefill: the sequence's GDN slot as a host int
    # prefill: (offset 0 < o < T, slot) of each checkpoint inside the piece, whose GDN state goes into that slot
    captures: tuple[tuple[int, int], ...] = ()
    max_prefix: int = 0  # prefill / multi-query decode: the longest cached prefix (host int: attention's key split)
    # multi-query decode: step j of every block still that long, as (token rows [b_j] long, the slots they read
    # [b_j] int32, the slots the stepped state goes to [b_j] int32)
    gdn_steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
    # multi-query decode: [W, >= B] int32, the slot step j of block b leaves its state in (-1: none, or past the
    # block), for the kernel table's ``gdn_verify`` (the blocks' token rows from ``cu_seqlens``, step 0 reading
    # ``slot_ids``)
    gdn_outs: torch.Tensor | None = None
    # rotary positions where they are not ``positions`` (the KV addressing): [3, T] MRoPE rows of a prompt with
    # images, or [T] int32 after one (position + rope_delta, MRoPE's three rows equal: plain RoPE)
    rope_positions: torch.Tensor | None = None
    # decode: [B] int32 the first key each row attends to (None: key 0), the MTP layer's pages hold no key at 0
    first_keys: torch.Tensor | None = None
    # padded prefill: [1] int32 real rows of the piece (a device value); padding rows write no KV (slot -1), leave
    # the GDN state and conv window alone and are never read by a real row
    length: torch.Tensor | None = None
    # a mixed pass (``FastModel.mixed``, ``mixed_piece``): [B] long, the first B rows, one token of each sequence
    # at ``slot_ids[:B]``; the rows after them are the piece of the sequence at ``slot_ids[B]`` (``prefill_slot``
    # too where host-known; ``length`` where padded)
    decode_rows: torch.Tensor | None = None

    @property
    def is_prefill(self) -> bool:
        return self.prefill_slot is not None or self.length is not None


GDN_CHUNK = 64  # the ops' default chunk size: the grid their chunk states sit on


def head_logits(hidden: torch.Tensor, lm_head: torch.Tensor, draft_vocab: int | None = None) -> torch.Tensor:
    """hidden [N, H] through a dense lm_head [V, H]: fp32 logits [N, V]. With `draft_vocab` (a draft's, below V)
    only its first rows are read, and the ids past it are -inf: `ninfer.sampling.draft_vocabulary`'s logits
    without the other rows' bytes."""
    if draft_vocab is None:
        return F.linear(hidden, lm_head).float()
    return past_draft_vocab(F.linear(hidden, lm_head[:draft_vocab]).float(), lm_head.shape[0])


def past_draft_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A draft head's logits [N, draft_vocab] widened to [N, vocab_size], the ids past the draft vocabulary -inf."""
    return F.pad(logits, (0, vocab_size - logits.shape[-1]), value=float("-inf"))


def _split_gdn(proj: torch.Tensor, cfg: Qwen35Config):
    # proj [T, C + HV*dv + 2*HV] -> column views mixed [T, C], z [T, HV*dv], b [T, HV], a [T, HV]
    C, Vd, HV = cfg.conv_dim, cfg.linear_value_dim, cfg.linear_num_value_heads
    return proj[:, :C], proj[:, C:C + Vd], proj[:, C + Vd:C + Vd + HV], proj[:, C + Vd + HV:]


def gdn_mixer(k: Kernels, cfg: Qwen35Config, w: GdnWeights, res: Residual, norm: torch.Tensor, conv: torch.Tensor,
              ssm: torch.Tensor, step: StepInputs) -> None:
    """Reads the stream [T, H] through the input norm (weight ``norm``) and adds the mixer's output to it; conv
    [slots+1, C, K-1] and ssm [slots+1, HV, dk, dv] are this layer's state slots, updated in place."""
    mixed, z, b, a = _split_gdn(k.norm_linear(res, norm, cfg.rms_norm_eps, w.in_proj), cfg)
    dims = dict(num_k_heads=cfg.linear_num_key_heads, head_k_dim=cfg.linear_key_head_dim,
                head_v_dim=cfg.linear_value_head_dim, eps=cfg.rms_norm_eps)
    if step.gdn_steps is not None:
        # the decode recurrence, one step of every block at a time: a verified block equals its tokens decoded one
        # by one (the projections above and below still run once over all T rows). Zeroed: the verify graphs' pad
        # rows outside every step stay zero instead of carrying NaN garbage into the FFN and the MoE router
        out = mixed.new_zeros(mixed.shape[0], cfg.linear_value_dim)  # [T, HV*dv]
        if k.gdn_verify is not None and step.gdn_outs is not None:  # whole blocks, one launch
            B = step.slot_ids.shape[0]
            k.gdn_verify(mixed, z, a, b, conv, w.conv, w.A_log, w.dt_bias, w.norm, ssm, step.slot_ids,
                         step.cu_seqlens[:B + 1], step.gdn_outs, **dims, out=out)
        else:
            for rows, slots, outs in step.gdn_steps:  # each step reads and writes its token rows in place
                k.gdn_decode(mixed, z, a, b, conv, w.conv, w.A_log, w.dt_bias, w.norm, ssm, slots, **dims,
                             out_slot_ids=outs, rows=rows, out=out)
        return k.linear_residual(out, w.out_proj, res)
    if step.decode_rows is not None:
        # a mixed pass: the decode rows [:B] by the recurrence on their slots, the piece [B:] by the chunked rule
        B = step.decode_rows.shape[0]
        out = mixed.new_empty(mixed.shape[0], cfg.linear_value_dim)  # [T, HV*dv]
        k.gdn_decode(mixed, z, a, b, conv, w.conv, w.A_log, w.dt_bias, w.norm, ssm, step.slot_ids[:B], **dims,
                     rows=step.decode_rows, out=out)
        piece = _padded_gdn if step.length is not None else _piece_gdn
        out[B:] = piece(k, w, mixed[B:], z[B:], a[B:], b[B:], conv, ssm, step, dims)
        return k.linear_residual(out, w.out_proj, res)
    if not step.is_prefill:
        out = k.gdn_decode(mixed, z, a, b, conv, w.conv, w.A_log, w.dt_bias, w.norm, ssm, step.slot_ids, **dims)
        return k.linear_residual(out, w.out_proj, res)
    piece = _padded_gdn if step.length is not None else _piece_gdn
    return k.linear_residual(piece(k, w, mixed, z, a, b, conv, ssm, step, dims), w.out_proj, res)


def _piece_gdn(k: Kernels, w: GdnWeights, mixed, z, a, b, conv: torch.Tensor, ssm: torch.Tensor, step: StepInputs,
               dims: dict) -> torch.Tensor:
    """The prefill GDN of a piece on the slot ``step.prefill_slot`` (its window and S advanced in place), filling
    the slot of each capture inside it. Returns the mixer's output [T, HV*dv]."""
    slot, cuts = step.prefill_slot, [c for c, _ in step.captures]
    for c, cap in step.captures:  # the window at a checkpoint: the K-1 inputs before it, read before it advances
        conv[cap].copy_(conv_window_at(mixed, conv[slot], c))
    qkv = k.gdn_conv_prefill(mixed, conv[slot], w.conv)  # [T, C]; the slot's window advances in place
    # chunks restart at each checkpoint, so its S is one of the chunk states: no second model call. The state
    # pass writes the final S into the slot
    out, states = k.gdn_chunk(qkv, z, a, b, w.A_log, w.dt_bias, w.norm, ssm[slot], **dims, cuts=cuts,
                              final_state=ssm[slot])
    if cuts:
        ends = chunk_ends(mixed.shape[0], GDN_CHUNK, cuts)
        for c, cap in step.captures:
            ssm[cap].copy_(states[ends.index(c)])
    return out


def _padded_gdn(k: Kernels, w: GdnWeights, mixed, z, a, b, conv: torch.Tensor, ssm: torch.Tensor, step: StepInputs,
                dims: dict) -> torch.Tensor:
    """The prefill GDN of a padded piece, its slot a device id (the last of ``step.slot_ids``: a mixed pass's decode
    rows' come first): the window and S gathered from the slot and scattered back (the ops mask the rows past
    ``step.length``). Returns the mixer's output [T, HV*dv]."""
    slot = step.slot_ids[-1:].long()  # [1]; index_copy_ takes long ids
    window = conv.index_select(0, slot)[0]  # [C, K-1]
    qkv = k.gdn_conv_prefill(mixed, window, w.conv, length=step.length)  # the window advances in place
    conv.index_copy_(0, slot, window[None])
    final = ssm.new_empty(ssm.shape[1:])  # [HV, dk, dv]
    out, _ = k.gdn_chunk(qkv, z, a, b, w.A_log, w.dt_bias, w.norm, ssm.index_select(0, slot)[0], **dims,
                         length=step.length, final_state=final)
    ssm.index_copy_(0, slot, final[None])
    return out


def attention_mixer(k: Kernels, cfg: Qwen35Config, w: AttnWeights, res: Residual, norm: torch.Tensor,
                    k_pages: torch.Tensor, v_pages: torch.Tensor, step: StepInputs) -> None:
    """Reads the stream [T, H] through the input norm; writes the new K/V into this layer's pages
    [P, page_size, nkv, d], attends, gates, and adds the output projection to the stream."""
    T = res.h.shape[0]
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qkv = k.norm_linear(res, norm, cfg.rms_norm_eps, w.qkv)  # [T, 2*nh*d + 2*nkv*d]
    # q_proj rows are [query(d), gate(d)] per head
    qg = qkv[:, :2 * nh * d].view(T, nh, 2 * d)
    q, gate = qg[..., :d], qg[..., d:]  # [T, nh, d] views
    kk = qkv[:, 2 * nh * d:(2 * nh + nkv) * d].view(T, nkv, d)
    v = qkv[:, (2 * nh + nkv) * d:].view(T, nkv, d)
    if step.rope_positions is None or step.rope_positions.ndim == 1:
        rot = step.positions if step.rope_positions is None else step.rope_positions
        q = k.rope_kv_write(q, kk, v, rot, step.slot_mapping, k_pages, v_pages, cfg.rotary_dim,
                            cfg.rope_theta, w.q_norm, w.k_norm, cfg.rms_norm_eps)
    else:
        q = k.rope_kv_write(q, kk, v, step.rope_positions, step.slot_mapping, k_pages, v_pages, cfg.rotary_dim,
                            cfg.rope_theta, w.q_norm, w.k_norm, cfg.rms_norm_eps, mrope_section=cfg.mrope_section)
    if step.cu_seqlens is not None:  # prefill, or multi-query decode: causal inside each packed block
        o = k.prefill_attention(q, k_pages, v_pages, step.block_table, step.cu_seqlens, step.prefix_lens, T,
                                max_prefix=step.max_prefix, device_splits=step.length is not None)
        o = o * torch.sigmoid(gate)  # [T, nh, d]
    else:  # the output gate in the attention kernel's store
        o = k.paged_decode_attention(q, k_pages, v_pages, step.block_table, step.context_lens, gate=gate,
                                     first_keys=step.first_keys)
    k.linear_residual(o.reshape(T, nh * d), w.o_proj, res)


def ffn(k: Kernels, cfg: Qwen35Config, w: FfnWeights, res: Residual, norm: torch.Tensor) -> None:
    """SwiGLU MLP, or the sparse MoE block with its sigmoid-gated shared expert, on the stream [T, H] read through
    the post-attention norm (weight ``norm``); adds its output to the stream."""
    if not cfg.is_moe:
        return k.linear_residual(k.norm_linear_swiglu(res, norm, cfg.rms_norm_eps, w.gate_up), w.down, res)
    y = k.norm(res, norm, cfg.rms_norm_eps)
    logits = k.linear(y, w.router)  # [T, E (+1 shared-expert gate)]
    k.moe_block(y, logits, w.experts_gate_up, w.experts_down, w.shared_gate_up, w.shared_down,
                cfg.num_experts_per_tok, cfg.norm_topk_prob, res)
