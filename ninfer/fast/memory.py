"""The fast Program's device memory, planned once from a byte budget and then allocated once.

Stability note: every large allocation (resident weights, the paged KV pools, the GDN state slots, the block
tables) happens in ``allocate_pools`` before the first request; afterwards only page ids, slot ids and table rows
change. Transient activations come from the torch caching allocator (CUDA graphs: the graphs' private pool) and are
bounded by ``MemoryPlan.workspace_bytes``, because prefill is cut into pieces of at most ``max_prefill_tokens``.

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

With the MTP round's verify graphs (``mtp``, ``verify_width`` = k + 1) the state pools also hold ``step_slots`` = k
slots per block-table row after the dummy slot (``state_slots`` in all): a verify pass writes the state after each
block position but the last into them (the last one into the live slot), so a partly accepted block takes its state
from there (``step_slot(row, n - 1)``) instead of replaying the kept tokens (docs/speculative.md, "Commit and
rollback"). A DFlash backend plans none (15 states a row at block 16) and replays.

The dummy page/slot/row let CUDA-graph warm-up and capture run the real decode without touching live state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ninfer.errors import DoesNotFitError
from ninfer.models.qwen3_5.capacity import (gdn_state_bytes_per_sequence, kv_bytes_per_token,
                                            kv_bytes_per_token_all_layers,
                                            kv_pages_for_tokens, weight_bytes)
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import DrafterConfig, drafter_parameters
from ninfer.models.qwen3_5.params import MTP, TEXT
from ninfer.pipeline import StagePlan, kv_pages_per_device, stage_memory

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass(frozen=True)
class MemoryPlan:
    """Sizes decided once; every field is a host int so the plan can be printed, compared and tested on CPU."""
    dtype: torch.dtype  # weights, activations, KV pages and conv windows (S is always fp32)
    page_size: int
    num_pages: int  # usable KV pages shared by all sequences (the dummy page comes on top)
    max_seqs: int  # block-table rows
    max_pages_per_seq: int
    slots: int  # GDN state slots (the dummy slot comes on top)
    max_prefill_tokens: int
    weight_bytes: int
    kv_bytes: int
    state_bytes: int
    table_bytes: int
    workspace_bytes: int
    mtp: bool = False  # the MTP head's weights, KV layer and per-slot hidden are planned
    drafter: tuple[int, int, int] | None = None  # a DFlash drafter's (layers, nkv, head_dim): its KV in every page
    scratch_pages: int = 0  # per block-table row: DFlash's drafter pages or the MTP draft's k/v pages
    verify_rows: int = 0  # token rows of the speculative verify graphs' static outputs (max_seqs * (k + 1))
    # per block-table row: state slots a verify pass keeps block positions 0..k-1's GDN state (and stored hidden) in
    step_slots: int = 0
    # the longest prefill piece with a CUDA graph (ninfer.fast.prefill_graphs; 0: none): its graphs' private pool
    # keeps one such piece's transients for good, counted in workspace_bytes
    prefill_graph_tokens: int = 0

    @property
    def page_bytes(self) -> int:
        """Bytes of one KV page (the target's layers, the MTP layer's and the drafter's context)."""
        return self.kv_bytes // (self.num_pages + 1)

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.state_bytes + self.table_bytes + self.workspace_bytes

    @property
    def max_context(self) -> int:
        return self.max_pages_per_seq * self.page_size

    @property
    def dummy_page(self) -> int:
        return self.num_pages

    @property
    def dummy_slot(self) -> int:
        return self.slots

    @property
    def dummy_row(self) -> int:
        return self.max_seqs

    @property
    def state_slots(self) -> int:
        """Slots in the state pools: the allocatable and backup ones, the dummy, then every row's step slots."""
        return self.slots + 1 + self.max_seqs * self.step_slots

    @property
    def slot_bytes(self) -> int:
        """Bytes of one state slot (every GDN layer's conv window and S, with the MTP head its stored hidden)."""
        return self.state_bytes // self.state_slots

    def step_slot(self, row: int, j: int) -> int:
        """The slot that holds block-table row `row`'s state after block position j of its last verify pass.
        ValueError outside the rows' own k slots: a kernel would write another row's or past the pools."""
        if not (0 <= row < self.max_seqs and 0 <= j < self.step_slots):
            raise ValueError(f"no step slot ({row}, {j}): {self.max_seqs} rows keep {self.step_slots} each")
        return self.slots + 1 + row * self.step_slots + j


def workspace_bytes(cfg: Qwen35Config, tokens: int, max_batch: int, dtype: torch.dtype) -> int:
    """An upper estimate of the transient bytes alive at once: a prefill piece of ``tokens`` (the widest fused
    projection, the residual stream, the GDN chunk scratch in fp32: gamma, W, U, O and the chunk states) or a
    decode step of ``max_batch`` rows (fp32 logits and split-K attention partials), whichever is larger, plus the
    device sampler's tables and scratch."""
    per_token = _per_token_bytes(cfg, dtype)
    decode = max_batch * (4 * cfg.vocab_size + per_token + 64 * cfg.num_attention_heads * cfg.head_dim * 4)
    return max(prefill_bytes(cfg, tokens, dtype), decode) + sampling_bytes(cfg.vocab_size, max_batch)


def _per_token_bytes(cfg: Qwen35Config, dtype: torch.dtype) -> int:
    act = torch.finfo(dtype).bits // 8
    HV, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    attn_w = 2 * cfg.num_attention_heads * cfg.head_dim + 2 * cfg.num_key_value_heads * cfg.head_dim
    gdn_w = cfg.conv_dim + HV * dv + 2 * HV
    ffn_w = 2 * max(cfg.intermediate_size, cfg.shared_expert_intermediate_size,
                    cfg.num_experts_per_tok * cfg.moe_intermediate_size)
    widest = max(attn_w, gdn_w, ffn_w, cfg.conv_dim * 2)
    return act * (widest + 4 * cfg.hidden_size) + 4 * HV * (dk + 3 * dv + 1)


def prefill_bytes(cfg: Qwen35Config, tokens: int, dtype: torch.dtype) -> int:
    """The transients of one prefill piece of ``tokens``: the widest fused projection, the residual stream, the GDN
    chunk scratch in fp32 (gamma, W, U, O and the chunk states) and one fp32 logits row."""
    chunk_states = (tokens // 64 + 2) * cfg.linear_num_value_heads * cfg.linear_key_head_dim * \
        cfg.linear_value_head_dim * 4
    return tokens * _per_token_bytes(cfg, dtype) + chunk_states + 4 * cfg.vocab_size


def prefill_graph_bytes(cfg: Qwen35Config, tokens: int, dtype: torch.dtype) -> int:
    """What the prefill graphs' private pool keeps: one piece of ``tokens`` (the largest bucket; the smaller ones
    replay in the same pool), plus the split attention's partial outputs and softmax statistics in fp32 at the most
    shares a grid has (8, ``ops/prefill_attention``)."""
    if tokens == 0:
        return 0
    partials = 8 * tokens * cfg.num_attention_heads * (cfg.head_dim + 2) * 4
    return prefill_bytes(cfg, tokens, dtype) + partials


def spec_graph_bytes(cfg: Qwen35Config, max_seqs: int, width: int, dtype: torch.dtype,
                     drafter: DrafterConfig | None = None) -> int:
    """The speculative round's graphs for ``max_seqs`` rows and blocks of ``width`` = k + 1 tokens: the verify
    graphs' static logits (fp32, ``max_seqs * width`` rows, ``ninfer.fast.verify_graphs``) and one pass's transients
    in their pool (a decode step's of that many rows, ``workspace_bytes``), which the eager allocator's share does
    not cover since no plain decode graph is captured under a backend. The MTP head's draft graphs add their buffers
    (the chained hidden of ``max_seqs`` rows, ``ninfer.fast.draft_graphs``, and their draws' ``StaticDraws``: fp32 z
    and 96 bytes of parameters per draft) and a step's transients in their pool; a DFlash ``drafter`` (drafting
    eagerly) adds what its verify pass keeps instead: the target's taps of every row (the tapped layers' outputs,
    their concatenation, its projection and norm) and one drafter layer's K/V of them."""
    if not width:
        return 0
    act, rows = torch.finfo(dtype).bits // 8, max_seqs * width
    verify = rows * 4 * cfg.vocab_size + workspace_bytes(cfg, 1, rows, dtype) - sampling_bytes(cfg.vocab_size, rows)
    if drafter is not None:
        H, n = cfg.hidden_size, len(drafter.target_layer_ids)
        kv = 2 * drafter.num_key_value_heads * drafter.head_dim
        return verify + rows * act * ((2 * n + 2) * H + kv)
    draws = max_seqs * (width - 1) * (4 * cfg.vocab_size + 96 + 8)
    draft = max_seqs * act * cfg.hidden_size + draws + workspace_bytes(cfg, 1, max_seqs, dtype) - \
        sampling_bytes(cfg.vocab_size, max_seqs)
    return verify + draft


def mtp_scratch_pages(page_size: int, k: int) -> int:
    """Pages that hold k chained draft pairs starting anywhere in a page (page positions F .. F + k - 1)."""
    return -(-(page_size - 1 + k) // page_size)


def sampling_bytes(vocab: int, max_batch: int) -> int:
    """An upper estimate of the device sampler's bytes (``ninfer.fast.sampling``): per-sequence tables (bias and
    counts, 8 B a token, and two bitmasks), the z workspace and the sort variant's transients (sorted values and
    ids, cub's double buffers, four float64 rows: about 64 B a token) for ``max_batch`` rows."""
    words = (vocab + 31) // 32
    return (max_batch + 1) * (8 * vocab + 12 * words) + max_batch * 68 * vocab + 4 * vocab


def drafter_page_bytes(drafter: DrafterConfig, page_size: int, act: int) -> int:
    """A page's share of the drafter's context K/V: every drafter layer's K and V of page_size positions."""
    return 2 * drafter.num_hidden_layers * page_size * drafter.num_key_value_heads * drafter.head_dim * act


def drafter_workspace_bytes(cfg: Qwen35Config, drafter: DrafterConfig, tokens: int, max_seqs: int, act: int) -> int:
    """Transients of the drafter: the target taps a prefill piece keeps (every layer's output, ``FastModel``'s
    taps) and the context projection over it, or one block pass for every row (activations, fp32 logits)."""
    H, n = cfg.hidden_size, len(drafter.target_layer_ids)
    prefill = tokens * act * (cfg.num_hidden_layers * H + n * H + 4 * H)
    rows = max_seqs * drafter.block_size
    block = rows * (act * (2 * drafter.intermediate_size + 6 * H) + 4 * 2 * cfg.vocab_size)
    return max(prefill, block)


def scratch_pages_per_row(drafter: DrafterConfig, page_size: int) -> int:
    """Pages that hold a block of block_size positions starting anywhere in a page."""
    return -(-(page_size - 1 + drafter.block_size) // page_size)


def plan_memory(cfg: Qwen35Config, budget_bytes: int, *, max_seqs: int, max_context: int, page_size: int = 16,
                slots: int | None = None, dtype: torch.dtype = torch.bfloat16, max_prefill_tokens: int = 8192,
                max_kv_pages: int | None = None, mtp: bool = False, weight_bytes_resident: int | None = None,
                extra_workspace: int = 0, drafter: DrafterConfig | None = None,
                verify_width: int = 0, prefill_graph_tokens: int = 0) -> MemoryPlan:
    """Fit weights, state slots, block tables and workspace into ``budget_bytes``; the KV pool gets the rest
    (at most ``max_kv_pages``). Raises ``MemoryError`` when not even one ``max_context`` sequence fits. ``mtp``
    adds the MTP head: its weights, its KV layer in every page and one hidden vector per slot. A quantized model
    passes the bytes its loaded weights really hold (``weight_bytes_resident``, the MTP head's included) and its
    dequantization transient (``extra_workspace``); otherwise the logical parameters are counted at ``dtype``.
    ``prefill_graph_tokens``: the longest prefill piece with a CUDA graph, whose pool the workspace keeps.
    ``drafter`` adds a DFlash drafter: its weights, its context K/V in every page, its scratch pages and
    transients. ``verify_width`` (k + 1 of a backend) adds the round's graphs (``spec_graph_bytes``, the
    drafter's verify taps with a drafter) for ``max_seqs`` blocks of that many tokens, and with ``mtp`` the draft's
    scratch pages in the k/v pools and k step slots per row."""
    if max_seqs <= 0 or max_context <= 0 or page_size <= 0 or max_prefill_tokens <= 0:
        raise ValueError("max_seqs, max_context, page_size and max_prefill_tokens must be positive")
    name = _DTYPE_NAMES[dtype]
    slots = max_seqs if slots is None else slots
    pages_per_seq = kv_pages_for_tokens(max_context, page_size)
    w = weight_bytes(cfg, name, (TEXT, MTP) if mtp else (TEXT,)) if weight_bytes_resident is None \
        else weight_bytes_resident
    hidden = cfg.hidden_size * torch.finfo(dtype).bits // 8 if mtp else 0
    # the verify pass's step slots: MTP's k <= 7 states a row; DFlash (15 at block 16) replays instead
    steps = verify_width - 1 if mtp and verify_width else 0
    state = (slots + 1 + max_seqs * steps) * (gdn_state_bytes_per_sequence(cfg, name) + hidden)
    tables = (max_seqs + 1) * pages_per_seq * 4
    work = workspace_bytes(cfg, max_prefill_tokens, max_seqs, dtype) + extra_workspace + \
        prefill_graph_bytes(cfg, prefill_graph_tokens, dtype)
    if mtp:  # the MTP layer attends over a gathered copy of its KV (ninfer.fast.model.mtp): every row, whole context
        work += max_seqs * (max_context + 8) * kv_bytes_per_token(cfg, name)
    work += spec_graph_bytes(cfg, max_seqs, verify_width, dtype, drafter)
    page_bytes = page_size * kv_bytes_per_token_all_layers(cfg, name, with_mtp=mtp)
    scratch = 0
    if mtp and verify_width:
        scratch = mtp_scratch_pages(page_size, verify_width - 1)
        work += (max_seqs + 1) * scratch * page_bytes
    if drafter is not None:
        need = drafter_needs(cfg, drafter, page_size, dtype, max_prefill_tokens, max_seqs)
        w, page_bytes, work, scratch = w + need.weight_bytes, page_bytes + need.page_bytes, work + need.workspace, \
            need.scratch_pages
    left = budget_bytes - w - state - tables - work - page_bytes  # the dummy page is always there
    fit = max(left, 0) // page_bytes
    num_pages = fit if max_kv_pages is None else min(fit, max_kv_pages)
    if num_pages < pages_per_seq:
        raise DoesNotFitError(f"budget {budget_bytes / 2**30:.2f} GiB leaves {fit} KV pages after weights "
                              f"{w / 2**30:.2f} GiB, state {state / 2**30:.2f} GiB and workspace {work / 2**30:.2f} "
                              f"GiB; one {max_context}-token sequence needs {pages_per_seq}")
    return MemoryPlan(dtype=dtype, page_size=page_size, num_pages=int(num_pages), max_seqs=max_seqs,
                      max_pages_per_seq=pages_per_seq, slots=slots, max_prefill_tokens=max_prefill_tokens,
                      weight_bytes=w, kv_bytes=(num_pages + 1) * page_bytes, state_bytes=state, table_bytes=tables,
                      workspace_bytes=work, mtp=mtp, scratch_pages=scratch, verify_rows=max_seqs * verify_width,
                      step_slots=steps, prefill_graph_tokens=prefill_graph_tokens,
                      drafter=_drafter_geometry(drafter))


@dataclass(frozen=True)
class DrafterNeeds:
    """What a DFlash drafter adds to the device that holds it (one stage's, or rank 0's over pipeline stages)."""

    weight_bytes: int
    page_bytes: int  # its context K/V in every page
    scratch_pages: int  # per block-table row: where a draft block's own K/V go
    workspace: int  # its transients (a prefill piece's taps, the block pass) and the rows' scratch pages


def drafter_needs(cfg: Qwen35Config, drafter: DrafterConfig, page_size: int, dtype: torch.dtype,
                  max_prefill_tokens: int, max_seqs: int) -> DrafterNeeds:
    act = torch.finfo(dtype).bits // 8
    page = drafter_page_bytes(drafter, page_size, act)
    scratch = scratch_pages_per_row(drafter, page_size)
    return DrafterNeeds(act * sum(p.numel for p in drafter_parameters(drafter).values()), page, scratch,
                        drafter_workspace_bytes(cfg, drafter, max_prefill_tokens, max_seqs, act) +
                        max_seqs * scratch * page)


def _drafter_geometry(drafter: DrafterConfig | None) -> tuple[int, int, int] | None:
    """A plan's ``drafter`` field: the drafter's (layers, KV heads, head dim), whose K/V every page holds."""
    return None if drafter is None else (drafter.num_hidden_layers, drafter.num_key_value_heads, drafter.head_dim)


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


def plan_stage_memory(cfg: Qwen35Config, stages: StagePlan, budgets: list[int], *, max_seqs: int, max_context: int,
                      page_size: int = 16, slots: int | None = None, dtype: torch.dtype = torch.bfloat16,
                      max_prefill_tokens: int = 8192, max_kv_pages: int | None = None, mtp: bool = False,
                      weight_bytes_per_rank: list[int] | None = None, extra_workspace: int = 0,
                      verify_width: int = 0, prefill_graph_tokens: int = 0,
                      drafter: DrafterConfig | None = None) -> MemoryPlan:
    """``plan_memory`` over pipeline stages: each rank's weights, state slots of its GDN layers, block tables and
    a prefill piece's (or a decode step's) workspace are fixed on its device (rank 0 also the MTP hidden per slot
    and the MTP layer's gathered KV), and the KV pages are the fewest any device can hold beside them
    (``kv_pages_per_device``: ranks sharing a device are pooled against its one budget; ``budgets`` is per rank).
    StageCapacityError names each device's bytes when one cannot hold its stages. The plan's byte fields are the
    totals over the ranks (``page_bytes`` is one whole page, as one stage's). ``weight_bytes_per_rank``: a quantized
    model's resident bytes per rank. ``verify_width``: the round's graphs (``spec_graph_bytes``, counted on
    every rank: each runs its layers of the pass, and with a drafter taps its layers of it), and with ``mtp`` the
    draft's scratch pages in rank 0's k/v pools and k step slots per row (every rank's GDN layers);
    ``prefill_graph_tokens``: the prefill graphs' pool (``prefill_graph_bytes``, on every rank likewise);
    ``drafter``: a DFlash drafter on rank 0 (``drafter_needs``: its weights, its context K/V in rank 0's share of
    every page, its scratch pages and the taps every rank hands to rank 0)."""
    name = _DTYPE_NAMES[dtype]
    slots = max_seqs if slots is None else slots
    pages_per_seq = kv_pages_for_tokens(max_context, page_size)
    memory = stage_memory(cfg, stages, page_size, name, name, mtp)
    if weight_bytes_per_rank is not None:
        memory = [dataclasses.replace(m, weight_bytes=w) for m, w in zip(memory, weight_bytes_per_rank, strict=True)]
    tables = (max_seqs + 1) * pages_per_seq * 4
    work = [workspace_bytes(cfg, max_prefill_tokens, max_seqs, dtype) + extra_workspace + tables +
            spec_graph_bytes(cfg, max_seqs, verify_width, dtype, drafter) +
            prefill_graph_bytes(cfg, prefill_graph_tokens, dtype) for _ in memory]
    steps = verify_width - 1 if mtp and verify_width else 0
    state_slots = slots + 1 + max_seqs * steps
    hidden = state_slots * cfg.hidden_size * torch.finfo(dtype).bits // 8 if mtp else 0
    scratch = mtp_scratch_pages(page_size, verify_width - 1) if mtp and verify_width else 0
    if mtp:  # on rank 0: the MTP layer's gathered KV (as plan_memory), its hidden per slot, the draft's scratch
        work[0] += max_seqs * (max_context + 8) * kv_bytes_per_token(cfg, name) + hidden + \
            (max_seqs + 1) * scratch * memory[0].page_bytes
    if drafter is not None:
        need = drafter_needs(cfg, drafter, page_size, dtype, max_prefill_tokens, max_seqs)
        memory[0] = dataclasses.replace(memory[0], weight_bytes=memory[0].weight_bytes + need.weight_bytes,
                                        page_bytes=memory[0].page_bytes + need.page_bytes)
        work[0] += need.workspace
        scratch = need.scratch_pages
    # one more slot and page each: the dummies
    fit = kv_pages_per_device(memory, budgets, state_slots, work) - 1
    num_pages = fit if max_kv_pages is None else min(fit, max_kv_pages)
    if num_pages < pages_per_seq:
        raise DoesNotFitError(f"the devices {','.join(stages.devices)} hold {fit} KV pages beside their stages; one "
                              f"{max_context}-token sequence needs {pages_per_seq}")
    page_bytes = sum(m.page_bytes for m in memory)
    return MemoryPlan(dtype=dtype, page_size=page_size, num_pages=int(num_pages), max_seqs=max_seqs,
                      max_pages_per_seq=pages_per_seq, slots=slots, max_prefill_tokens=max_prefill_tokens,
                      weight_bytes=sum(m.weight_bytes for m in memory), kv_bytes=(num_pages + 1) * page_bytes,
                      state_bytes=state_slots * sum(m.slot_bytes for m in memory) + hidden,
                      table_bytes=tables * stages.stages, workspace_bytes=sum(work) - tables * stages.stages - hidden,
                      mtp=mtp, scratch_pages=scratch, verify_rows=max_seqs * verify_width, step_slots=steps,
                      prefill_graph_tokens=prefill_graph_tokens, drafter=_drafter_geometry(drafter))


def device_budget(fraction: float = 0.9, device: torch.device | str = "cuda") -> int:
    """``fraction`` of the device memory that is free now; on a machine without CUDA there is no device budget."""
    if not torch.cuda.is_available():
        raise RuntimeError("device_budget needs a CUDA device; pass an explicit byte budget on CPU")
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free * fraction)
