"""The fast Program's device memory, planned once from a byte budget and then allocated once.

Stability note: every large allocation (resident weights, the paged KV pools, the GDN state slots, the block tables)
happens in ``ninfer.fast.pools.allocate_pools`` before the first request; afterwards only page ids, slot ids and table
rows change. Transient activations come from the torch caching allocator (CUDA graphs: the graphs' private pool) and are
bounded by ``MemoryPlan.workspace_bytes``, because prefill is cut into pieces of at most ``max_prefill_tokens``.

The pools' layout is in ``ninfer.fast.pools``.

The dummy page/slot/row let CUDA-graph warm-up and capture run the real decode without touching live state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from ninfer.errors import DoesNotFitError
from ninfer.fast.drafter_memory import drafter_block_bytes, drafter_needs
from ninfer.models.qwen3_5.capacity import (gdn_state_bytes_per_sequence, kv_bytes_per_token,
                                            kv_bytes_per_token_all_layers,
                                            kv_pages_for_tokens, weight_bytes)
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import DrafterConfig
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
    # per block-table row, without a speculative backend: 1 when a decode step may be launched behind another
    # (a chained step, docs/engine.md "Async scheduling"), whose backup of the state between the two goes there
    chain_slots: int = 0
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
        """Slots in the state pools: the allocatable and backup ones, the dummy, every row's step slots, then its
        chained backup."""
        return self.slots + 1 + self.max_seqs * (self.step_slots + self.chain_slots)

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

    def chain_backup(self, row: int) -> int:
        """The slot a decode step chained behind another backs row `row`'s state up into (the step before it
        keeps the row's own backup slot). ValueError where the plan keeps none."""
        if not (0 <= row < self.max_seqs and self.chain_slots):
            raise ValueError(f"no chained backup for row {row}: {self.max_seqs} rows keep {self.chain_slots} each")
        return self.slots + 1 + self.max_seqs * self.step_slots + row


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


def prefill_graph_bytes(cfg: Qwen35Config, tokens: int, dtype: torch.dtype, rows: int = 0) -> int:
    """What the prefill graphs' private pool keeps: one piece of ``tokens`` (the largest bucket; the smaller ones
    replay in the same pool) beside ``rows`` decode rows (the mixed graphs', ``ninfer.fast.mixed_graphs``, in the
    same pool, and their shared fp32 logits), plus the split attention's partial outputs and softmax statistics in
    fp32 at the most shares a grid has (8, ``ops/prefill_attention``)."""
    if tokens == 0:
        return 0
    logits = 4 * cfg.vocab_size * (rows + 1) if rows else 0  # the mixed graphs' shared fp32 logits [rows + 1, V]
    tokens += rows
    partials = 8 * tokens * cfg.num_attention_heads * (cfg.head_dim + 2) * 4
    return prefill_bytes(cfg, tokens, dtype) + partials + logits


def spec_graph_bytes(cfg: Qwen35Config, max_seqs: int, width: int, dtype: torch.dtype,
                     drafter: DrafterConfig | None = None) -> int:
    """The speculative round's graphs for ``max_seqs`` rows and blocks of ``width`` = k + 1 tokens: the verify
    graphs' static logits (fp32, ``max_seqs * width`` rows, ``ninfer.fast.verify_graphs``) and one pass's transients
    in their pool (a decode step's of that many rows, ``workspace_bytes``), which the eager allocator's share does
    not cover since no plain decode graph is captured under a backend. Both backends' draft graphs add their draws'
    ``StaticDraws`` (fp32 z and 104 bytes of parameters and drafts per draft). The MTP head's add the chained hidden
    of ``max_seqs`` rows (``ninfer.fast.draft_graphs``) and a step's transients in their pool; a DFlash ``drafter``
    adds what its verify pass keeps (the target's taps of every row: the tapped layers' outputs, their
    concatenation, its projection and norm, and one drafter layer's K/V of them) and its draft graphs' pool
    (``ninfer.fast.dflash_graphs``: one block pass of every row and a draw's transients, the sort variant's as
    `sampling_bytes` counts them). Every backend adds the grammar rows of its verified positions (int32 bitmask
    words per row, ``ninfer.fast.sampling.prefix_masks``)."""
    if not width:
        return 0
    act, rows, V = torch.finfo(dtype).bits // 8, max_seqs * width, cfg.vocab_size
    verify = rows * 4 * V + workspace_bytes(cfg, 1, rows, dtype) - sampling_bytes(V, rows) + rows * 4 * (-(-V // 32))
    draws = max_seqs * (width - 1) * (4 * V + 96 + 8)
    if drafter is not None:
        H, n = cfg.hidden_size, len(drafter.target_layer_ids)
        kv = 2 * drafter.num_key_value_heads * drafter.head_dim
        taps = rows * act * ((2 * n + 2) * H + kv)
        return verify + taps + draws + drafter_block_bytes(cfg, drafter, max_seqs, act) + max_seqs * 68 * V
    draft = max_seqs * act * cfg.hidden_size + draws + workspace_bytes(cfg, 1, max_seqs, dtype) - \
        sampling_bytes(V, max_seqs)
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


STEP_STATE_SHARE = 8  # a DFlash backend's step slots may take at most 1/8 of what the weights leave


def verify_steps(verify_width: int, mtp: bool, drafter: DrafterConfig | None, max_seqs: int,
                 fits: Callable[[int], bool]) -> int:
    """Step slots per row of the verify pass (``MemoryPlan.step_slots``): the state after each block position but
    the last, so a partly accepted block costs a slot copy, not a second target pass. MTP's k (at most 7 states a
    row) always; a DFlash drafter's k (15 at block 16) where ``fits(k)``: every row's k states within
    1/STEP_STATE_SHARE of the budget the weights (target and drafter) leave, which KV and state share (9B: 8 rows
    x 15 x 49 MiB = 5.9 GB of the ~52 GB an H100 leaves), else none and a cut block replays its kept tokens (a 27B
    row would keep 2.3 GB: DESIGN.md section 7's rule for such models; 35B-A3B in bf16 leaves an H100 about 5 GB,
    which 8.4 GB of step states would not fit at all)."""
    if not verify_width:
        return 0
    k = verify_width - 1
    return k if mtp or (drafter is not None and fits(k)) else 0


def plan_memory(cfg: Qwen35Config, budget_bytes: int, *, max_seqs: int, max_context: int, page_size: int = 16,
                slots: int | None = None, dtype: torch.dtype = torch.bfloat16, max_prefill_tokens: int = 8192,
                max_kv_pages: int | None = None, mtp: bool = False, weight_bytes_resident: int | None = None,
                extra_workspace: int = 0, drafter: DrafterConfig | None = None,
                verify_width: int = 0, prefill_graph_tokens: int = 0, chained: bool = False) -> MemoryPlan:
    """Fit weights, state slots, block tables and workspace into ``budget_bytes``; the KV pool gets the rest
    (at most ``max_kv_pages``). Raises ``MemoryError`` when not even one ``max_context`` sequence fits. ``mtp``
    adds the MTP head: its weights, its KV layer in every page and one hidden vector per slot. A quantized model
    passes the bytes its loaded weights really hold (``weight_bytes_resident``, the MTP head's included) and its
    dequantization transient (``extra_workspace``); otherwise the logical parameters are counted at ``dtype``.
    ``prefill_graph_tokens``: the longest prefill piece with a CUDA graph, whose pool the workspace keeps.
    ``drafter`` adds a DFlash drafter: its weights, its context K/V in every page, its scratch pages and
    transients. ``verify_width`` (k + 1 of a backend) adds the round's graphs (``spec_graph_bytes``, the
    drafter's verify taps with a drafter) for ``max_seqs`` blocks of that many tokens, and with ``mtp`` the draft's
    scratch pages in the k/v pools; k step slots per row where `verify_steps` keeps them. ``chained`` (plain
    decoding only) keeps one chained backup slot per row."""
    if max_seqs <= 0 or max_context <= 0 or page_size <= 0 or max_prefill_tokens <= 0:
        raise ValueError("max_seqs, max_context, page_size and max_prefill_tokens must be positive")
    name = _DTYPE_NAMES[dtype]
    slots = max_seqs if slots is None else slots
    pages_per_seq = kv_pages_for_tokens(max_context, page_size)
    w = weight_bytes(cfg, name, (TEXT, MTP) if mtp else (TEXT,)) if weight_bytes_resident is None \
        else weight_bytes_resident
    hidden = cfg.hidden_size * torch.finfo(dtype).bits // 8 if mtp else 0
    per_slot = gdn_state_bytes_per_sequence(cfg, name) + hidden
    tables = (max_seqs + 1) * pages_per_seq * 4
    work = workspace_bytes(cfg, max_prefill_tokens, max_seqs, dtype) + extra_workspace + \
        prefill_graph_bytes(cfg, prefill_graph_tokens, dtype, max_seqs)
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
    steps = verify_steps(verify_width, mtp, drafter, max_seqs,
                         lambda k: max_seqs * k * per_slot * STEP_STATE_SHARE <= budget_bytes - w)
    chain = int(chained and not verify_width)
    state = (slots + 1 + max_seqs * (steps + chain)) * per_slot
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
                      step_slots=steps, chain_slots=chain, prefill_graph_tokens=prefill_graph_tokens,
                      drafter=_drafter_geometry(drafter))


def _drafter_geometry(drafter: DrafterConfig | None) -> tuple[int, int, int] | None:
    """A plan's ``drafter`` field: the drafter's (layers, KV heads, head dim), whose K/V every page holds."""
    return None if drafter is None else (drafter.num_hidden_layers, drafter.num_key_value_heads, drafter.head_dim)


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
    draft's scratch pages in rank 0's k/v pools, and `verify_steps`' step slots per row (every rank's GDN layers);
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
            prefill_graph_bytes(cfg, prefill_graph_tokens, dtype, max_seqs) for _ in memory]
    need = None if drafter is None else drafter_needs(cfg, drafter, page_size, dtype, max_prefill_tokens, max_seqs)
    if need is not None:  # rank 0's (its page bytes after the MTP scratch below, which is counted without them)
        memory[0] = dataclasses.replace(memory[0], weight_bytes=memory[0].weight_bytes + need.weight_bytes)
    steps = verify_steps(verify_width, mtp, drafter, max_seqs,
                         lambda k: all(max_seqs * k * m.slot_bytes * STEP_STATE_SHARE <= b - m.weight_bytes
                                       for m, b in zip(memory, budgets)))
    state_slots = slots + 1 + max_seqs * steps
    hidden = state_slots * cfg.hidden_size * torch.finfo(dtype).bits // 8 if mtp else 0
    scratch = mtp_scratch_pages(page_size, verify_width - 1) if mtp and verify_width else 0
    if mtp:  # on rank 0: the MTP layer's gathered KV (as plan_memory), its hidden per slot, the draft's scratch
        work[0] += max_seqs * (max_context + 8) * kv_bytes_per_token(cfg, name) + hidden + \
            (max_seqs + 1) * scratch * memory[0].page_bytes
    if need is not None:
        memory[0] = dataclasses.replace(memory[0], page_bytes=memory[0].page_bytes + need.page_bytes)
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
