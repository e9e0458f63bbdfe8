"""ReferenceProgram: the Program protocol on CPU torch with the reference model and real paged accounting.

Resource transactions run here (plan, start, advance, abort, backfill proof); the physical transitions are in
`transitions.py`, the model transactions in `execution.py`, the invariants in `invariants.py`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from ninfer.contracts import (CheckpointId, CheckpointInfo, EngineFailure, Infeasible, PendingBatch, ProgramLimits,
                              ResourceChoice, ResourcePlan, ResourceResult, ResourceUsage, RowDecision,
                              RunningTransaction, SequenceHandle, StalePlan, TransitionKind, token_digest)
from ninfer.reference.model import ReferenceModel

from . import execution, invariants, transitions
from .config import ReferenceProgramConfig
from .records import ActiveSequence, Checkpoint
from .scoring import CausalScoring
from .stores import HostTier, KVPages, StateSlots

SLOTS_PER_SEQUENCE = 2  # the live state and the publication slot reserved at activation


class ReferenceProgram:
    def __init__(self, model: ReferenceModel, config: ReferenceProgramConfig = ReferenceProgramConfig()):
        cfg = model.cfg
        self.model, self.config = model, config.resolved(cfg)
        if model.dtype != self.config.dtype:
            raise ValueError(f"model dtype {model.dtype} differs from the Program's {self.config.dtype}")
        c = self.config
        self.limits = ProgramLimits(c.max_concurrency, c.max_context, cfg.vocab_size, c.eos_token_ids)
        self.pages = KVPages(cfg, c.kv_pages, c.page_size, c.dtype)
        self.slots = StateSlots(cfg, c.total_slots, c.dtype)
        self.host = HostTier(c.host_bytes, c.state_bytes(cfg))
        self.page_bytes = c.page_bytes(cfg)
        self.seqs: dict[int, ActiveSequence] = {}  # live state slot -> sequence
        self.ckpts: dict[CheckpointId, Checkpoint] = {}  # published, inactive
        self.prepared: dict[int, ActiveSequence] = {}  # txn id -> materialization past its claim stage
        self._open: dict[int, dict[str, Any]] = {}  # txn id -> progress of a started transition
        self._revision = 0
        self._generation = itertools.count(1)
        self._ids = itertools.count(1)

    @classmethod
    def from_artifact(cls, path: str | Path, config: ReferenceProgramConfig = ReferenceProgramConfig()):
        """The Program over a .ninfer artifact's text weights (MTP is not used by the reference Program)."""
        from ninfer.models.qwen3_5.params import TEXT
        from ninfer.reference.weights import load_model

        return cls(load_model(path, features=(TEXT,), dtype=config.dtype), config)

    @property
    def resource_revision(self) -> int:
        return self._revision

    def bump_revision(self) -> None:
        self._revision += 1

    # ---- sizing --------------------------------------------------------------------------------------------
    def root_pages(self, choice: ResourceChoice) -> int:
        """The full-growth reservation: prompt plus every new token (the last one is never consumed, but the
        margin keeps the formula the fast Program's)."""
        return self.config.pages_for(len(choice.prompt) + choice.max_new_tokens)

    def need(self, choice: ResourceChoice) -> int:
        """Pages a materialization takes from the pool: all but the source's full pages, which are shared."""
        shared = 0
        if choice.source is not None:
            shared = len(self.checkpoint(choice.source).tokens) // self.config.page_size
        return self.root_pages(choice) - shared

    def reserved(self) -> int:
        live = itertools.chain(self.seqs.values(), self.prepared.values())
        return sum(s.reserve_left for s in live)

    def free_pages(self) -> int:
        """Pages neither referenced nor promised to an active sequence's growth."""
        return self.pages.alloc.available - self.reserved()

    def releasable(self, victims: Sequence[CheckpointId], keep: CheckpointId | None) -> tuple[int, int]:
        """(pages, device slots) that releasing every listed checkpoint (but `keep`) would return, exactly:
        a page comes back when the victims hold all of its references."""
        held: Counter[int] = Counter()
        slots = 0
        for cid in victims:
            if cid in self.ckpts and cid != keep:
                held.update(self.ckpts[cid].table)
                slots += self.ckpts[cid].slot is not None
        pages = sum(1 for p, n in held.items() if self.pages.alloc.refs[p] == n)
        return pages, slots

    def boundary_snapshots(self) -> int:
        """Unpublished chunk-boundary snapshots: bounded by checkpoint_slots, so they never take a slot that an
        admission from root would need (see docs/reference-program.md)."""
        live = itertools.chain(self.seqs.values(), self.prepared.values())
        return sum(1 for s in live for ck in s.snapshots if ck.boundary)

    # ---- resource transactions -----------------------------------------------------------------------------
    def plan(self, choice: ResourceChoice) -> ResourcePlan | Infeasible:
        kind = choice.kind
        if kind is TransitionKind.MATERIALIZE:
            verdict = self._materialize_verdict(choice)
            if verdict is not None:
                return verdict
        elif kind is TransitionKind.CAPTURE:
            if not self.sequence(choice.handle).snapshots:
                return Infeasible("no captured snapshot to publish", permanent=False)
        elif kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
            self.sequence(choice.handle)
        elif kind is TransitionKind.PLACE:
            verdict = self._place_verdict(choice)
            if verdict is not None:
                return verdict
        return ResourcePlan(choice, self._revision, next(self._ids))

    def _materialize_verdict(self, choice: ResourceChoice) -> Infeasible | None:
        root = self.root_pages(choice)
        if root > self.pages.alloc.total or len(choice.prompt) + choice.max_new_tokens > self.config.max_context:
            return Infeasible(f"needs {root} KV pages of {self.pages.alloc.total} and "
                              f"{len(choice.prompt) + choice.max_new_tokens} of {self.config.max_context} "
                              "context positions even from root", permanent=True)
        if choice.source is not None and len(self.checkpoint(choice.source).tokens) >= len(choice.prompt):
            raise EngineFailure(f"source checkpoint {choice.source.value} is not a strict prefix of the prompt")
        rel_pages, rel_slots = self.releasable(choice.victims, choice.source)
        if self.need(choice) > self.free_pages() + rel_pages or \
                SLOTS_PER_SEQUENCE > len(self.slots.free) + rel_slots:
            return Infeasible("not enough free KV pages or state slots now", permanent=False)
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
        their commitments, and unpublished boundary snapshots at most the checkpoint allowance."""
        donor_slots = {d.slot for d in donors}
        kept = [s for slot, s in self.seqs.items() if slot not in donor_slots]
        held_pages = sum(len(s.table) + s.reserve_left for s in kept)
        held_slots = SLOTS_PER_SEQUENCE * (len(kept) + 2) + self.config.checkpoint_slots
        return (held_pages + self.root_pages(borrower) + self.root_pages(head) <= self.pages.alloc.total
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
        device = len(ck.table) * self.page_bytes + (self.host.state_bytes if on_device else 0)
        return CheckpointInfo(cid, len(ck.tokens), token_digest(ck.tokens), device,
                              0 if on_device else self.host.state_bytes)

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

    def scoring(self) -> CausalScoring:
        """The CausalScoring core over this Program's model: temporary states only, no store is touched."""
        return CausalScoring(self.model)

    # ---- accounting ----------------------------------------------------------------------------------------
    def resource_usage(self) -> ResourceUsage:
        return invariants.resource_usage(self)

    def check_invariants(self) -> None:
        invariants.check_invariants(self)
