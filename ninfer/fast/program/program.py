"""FastProgram: the Program protocol over FastModel's device pools, indistinguishable to the Engine from the
reference Program.

Memory is planned once at start from a byte budget; afterwards only page ids, slot ids and block-table rows move.
Resource transactions run here (plan, start, advance, abort, backfill proof); the physical transitions are in
`transitions.py`, the model transactions in `execution.py`, the invariants in `invariants.py`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ninfer.contracts import (CheckpointId, CheckpointInfo, EngineFailure, Infeasible, PendingBatch, ProgramLimits,
                              ResourceChoice, ResourcePlan, ResourceResult, ResourceUsage, RowDecision,
                              RunningTransaction, SequenceHandle, StalePlan, TransitionKind, token_digest)
from ninfer.fast.graph_runner import DecodeGraphRunner
from ninfer.fast.model import FastModel
from ninfer.fast.sampling import DeviceSampler
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.pages import PageAllocator

from . import execution, invariants, transitions
from .config import FastProgramConfig
from .records import ActiveSequence, Checkpoint
from .stores import DeviceState, HostTier, IdPool

SLOTS_PER_SEQUENCE = 2  # the live state and the publication slot reserved at activation


class FastProgram:
    def __init__(self, model: FastModel, config: FastProgramConfig):
        cfg, plan = model.cfg, model.plan
        self.model, self.config = model, config.resolved(cfg)
        c = self.config
        if plan.max_seqs != c.max_concurrency or plan.slots != c.usable_slots + c.max_concurrency or \
                plan.page_size != c.page_size or plan.max_context < c.max_context:
            raise ValueError(f"the model's memory plan {plan} was not made by FastProgramConfig.plan for {c}")
        self.limits = ProgramLimits(c.max_concurrency, c.max_context, cfg.vocab_size, c.eos_token_ids)
        self.device = model.device
        self.dev = DeviceState(model.pools)
        self.pages = PageAllocator(plan.num_pages)
        self.slots = IdPool(c.usable_slots, "GDN state slot")
        self.rows = IdPool(c.max_concurrency, "block-table row")
        self.page_bytes = plan.kv_bytes // (plan.num_pages + 1)
        self.state_bytes = plan.state_bytes // (plan.slots + 1)
        self.host = HostTier(c.host_bytes, self.state_bytes)
        # sampling tables live on block-table rows; the naive model runs the naive sampling ops
        self.sampler = DeviceSampler(cfg.vocab_size, c.max_concurrency, c.max_concurrency, model.device,
                                     kernels="naive" if model.kernels.name == "naive" else "triton",
                                     eos_token_ids=c.eos_token_ids)
        # the decode graph starts with each row's backup copy (live slot -> the backup slot of its table row)
        self.runner = DecodeGraphRunner(model, c.max_concurrency, sampler=self.sampler,
                                        backup_base=c.backup_slot(0))
        if self.runner.use_graphs:
            _warm_prefill(model, min(c.max_prefill_tokens, c.max_context))
        # one graph per exact B and sampling variant on CUDA (the sampler's own B = 1 graphs serve prefill draws);
        # eager on the same buffers elsewhere
        self.runner.capture()
        self.sampler.capture()
        self.seqs: dict[int, ActiveSequence] = {}  # live state slot -> sequence
        self.ckpts: dict[CheckpointId, Checkpoint] = {}  # published, inactive
        self.prepared: dict[int, ActiveSequence] = {}  # txn id -> materialization past its claim stage
        self._open: dict[int, dict[str, Any]] = {}  # txn id -> progress of a started transition
        self._revision = 0
        self._generation = itertools.count(1)
        self._ids = itertools.count(1)

    @classmethod
    def build(cls, cfg: Qwen35Config, source, config: FastProgramConfig, *, budget_bytes: int,
              device: torch.device | str, kernels: str = "triton") -> "FastProgram":
        """Plan the budget, load the weights (`source(logical_name) -> tensor`), allocate the pools once."""
        config = config.resolved(cfg)
        model = FastModel.build(cfg, source, config.plan(cfg, budget_bytes), device, kernels)
        return cls(model, config)

    @classmethod
    def from_artifact(cls, path: str | Path, *, max_concurrency: int, max_context: int,
                      gpu_memory_utilization: float = 0.9, speculative_config: Mapping[str, Any] | None = None,
                      budget_bytes: int | None = None, device: torch.device | str | None = None,
                      kernels: str = "triton", **config: Any) -> "FastProgram":
        """The Program over a .ninfer artifact's text weights. The budget is `budget_bytes`, else (CUDA only)
        `gpu_memory_utilization` of the device's total memory minus what others already use. `config` passes
        further FastProgramConfig fields (page_size, checkpoint_slots, kv_pages, dtype, ...)."""
        from ninfer.artifact import open_artifact
        from ninfer.models.qwen3_5.params import TEXT

        if speculative_config:
            raise NotImplementedError(f"speculative decoding is not implemented in the fast Program yet (asked for "
                                      f"{dict(speculative_config)}); start without --speculative-config")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if budget_bytes is None:
            budget_bytes = _device_budget(gpu_memory_utilization, device)
        settings = FastProgramConfig(max_concurrency=max_concurrency, max_context=max_context, **config)
        with open_artifact(path, features=(TEXT,)) as art:
            _require_dense(art)
            return cls.build(art.config, art.dequantize, settings, budget_bytes=budget_bytes, device=device,
                             kernels=kernels)

    @property
    def resource_revision(self) -> int:
        return self._revision

    def bump_revision(self) -> None:
        self._revision += 1

    # ---- sizing (the reference Program's formulas) -----------------------------------------------------------
    def root_pages(self, choice: ResourceChoice) -> int:
        """The full-growth reservation: prompt plus every new token."""
        return self.config.pages_for(len(choice.prompt) + choice.max_new_tokens)

    def need(self, choice: ResourceChoice) -> int:
        """Pages a materialization takes from the pool: all but the source's full pages, which are shared."""
        shared = 0
        if choice.source is not None:
            shared = len(self.checkpoint(choice.source).tokens) // self.config.page_size
        return self.root_pages(choice) - shared

    def reserved(self) -> int:
        return sum(s.reserve_left for s in itertools.chain(self.seqs.values(), self.prepared.values()))

    def free_pages(self) -> int:
        """Pages neither referenced nor promised to an active sequence's growth."""
        return self.pages.available - self.reserved()

    def releasable(self, victims: Sequence[CheckpointId], keep: CheckpointId | None) -> tuple[int, int]:
        """(pages, device slots) that releasing every listed checkpoint (but `keep`) would return, exactly."""
        held: Counter[int] = Counter()
        slots = 0
        for cid in victims:
            if cid in self.ckpts and cid != keep:
                held.update(self.ckpts[cid].table)
                slots += self.ckpts[cid].slot is not None
        return sum(1 for p, n in held.items() if self.pages.refs[p] == n), slots

    def boundary_snapshots(self) -> int:
        """Unpublished 64-token boundary snapshots: bounded by checkpoint_slots, so they never take a slot that
        an admission from root would need."""
        live = itertools.chain(self.seqs.values(), self.prepared.values())
        return sum(1 for s in live for ck in s.snapshots if ck.boundary)

    # ---- resource transactions -----------------------------------------------------------------------------
    def plan(self, choice: ResourceChoice) -> ResourcePlan | Infeasible:
        kind = choice.kind
        verdict = None
        if kind is TransitionKind.MATERIALIZE:
            verdict = self._materialize_verdict(choice)
        elif kind is TransitionKind.CAPTURE:
            if not self.sequence(choice.handle).snapshots:
                verdict = Infeasible("no captured snapshot to publish", permanent=False)
        elif kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
            self.sequence(choice.handle)
        elif kind is TransitionKind.PLACE:
            verdict = self._place_verdict(choice)
        return verdict or ResourcePlan(choice, self._revision, next(self._ids))

    def _materialize_verdict(self, choice: ResourceChoice) -> Infeasible | None:
        root, total, ctx = self.root_pages(choice), self.pages.total, len(choice.prompt) + choice.max_new_tokens
        if root > total or ctx > self.config.max_context:
            return Infeasible(f"needs {root} KV pages of {total} and {ctx} of {self.config.max_context} context "
                              "positions even from root", permanent=True)
        if choice.source is not None and len(self.checkpoint(choice.source).tokens) >= len(choice.prompt):
            raise EngineFailure(f"source checkpoint {choice.source.value} is not a strict prefix of the prompt")
        rel_pages, rel_slots = self.releasable(choice.victims, choice.source)
        if self.need(choice) > self.free_pages() + rel_pages or \
                SLOTS_PER_SEQUENCE > len(self.slots.free) + rel_slots or not self.rows.free:
            return Infeasible("not enough free KV pages, state slots or block-table rows now", permanent=False)
        return None

    def _place_verdict(self, choice: ResourceChoice) -> Infeasible | None:
        if choice.source is None:
            raise EngineFailure("PLACE names the checkpoint to move in `source`")
        ck = self.checkpoint(choice.source)
        if ck.slot is not None and not self.host.fits():
            return Infeasible("host tier budget is full", permanent=False)
        if ck.slot is None and not self.slots.free:
            return Infeasible("no free device state slot to bring the checkpoint back", permanent=False)
        return None

    def start(self, plan: ResourcePlan) -> RunningTransaction:
        if plan.resource_revision != self._revision:
            raise StalePlan(f"plan sealed at revision {plan.resource_revision}, now {self._revision}")
        txn = RunningTransaction(plan, next(self._ids))
        self._open[txn.txn_id] = {"stage": 0, "released": ()}
        return txn

    def advance(self, txn: RunningTransaction) -> ResourceResult | None:
        progress = self._open.get(txn.txn_id)
        if progress is None:
            raise EngineFailure(f"advance of unknown transaction {txn.txn_id}")
        result = transitions.advance(self, txn, progress)
        if result is not None:
            del self._open[txn.txn_id]
        return result

    def abort(self, txn: RunningTransaction) -> ResourceResult:
        progress = self._open.pop(txn.txn_id, None)
        if progress is None:
            raise EngineFailure(f"abort of unknown transaction {txn.txn_id}")
        return transitions.abort(self, txn, progress)

    def backfill_feasible(self, head: ResourceChoice, donors: Sequence[SequenceHandle],
                          borrower: ResourceChoice) -> bool:
        """Once the donors end and every inactive checkpoint is released, the sequences that stay hold at most
        their commitments, and unpublished boundary snapshots at most the checkpoint allowance; rows are one per
        lane, so the Engine's lane bound covers them."""
        donor_slots = {d.slot for d in donors}
        kept = [s for slot, s in self.seqs.items() if slot not in donor_slots]
        held_pages = sum(len(s.table) + s.reserve_left for s in kept)
        held_slots = SLOTS_PER_SEQUENCE * (len(kept) + 2) + self.config.checkpoint_slots
        return (held_pages + self.root_pages(borrower) + self.root_pages(head) <= self.pages.total
                and held_slots <= self.slots.total)

    # ---- lookups -------------------------------------------------------------------------------------------
    def sequence(self, handle: SequenceHandle | None) -> ActiveSequence:
        seq = self.seqs.get(handle.slot) if handle is not None else None
        if seq is None or seq.handle != handle:
            raise EngineFailure(f"stale or unknown sequence handle {handle}")
        return seq

    def checkpoint(self, cid: CheckpointId) -> Checkpoint:
        ck = self.ckpts.get(cid)
        if ck is None:
            raise EngineFailure(f"unknown checkpoint {cid.value}")
        return ck

    def new_handle(self, slot: int) -> SequenceHandle:
        return SequenceHandle(slot, next(self._generation))

    def new_checkpoint_id(self) -> CheckpointId:
        return CheckpointId(next(self._ids))

    def checkpoint_info(self, cid: CheckpointId) -> CheckpointInfo:
        ck = self.checkpoint(cid)
        on_device = ck.slot is not None
        device = len(ck.table) * self.page_bytes + (self.state_bytes if on_device else 0)
        return CheckpointInfo(cid, len(ck.tokens), token_digest(ck.tokens), device,
                              0 if on_device else self.state_bytes)

    # ---- model transactions ----------------------------------------------------------------------------------
    def prefill(self, handle: SequenceHandle, max_tokens: int, mask: Any | None = None) -> PendingBatch | None:
        return execution.prefill(self, handle, max_tokens, mask)

    def decode(self, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None = None) -> PendingBatch:
        return execution.decode(self, handles, masks)

    def control(self, handle: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        return execution.control(self, handle, tokens)

    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
        execution.commit(self, batch, decisions)

    def abort_pending(self, batch: PendingBatch) -> None:
        execution.abort_pending(self, batch)

    def prompt_remaining(self, handle: SequenceHandle) -> int:
        seq = self.sequence(handle)
        return len(seq.prompt) - seq.prompt_pos

    # ---- accounting ----------------------------------------------------------------------------------------
    def resource_usage(self) -> ResourceUsage:
        return invariants.resource_usage(self)

    def check_invariants(self) -> None:
        invariants.check_invariants(self)


def _warm_prefill(model: FastModel, tokens: int) -> None:
    """One full prefill piece on the dummy slot and row before serving (vLLM's profile run): every prefill kernel
    compiles and every autotuner settles now, not in the middle of the first long request."""
    plan = model.plan
    model.prefill(torch.zeros(tokens, dtype=torch.long, device=model.device), plan.dummy_slot, plan.dummy_row, 0)
    torch.cuda.synchronize(model.device)


def _require_dense(art) -> None:
    """The fast Program has kernels for dense weights only: a quantized artifact fails at start rather than running
    silently dequantized at several times the memory and bandwidth its format promises."""
    quantized = sorted({(o.name, o.format) for o in (art.objects[b.object] for b in art.bindings.values())
                        if o.format != "dense"})
    if quantized:
        formats = ", ".join(sorted({f for _, f in quantized}))
        raise NotImplementedError(f"the fast Program has no kernels for {formats} weights ({len(quantized)} "
                                  f"objects, e.g. {quantized[0][0]!r}); convert the checkpoint with dense weights "
                                  "(ninfer convert --dtype bfloat16) or run it on --program reference")


def _device_budget(utilization: float, device: torch.device) -> int:
    """vLLM's meaning: the Program may use `utilization` of the device's total memory, less what other processes
    and this one already hold."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"no CUDA device for gpu_memory_utilization on {device}: pass budget_bytes")
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    free, total = torch.cuda.mem_get_info(device)
    budget = int(total * utilization) - (total - free)
    if budget <= 0:
        raise MemoryError(f"gpu_memory_utilization {utilization} of {total / 2**30:.1f} GiB leaves nothing: "
                          f"{(total - free) / 2**30:.1f} GiB are already in use")
    return budget
