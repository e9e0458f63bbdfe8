"""The fast Program's state tensors, allocated once from a ``MemoryPlan`` (``ninfer.fast.memory``).

Layout (one tensor per kind, per-layer views are ``pools.k[i]``):

    k, v         [n_attn, num_pages + 1, page_size, nkv, d]   act dtype; page ``num_pages`` is the dummy page
    conv         [n_gdn, state_slots, conv_dim, K - 1]       act dtype; slot ``slots`` is the dummy slot
    ssm          [n_gdn, state_slots, HV, dk, dv]            fp32
    block_tables [max_seqs + 1, max_pages_per_seq]           int32; row ``max_seqs`` points only at the dummy page
    mtp_hidden   [state_slots, H]                             act dtype; only with the MTP head (``plan.mtp``)
    dk, dv       [n_draft, num_pages + 1 + scratch, page_size, nkv', d']   act dtype; only with a DFlash drafter

Pipeline stages (docs/pipeline.md) allocate one ``Pools`` per rank on its device (``allocate_pools(..., layers=)``):
k/v hold that rank's attention layers, conv/ssm its GDN layers, every rank the same pages, slots and its own copy of
the block tables; the MTP layer, ``mtp_hidden`` and the drafter's pools are rank 0's. ``plan_stage_memory`` plans the
pages every device can hold.

With the MTP head the k/v pools hold one more layer (index ``n_attn``): the MTP layer's KV, paged in the same
block table (docs/speculative.md), and each slot keeps the target's last final-normed hidden beside its GDN state.
With its draft graphs (``plan.scratch_pages`` > 0) the k/v pools also hold ``scratch_pages`` pages per block-table
row, the dummy row included, after the dummy page: where a draft's chained MTP pairs go (the frontier's partial page
copied in first), so drafting writes no page of any sequence.

With a DFlash drafter (``plan.drafter``) every page also holds the drafter's context K/V in its own geometry
(``dk``/``dv``: its layers, KV heads and head dim), indexed by the same block table (position p at page position
p), so prefix sharing, ``copy_page`` and host replicas carry it with the target's KV. Pages ``num_pages + 1 ..``
of ``dk``/``dv`` are scratch: ``plan.scratch_pages`` per block-table row, where a draft block's own K/V go (the
partial page at the frontier copied in first), so drafting never writes a sequence's pages.

With the speculative round's verify graphs (``verify_width`` = k + 1) the state pools also hold ``step_slots`` = k
slots per block-table row after the dummy slot (``state_slots`` in all): a verify pass writes the state after each
block position but the last into them (the last one into the live slot), so a partly accepted block takes its state
from there (``step_slot(row, n - 1)``) instead of replaying the kept tokens (docs/speculative.md, "Commit and
rollback"). A DFlash backend (k = 15 at block 16) keeps them while every row's take at most 1/8 of the
budget (``memory.verify_steps``), else none, and replays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.fast.memory import MemoryPlan
from ninfer.models.qwen3_5.config import Qwen35Config


@dataclass
class Pools:
    """The planned state tensors; the tensors never change identity, only their contents do."""
    plan: MemoryPlan
    k: torch.Tensor  # [n_attn, num_pages + 1 (+ (max_seqs + 1) * scratch with the MTP head), page_size, nkv, d]
    v: torch.Tensor
    conv: torch.Tensor  # [n_gdn, state_slots, conv_dim, K - 1]
    ssm: torch.Tensor  # [n_gdn, state_slots, HV, dk, dv] fp32
    block_tables: torch.Tensor  # [max_seqs + 1, max_pages_per_seq] int32
    mtp_hidden: torch.Tensor | None = None  # [state_slots, H]: h_{t-1} of the slot's sequence (MTP head only)
    dk: torch.Tensor | None = None  # [n_draft, num_pages + 1 + rows * scratch, page_size, nkv', d'] (DFlash only)
    dv: torch.Tensor | None = None

    def page_pools(self) -> tuple[torch.Tensor, ...]:
        """Every pool indexed by page id along dim 1 (the drafter's context K/V included)."""
        return (self.k, self.v) if self.dk is None else (self.k, self.v, self.dk, self.dv)

    def scratch_page(self, row: int, j: int) -> int:
        """Scratch page j of block-table row `row`: of the drafter's pools (a DFlash block's own K/V) or, with the
        MTP head, of the k/v pools (a draft's chained MTP pairs)."""
        return self.plan.num_pages + 1 + row * self.plan.scratch_pages + j

    def reset_slot(self, slot: int) -> None:
        """A fresh sequence starts from a zero conv window and a zero S (and no stored hidden)."""
        self.conv[:, slot].zero_()
        self.ssm[:, slot].zero_()
        if self.mtp_hidden is not None:
            self.mtp_hidden[slot].zero_()


def allocate_pools(cfg: Qwen35Config, plan: MemoryPlan, device: torch.device | str,
                   layers: range | None = None) -> Pools:
    """Allocate the plan's state tensors, zeroed (a kernel that reads outside its pages then reads zeros, and the
    dummy page/slot start clean). The dummy row of the block table points only at the dummy page. ``layers``: a
    pipeline stage's layer range (its attention and GDN layers only; the MTP layer, ``mtp_hidden`` and the drafter's
    pools come with the stage that holds layer 0, rank 0)."""
    layers = range(cfg.num_hidden_layers) if layers is None else layers
    head = layers.start == 0
    P, ps = plan.num_pages + 1, plan.page_size
    n_attn = sum(i in layers for i in cfg.attention_layers) + cfg.mtp_num_hidden_layers * (plan.mtp and head)
    n_gdn = sum(i in layers for i in cfg.linear_layers)
    # the MTP draft's scratch, on the rank of the MTP layer
    kv_pages = P + (plan.max_seqs + 1) * plan.scratch_pages if plan.mtp and head else P
    kv_shape = (n_attn, kv_pages, ps, cfg.num_key_value_heads, cfg.head_dim)
    HV, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    tables = torch.zeros(plan.max_seqs + 1, plan.max_pages_per_seq, dtype=torch.int32, device=device)
    tables[plan.dummy_row] = plan.dummy_page
    draft = {}
    if plan.drafter is not None and head:
        n_draft, nkv, d = plan.drafter
        shape = (n_draft, P + plan.max_seqs * plan.scratch_pages, ps, nkv, d)
        draft = dict(dk=torch.zeros(shape, dtype=plan.dtype, device=device),
                     dv=torch.zeros(shape, dtype=plan.dtype, device=device))
    return Pools(
        plan=plan, **draft,
        k=torch.zeros(kv_shape, dtype=plan.dtype, device=device),
        v=torch.zeros(kv_shape, dtype=plan.dtype, device=device),
        conv=torch.zeros(n_gdn, plan.state_slots, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=plan.dtype,
                         device=device),
        ssm=torch.zeros(n_gdn, plan.state_slots, HV, dk, dv, dtype=torch.float32, device=device),
        block_tables=tables,
        mtp_hidden=torch.zeros(plan.state_slots, cfg.hidden_size, dtype=plan.dtype, device=device)
        if plan.mtp and head else None,
    )
