"""The fast Qwen3.5 model: embedding -> hybrid layers -> final norm -> lm_head, on resident fused weights, the paged
KV pool and the GDN state slots of a ``MemoryPlan``.

Stability note: ``decode`` is the CUDA-graph body. It takes only device tensors, reads no device value back and
allocates only transients, so a graph captured for batch size B serves any sequences: slot ids, block-table rows
(and through them page ids), context lengths and positions are data.

Pipeline stages (docs/pipeline.md): the model cut by layers into ranks, each with its layer weights and its own
``Pools`` (its attention and GDN layers, a copy of the block tables) on its device; ``pools`` is rank 0's, which
also holds the embedding, the final norm, the head and the MTP head. A forward pass embeds on rank 0, runs each
rank's layers on its own ``StepInputs`` and hands the residual pair (h and the pending delta the next fused norm
adds, so the rounding is one stage's) through the ``PeerLink`` to the next rank and from the last back to rank 0.

Numerics (qwen35-architecture.md section 7): weights, activations, KV pages and conv windows in ``plan.dtype``
(bf16 in production, fp32 for tight comparisons); every norm, the gates, the router softmax, attention softmax, RoPE
angles and the recurrent state S in fp32; logits are returned in fp32.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ninfer.fast.hostcopy import to_device
from ninfer.fast.memory import MemoryPlan
from ninfer.fast.pools import Pools, allocate_pools
from ninfer.models.qwen3_5.config import FULL, Qwen35Config
from ninfer.pipeline import StagePlan
from ninfer.pipeline.link import PeerLink
from ninfer.sampling.speculative import draft_vocabulary

from .addressing import (mixed_inputs, moved, padded_inputs, padded_mixed_inputs, piece_rows, prefill_inputs,
                         verify_inputs)
from .kernels import Kernels, Residual, get_kernels
from .layers import GDN_CHUNK, StepInputs, attention_mixer, ffn, gdn_mixer, head_logits, past_draft_vocab
from .mtp import MtpHead
from .weights import FastWeights, Source, load_fast_weights


def check_mtp(cfg: Qwen35Config, mtp: bool) -> None:
    if mtp and cfg.mtp_num_hidden_layers != 1:
        raise ValueError(f"the fast MTP head runs one MTP layer; this model has {cfg.mtp_num_hidden_layers}")


def allocate_stage_pools(cfg: Qwen35Config, plan: MemoryPlan, device: torch.device | str,
                         stages: StagePlan | None = None) -> list[Pools]:
    """One ``Pools`` per rank on its device (rank 0's on ``device``), all over the same pages, slots and rows."""
    if stages is None:
        return [allocate_pools(cfg, plan, device)]
    return [allocate_pools(cfg, plan, device if rank == 0 else d, r)
            for rank, (d, r) in enumerate(zip(stages.devices, stages.ranges()))]


class FastModel:
    def __init__(self, cfg: Qwen35Config, weights: FastWeights, pools: Pools | Sequence[Pools],
                 kernels: str | Kernels = "triton", stages: StagePlan | None = None):
        self.cfg = cfg
        self.weights = weights
        self.ranks: list[Pools] = [pools] if isinstance(pools, Pools) else list(pools)  # rank r's pools
        self.pools = self.ranks[0]
        self.plan: MemoryPlan = self.pools.plan
        self.kernels = get_kernels(kernels) if isinstance(kernels, str) else kernels
        self.stages = stages or StagePlan((str(self.pools.k.device),), (cfg.num_hidden_layers,))
        if self.stages.stages != len(self.ranks):
            raise ValueError(f"{len(self.ranks)} pools for the {self.stages.stages} stages {self.stages}")
        self.devices = [p.block_tables.device for p in self.ranks]
        # the residual's passes between stages (None: one stage)
        self.link = PeerLink(tuple(map(str, self.devices))) if len(self.ranks) > 1 else None
        # layer -> (rank, index into that rank's pool tensors of its kind)
        self._pool_index = {layer: (rank, j) for rank in range(len(self.ranks))
                            for kinds in (cfg.attention_layers, cfg.linear_layers)
                            for j, layer in enumerate(self.stages.owned(rank, kinds))}
        self.mtp = MtpHead(self) if weights.mtp is not None else None  # the MTP head (plan.mtp)
        # the layers whose outputs a ``taps`` dict receives (a DFlash drafter's, `tap`); the last layer's is always
        # the final-normed hidden on rank 0
        self.tapped: frozenset[int] = frozenset(range(cfg.num_hidden_layers - 1))

    @classmethod
    def build(cls, cfg: Qwen35Config, source: Source, plan: MemoryPlan, device: torch.device | str,
              kernels: str | Kernels = "triton", stages: StagePlan | None = None) -> "FastModel":
        """Weights first (``source(logical_name)``), then the planned pools: all large allocations, once. ``stages``:
        each rank's layers and pools on its device (rank 0's is ``device``)."""
        check_mtp(cfg, plan.mtp)
        weights = load_fast_weights(cfg, source, plan.dtype, device, mtp=plan.mtp, stages=stages)
        return cls(cfg, weights, allocate_stage_pools(cfg, plan, device, stages), kernels, stages)

    def tap(self, layers: Sequence[int]) -> None:
        """Fill ``taps`` with these layers' outputs only: over pipeline stages each crosses to rank 0 once per
        pass, so the layers no drafter reads stay on their stage."""
        self.tapped = frozenset(layers) - {self.cfg.num_hidden_layers - 1}

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    def decode(self, tokens: torch.Tensor, slot_ids: torch.Tensor, block_table_rows: torch.Tensor,
               context_lens: torch.Tensor, positions: torch.Tensor,
               rope_positions: torch.Tensor | None = None) -> torch.Tensor:
        """One token for each of B sequences. tokens [B]; slot_ids [B] int32 GDN slots; block_table_rows [B] rows of
        ``pools.block_tables``; context_lens [B] int32 keys to attend to, this token included; positions [B] the
        token's absolute position; rope_positions [B] its rotary position where that differs (after a prompt with
        images: position + rope_delta, equal in MRoPE's three rows). Writes K/V into the pages, advances the GDN
        slots. Returns logits [B, V] fp32. Every stage's inputs are copies of these on its device."""
        columns = (slot_ids, block_table_rows, context_lens, positions, rope_positions)
        steps = [self.decode_inputs(rank, *(None if t is None else t.to(d) for t in columns))
                 for rank, d in enumerate(self.devices)]
        return self.logits(self._layers(tokens, steps))

    def decode_inputs(self, rank: int, slot_ids: torch.Tensor, block_table_rows: torch.Tensor,
                      context_lens: torch.Tensor, positions: torch.Tensor,
                      rope_positions: torch.Tensor | None = None) -> StepInputs:
        """A decode step's addressing on rank `rank` (the arguments on its device), from its own block tables."""
        table, slot_mapping = self.kernels.decode_slots(self.ranks[rank].block_tables, block_table_rows, positions,
                                                        self.plan.page_size)  # [B, max_pages], [B]
        return StepInputs(positions=positions, slot_mapping=slot_mapping, slot_ids=slot_ids, block_table=table,
                          context_lens=context_lens, rope_positions=rope_positions)

    def backup_slots(self, slot_ids: torch.Tensor, table_rows: torch.Tensor, backup_base: int,
                     rank: int | None = None) -> None:
        """Copy each row's GDN state (conv window and S of every GDN layer) from its slot into the backup slot of
        its block-table row, ``backup_base + row``: the committed state a rejected decode step goes back to (with the
        MTP head, the stored hidden too, as ``DeviceState.copy_slot`` copies it). Device ids only, so it runs inside
        the decode and verify graphs. ``rank``: that stage's GDN layers (and rank 0's hidden) only, the ids on its
        device; None: every stage's."""
        for r in range(len(self.ranks)) if rank is None else (rank,):
            ids, rows, pools = slot_ids.to(self.devices[r]), table_rows.to(self.devices[r]), self.ranks[r]
            parts = (pools.conv, pools.ssm) if pools.mtp_hidden is None else \
                (pools.conv, pools.ssm, pools.mtp_hidden[None])  # [1, state_slots, H]: h_{t-1} too
            for pool in parts:
                self.kernels.slot_copy(pool, ids, rows, backup_base)

    def prefill(self, tokens: torch.Tensor, slot_id: int, block_table_row: int, start_pos: int,
                all_logits: bool = False, return_hidden: bool = False, taps: dict[int, torch.Tensor] | None = None,
                rope_positions: torch.Tensor | None = None, embeds: tuple[torch.Tensor, torch.Tensor] | None = None,
                captures: Sequence[tuple[int, int]] = ()):
        """Consume tokens [T] of one sequence at positions start_pos.. (start_pos 0 resets its GDN slot). The
        sequence's pages must already be in ``pools.block_tables[block_table_row]``. Long prompts run in pieces of
        at most ``plan.max_prefill_tokens``. Returns logits of the last token [V] fp32, or of all [T, V]; with
        ``return_hidden`` also the final-normed hidden [T, H] (what the MTP head reads). A ``taps`` dict receives
        every layer's output [T, H] by layer index (HF's ``hidden_states[i + 1]``, the last layer's final-normed):
        what a DFlash drafter conditions on. A prompt with images passes its MRoPE ``rope_positions`` [3, T] and
        ``embeds`` (rows [n] long, features [n, H]): those rows' embeddings replaced by the image features.
        ``captures`` (frontier, slot), frontiers strictly inside (start_pos, start_pos + T) and ascending: the GDN
        state (conv window and S of every GDN layer) after the tokens before each frontier is written into its slot
        during this one pass (KV is paged: nothing to copy), equal to the state a prefill ending there leaves."""
        T = tokens.shape[0]
        if tokens.ndim != 1 or T == 0:
            raise ValueError(f"prefill takes a non-empty 1-D token tensor, got shape {tuple(tokens.shape)}")
        if start_pos < 0 or start_pos + T > self.plan.max_context:
            raise ValueError(f"positions {start_pos}..{start_pos + T} exceed the planned context "
                             f"{self.plan.max_context}")
        frontiers = [f for f, _ in captures]
        if frontiers != sorted(set(frontiers)) or any(not start_pos < f < start_pos + T for f in frontiers):
            raise ValueError(f"capture frontiers {frontiers} must ascend strictly inside ({start_pos}, "
                             f"{start_pos + T})")
        if start_pos == 0:
            for pools in self.ranks:
                pools.reset_slot(slot_id)
        # pieces stay multiples of the GDN chunk so chunk boundaries sit at fixed offsets from the call's start
        piece = max(GDN_CHUNK, self.plan.max_prefill_tokens // GDN_CHUNK * GDN_CHUNK)
        outs, hiddens, pieces = [], [], []
        for s in range(0, T, piece):
            n, at = min(piece, T - s), start_pos + s
            for f, cap in captures:
                if f == at:  # on a piece boundary: the live state between two pieces, on every stage
                    for pools in self.ranks:
                        pools.conv[:, cap].copy_(pools.conv[:, slot_id])
                        pools.ssm[:, cap].copy_(pools.ssm[:, slot_id])
            inner = tuple((f - at, cap) for f, cap in captures if at < f < at + n)
            sink: dict[int, torch.Tensor] | None = None if taps is None else {}
            steps = [prefill_inputs(p.block_tables, self.plan.page_size, n, slot_id, block_table_row, at, inner)
                     for p in self.ranks]
            if rope_positions is not None:
                for step in steps:
                    step.rope_positions = rope_positions[:, s:s + n].to(step.positions.device).contiguous()
            hidden = self._layers(tokens[s:s + n], steps, sink, piece_rows(embeds, s, n))
            if sink is not None:
                pieces.append(sink)
            if all_logits:
                outs.append(self.logits(hidden))
            if return_hidden:
                hiddens.append(hidden)
        if taps is not None:
            taps.update({i: torch.cat([p[i] for p in pieces]) for i in pieces[0]})
        logits = torch.cat(outs) if all_logits else self.logits(hidden[-1:])[0]
        return (logits, torch.cat(hiddens)) if return_hidden else logits

    def mixed(self, tokens: torch.Tensor, slot: int, block_table_row: int, start: int,
              decode: tuple[torch.Tensor, Sequence[int], Sequence[int], Sequence[int]],
              captures: Sequence[tuple[int, int]] = (), rope_positions: torch.Tensor | None = None,
              embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """One pass over one decode step of B sequences and a prefill piece of another: every weight is read once
        for both. ``decode`` = (tokens [B] on the device, GDN slots, table rows, positions), each row as `decode`'s
        (its pages already in the table; the caller backed its state up). The piece is `prefill`'s (tokens [n] of
        the sequence at GDN slot ``slot`` and table row ``block_table_row`` from ``start``, n within one piece;
        ``captures`` and ``embeds`` as there, the slot reset at start 0). ``rope_positions`` covers the B + n rows
        ([3, T] or [T]) where any rotates off its position. Returns logits [B + 1, V] fp32: each decode row's,
        then the piece's last token's."""
        n, (dec_tokens, slots, rows, frontiers) = tokens.shape[0], decode
        B = len(slots)
        if tokens.ndim != 1 or not 0 < n <= self.plan.max_prefill_tokens or not len(rows) == len(frontiers) == \
                dec_tokens.shape[0] == B > 0:
            raise ValueError(f"a mixed pass takes a piece of 1..{self.plan.max_prefill_tokens} tokens and B >= 1 "
                             f"decode rows, got {tuple(tokens.shape)} and {B} rows")
        if max(start + n, *(p + 1 for p in frontiers)) > self.plan.max_context:
            raise ValueError(f"a mixed pass past the planned context {self.plan.max_context}")
        if any(not start < f < start + n for f, _ in captures):
            raise ValueError(f"capture frontiers {[f for f, _ in captures]} must lie strictly inside ({start}, "
                             f"{start + n})")
        if start == 0:
            for pools in self.ranks:
                pools.reset_slot(slot)
        inner = tuple((f - start, cap) for f, cap in captures)  # offsets into the piece, as `prefill`'s
        steps = [mixed_inputs(p.block_tables, self.plan.page_size, n, slot, block_table_row, start, inner, slots,
                              rows, frontiers) for p in self.ranks]
        if rope_positions is not None:
            for step in steps:
                step.rope_positions = rope_positions.to(step.positions.device)
        embeds = None if embeds is None else (embeds[0] + B, embeds[1])  # the piece's rows follow the decode rows
        hidden = self._layers(torch.cat([dec_tokens, tokens]), steps, embeds=embeds)
        return self.logits(torch.cat([hidden[:B], hidden[-1:]]))

    def mixed_piece(self, tokens: torch.Tensor, slot: torch.Tensor, table_row: torch.Tensor, start: torch.Tensor,
                    length: torch.Tensor, decode: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """`mixed` with the piece padded to a bucket, every quantity device data: the body of a mixed CUDA graph
        (``ninfer.fast.mixed_graphs``). tokens [B + N] int32: the B decode rows' tokens, then the piece's, of which
        the first ``length`` are real; slot, table_row, start, length [1] int32 as `prefill_piece`'s; ``decode`` =
        (GDN slots, table rows, positions) [B] int32. The caller resets the slot at start 0 and backs the decode
        rows up. Returns logits [B + 1, V] fp32: each decode row's, then the piece's last real token's."""
        slots, rows, frontiers = decode
        B = slots.shape[0]
        step = padded_mixed_inputs(self.pools.block_tables, self.plan.page_size, tokens.shape[0] - B, slot,
                                   table_row, start, length, slots, rows, frontiers)
        hidden = self.hidden_states(tokens, step)
        last = torch.cat([torch.arange(B, device=tokens.device), (B + length - 1).long()])  # [B + 1]
        return self.logits(hidden.index_select(0, last))

    def prefill_piece(self, tokens: torch.Tensor, slot_id: torch.Tensor, table_row: torch.Tensor,
                      start: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """A prefill piece padded to a bucket: the body of a prefill CUDA graph (``ninfer.fast.prefill_graphs``).
        tokens [N] int32, of which the first ``length`` are real, of the sequence at GDN slot ``slot_id`` and table
        row ``table_row`` from position ``start``; all four [1] int32 device data, so one graph per N serves any
        sequence at any frontier. The padding rows write no KV and leave the slot's GDN state and conv window as
        the real rows leave them (what `prefill` of the real tokens does, without its slot reset at position 0,
        which the caller runs). Reads no device value back. Returns the last real token's logits [1, V] fp32."""
        step = padded_inputs(self.pools.block_tables, self.plan.page_size, self.device, tokens.shape[0], slot_id,
                             table_row, start, length)
        hidden = self.hidden_states(tokens, step)
        return self.logits(hidden.index_select(0, (length - 1).long()))

    def verify(self, tokens: torch.Tensor, slot_ids: Sequence[int], block_table_rows: Sequence[int],
               starts: Sequence[int], lens: Sequence[int], taps: dict[int, torch.Tensor] | None = None,
               rope_deltas: Sequence[int] | None = None, keep_steps: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Multi-query decode: B blocks packed along tokens [N] (block i: lens[i] >= 1 tokens at positions
        starts[i].., on GDN slot slot_ids[i] and table row block_table_rows[i], whose pages must cover them), in
        one target pass: the GDN decode recurrence stepped over each block, attention with lens[i] queries per
        block, causal inside it. Advances the slots and writes K/V; with ``keep_steps`` the state after block
        position j < lens[i] - 1 goes to the row's step slot j (``plan.step_slot``) and only the last one into the
        slot, else every step is in place. Returns (logits [N, V] fp32, the final-normed hidden [N, H]); ``taps``
        as for `prefill` ([N, H] each). ``rope_deltas[i]``: block i rotates at its positions + that (a sequence
        after a prompt with images)."""
        if tokens.ndim != 1 or tokens.shape[0] != sum(lens) or min(lens, default=0) < 1 or \
                not len(slot_ids) == len(block_table_rows) == len(starts) == len(lens):
            raise ValueError(f"verify takes {len(lens)} blocks of lens {list(lens)} >= 1 packed along a 1-D token "
                             f"tensor, got shape {tuple(tokens.shape)}")
        if max(s + n for s, n in zip(starts, lens)) > self.plan.max_context:
            raise ValueError(f"positions up to {max(s + n for s, n in zip(starts, lens))} exceed the planned "
                             f"context {self.plan.max_context}")
        if keep_steps and max(lens) > self.plan.step_slots + 1:
            raise ValueError(f"blocks of lens {list(lens)} keep more states than the plan's {self.plan.step_slots} "
                             f"step slots per row")
        steps = [verify_inputs(self.plan, p.block_tables, slot_ids, block_table_rows, starts, lens, keep_steps)
                 for p in self.ranks]
        if rope_deltas is not None and any(rope_deltas):
            deltas = [d for d, n in zip(rope_deltas, lens) for _ in range(n)]
            for step in steps:
                step.rope_positions = step.positions + to_device(deltas, step.positions.device)
        hidden = self._layers(tokens, steps, taps)
        return self.logits(hidden), hidden

    def hidden_states(self, tokens: torch.Tensor, step: StepInputs, taps: dict[int, torch.Tensor] | None = None
                      ) -> torch.Tensor:
        """tokens [T] through every layer at ``step``'s addressing (built by the caller on rank 0, e.g. the verify
        graphs' static buffers; a later stage takes a copy on its device); the final-normed hidden [T, H]; ``taps``
        as for `prefill`."""
        return self._layers(tokens, [step] + [moved(step, d) for d in self.devices[1:]], taps)

    def _layers(self, tokens: torch.Tensor, steps: list[StepInputs], taps: dict[int, torch.Tensor] | None = None,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Embedding -> every stage's layers (``steps[rank]``: its addressing) -> final norm on rank 0; returns the
        final-normed hidden [T, H] (and fills ``taps``, on rank 0's device)."""
        res = self.embed(tokens, embeds)
        for rank, step in enumerate(steps):
            if rank:
                res = self.hand_on(res, rank - 1, rank)
            self.run_stage(rank, res, step, taps)
        if len(steps) > 1:
            res = self.hand_on(res, len(steps) - 1, 0)
        hidden = self.final_norm(res)
        if taps is not None:
            taps[self.cfg.num_hidden_layers - 1] = hidden
        return hidden

    def embed(self, tokens: torch.Tensor, embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> Residual:
        """The residual stream [T, H] of tokens [T] on rank 0 (image features at the ``embeds`` rows)."""
        h = F.embedding(tokens, self.weights.embed)  # [T, H]
        if embeds is not None:
            h[embeds[0]] = embeds[1].to(h.dtype)  # image features at the pads
        return Residual(h)

    def run_stage(self, rank: int, res: Residual, step: StepInputs, taps: dict[int, torch.Tensor] | None = None
                  ) -> None:
        """Rank `rank`'s layers on the stream ``res`` (on its device), in place.

        The residual stream is a ``Residual`` (kernels.py) that every sublayer reads through its norm and adds its
        output to: in the decode GEMVs' prologues and epilogues, or through the fused add + RMSNorm kernel (h
        rounded to the activation dtype either way, as an unfused add)."""
        cfg, k, pools = self.cfg, self.kernels, self.ranks[rank]
        for i in self.stages.ranges()[rank]:
            lw, j = self.weights.layers[i], self._pool_index[i][1]
            if cfg.layer_types[i] == FULL:
                attention_mixer(k, cfg, lw.mixer, res, lw.input_norm, pools.k[j], pools.v[j], step)
            else:
                gdn_mixer(k, cfg, lw.mixer, res, lw.input_norm, pools.conv[j], pools.ssm[j], step)
            ffn(k, cfg, lw.ffn, res, lw.post_norm)
            if taps is not None and i in self.tapped:
                # a later stage hands its tapped outputs to rank 0, where the drafter reads them
                taps[i] = res.value() if rank == 0 else self.link.pass_on(res.value(), rank, 0)

    def hand_on(self, res: Residual, src: int, dst: int) -> Residual:
        """The residual pair from rank `src` to rank `dst` through the link: h and the pending delta both cross, so
        the next norm adds them exactly as one stage would."""
        delta = None if res.delta is None else self.link.pass_on(res.delta, src, dst)
        return Residual(self.link.pass_on(res.h, src, dst), delta)

    def final_norm(self, res: Residual) -> torch.Tensor:
        """The final-normed hidden [T, H] on rank 0."""
        return self.kernels.norm(res, self.weights.final_norm, self.cfg.rms_norm_eps)

    def logits(self, hidden: torch.Tensor, draft_vocab: int | None = None) -> torch.Tensor:
        """Final-normed hidden [N, H] -> logits [N, V] fp32 (only the rows that need logits are passed in).
        `draft_vocab`: a draft's logits, the ids at and past it -inf (a dense lm_head reads only the rows below
        it; a quantized one computes them all)."""
        lm_head, mtp = self.weights.lm_head, self.weights.mtp
        if draft_vocab is not None and mtp is not None and mtp.head is not None:  # the FP8 draft head
            return past_draft_vocab(self.kernels.linear(hidden, mtp.head).float(), self.cfg.vocab_size)
        if isinstance(lm_head, torch.Tensor):
            return head_logits(hidden, lm_head, draft_vocab)
        return draft_vocabulary(self.kernels.linear(hidden, lm_head).float(), draft_vocab)
