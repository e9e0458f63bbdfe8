"""ResourceManager: logical lanes, the checkpoint catalog, SessionIndex, prefix index and the cache policy.

Pure Python. It makes the logical choices (which frontiers to capture, which checkpoint a request resumes from,
which checkpoints give way, demoted or deleted, and which come back) and adopts the Program's complete
ResourceResults; it keeps no mirror of device/host bytes, page refcounts or allocator free space (those facts
belong to the Program). The value of each checkpoint is `retention.Worth`, the frontiers captured and the output
ends retained are `retention`'s plans; whether a host replica is copied back or recomputed, and whether a
checkpoint leaving the device is demoted or deleted, is `cost_model.CostModel`'s verdict on the Program's
`CostFacts`, and which replica comes back is `placement.Placement`'s (docs/context-cache.md).
"""

from __future__ import annotations

import itertools
from typing import Iterator

from ninfer.contracts import (CheckpointId, CheckpointInfo, CostFacts, EngineFailure, LaneState, ResourceChoice,
                              ResourceResult, ResourceUsage, SequenceHandle, TransitionKind, check_lane_transition,
                              token_digest)

from .cache_stats import CacheStats, Miss
from .catalog_entry import CatalogEntry, SessionBinding
from .catalog_index import PrefixIndex
from .cost_model import CostModel, Verdict
from .placement import Placement
from .retention import Retention, TerminalFacts, Worth, capture_plan, terminal_retention


class ResourceManager:
    def __init__(self, max_concurrency: int, *, prefix_caching: bool = True, costs: CostFacts = CostFacts()):
        self.lanes: list[LaneState] = [LaneState.FREE] * max_concurrency
        self.lane_owner: list[int | None] = [None] * max_concurrency
        self.catalog: dict[CheckpointId, CatalogEntry] = {}
        self.sessions: dict[str, SessionBinding] = {}
        self.index = PrefixIndex()
        self.prefix_caching = prefix_caching
        self.stats = CacheStats()
        self._claims: dict[int, CheckpointId] = {}  # request -> pinned source during materialization
        self._sources: dict[int, CheckpointId] = {}  # active request -> the checkpoint it resumed from
        # materializing request -> the never-hit checkpoints on its prompt's path below its source (see adopt)
        self._below: dict[int, tuple[CheckpointId, ...]] = {}
        self._planned: dict[int, dict[int, Retention]] = {}  # request -> capture frontier -> its class
        self._miss: dict[int, Miss] = {}  # request -> why its last lookup found nothing
        self.costs = CostModel(costs)
        self.placement = Placement(self.costs)
        self._clock = 0

    @property
    def by_length(self) -> dict[int, dict[str, set[CheckpointId]]]:
        return self.index.by_length

    def free_lane(self) -> int | None:
        for i, s in enumerate(self.lanes):
            if s is LaneState.FREE:
                return i
        return None

    def _set_lane(self, lane: int, state: LaneState, owner: int | None) -> None:
        check_lane_transition(self.lanes[lane], state)
        self.lanes[lane], self.lane_owner[lane] = state, owner

    def enter_terminal(self, lane: int) -> None:
        self._set_lane(lane, LaneState.TERMINAL_PENDING, self.lane_owner[lane])

    def worth(self, entry: CatalogEntry, bound: set[CheckpointId] | None = None) -> Worth:
        bound = self._bound() if bound is None else bound
        return Worth.of(entry.info, entry.retention, entry.hits, self._clock - entry.last_used, entry.info.id in bound,
                        entry.superseded)

    def _bound(self) -> set[CheckpointId]:
        return {b.checkpoint for b in self.sessions.values()}

    def _bytes_per_token(self) -> float:
        entries = [e.info for e in self.catalog.values() if e.info.tokens]
        if not entries:
            return 1.0
        return sum(i.device_bytes + i.host_bytes for i in entries) / sum(i.tokens for i in entries)

    def victims(self, exclude: CheckpointId | None = None) -> tuple[CheckpointId, ...]:
        """Inactive, unpinned checkpoints, unprotected first, then lowest value first: what a transition may
        displace."""
        bound = self._bound()
        free = [(self.worth(e, bound).rank, e.info.id.value, e.info.id) for e in self.catalog.values()
                if e.pins == 0 and e.info.id != exclude]
        return tuple(cid for _, _, cid in sorted(free))

    def _demote(self, victims: tuple[CheckpointId, ...]) -> frozenset[CheckpointId]:
        """Victims worth a host replica: protected, and cheaper to copy out and back than to recompute."""
        bound = self._bound()
        return frozenset(c for c in victims if self.worth(self.catalog[c], bound).demote and
                         self.costs.leave_device(self.catalog[c].info) is Verdict.DEMOTE)

    def find_source(self, prompt: tuple[int, ...], session_key: str | None) -> CatalogEntry | None:
        """The deepest published checkpoint that is a strict prefix of the prompt (the last prompt token must
        still run to give the first output token's logits), where a host replica is taken only when the cost
        model says copying it in beats prefilling from the deepest device checkpoint below it. The session's
        binding is tried first: only deeper frontiers of the prefix index are digested after it (and shallower
        ones only while the candidates are host replicas)."""
        if not self.prefix_caching:
            return None
        floor, bound = 0, None
        binding = self.sessions.get(session_key) if session_key is not None else None
        if binding is not None:
            entry = self.catalog[binding.checkpoint]
            n = entry.info.tokens
            if n < len(prompt) and token_digest(prompt[:n]) == entry.info.digest:
                floor, bound = n, entry
        below = () if bound is not None and bound.info.on_device else self._candidates(prompt, 0, floor)
        host = None  # the deepest host replica met so far
        for entry in itertools.chain(self._candidates(prompt, floor, len(prompt)), (bound,) if bound else (), below):
            if entry.info.on_device:
                return self._weigh(host, entry)
            host = host or entry
        return self._weigh(host, None)

    def _candidates(self, prompt: tuple[int, ...], lo: int, hi: int) -> Iterator[CatalogEntry]:
        """One checkpoint per matching frontier, deepest first: device-resident before a replica, then the most
        recently used."""
        for ids in self.index.matches(prompt, lo, hi):
            yield max((self.catalog[c] for c in ids), key=lambda e: (e.info.on_device, e.last_used, e.info.id.value))

    def _weigh(self, host: CatalogEntry | None, device: CatalogEntry | None) -> CatalogEntry | None:
        """The deeper host replica when copying it in beats prefilling from `device` (or root), else `device`."""
        below = device.info.tokens if device is not None else 0
        if host is not None and self.costs.resume(host.info, below) is Verdict.PROMOTE:
            return host
        return device

    def materialize_choice(self, rid: int, prompt: tuple[int, ...], max_new_tokens: int, session_key: str | None,
                           sampling: object, seed: int, *, hints: tuple[int, ...] = (),
                           from_root: bool = False, media: object = None) -> ResourceChoice:
        source = None if from_root else self.find_source(prompt, session_key)
        sid = source.info.id if source else None
        if source is None and not from_root:
            self._miss[rid] = self._miss_cause(prompt)
        victims = self.victims(exclude=sid)
        captures, capture_victims = self._captures(rid, prompt, source.info.tokens if source else 0, hints, victims)
        return ResourceChoice(TransitionKind.MATERIALIZE, request_id=rid, prompt=prompt, max_new_tokens=max_new_tokens,
                              source=sid, victims=victims, capture_victims=capture_victims,
                              demote=self._demote(victims), captures=captures, sampling=sampling, seed=seed,
                              media=media)

    def _miss_cause(self, prompt: tuple[int, ...]) -> Miss:
        if not self.prefix_caching:
            return Miss.DISABLED
        return Miss.EVICTED if self.index.was_deleted(prompt) else Miss.COLD

    def _captures(self, rid: int, prompt: tuple[int, ...], reused: int, hints: tuple[int, ...],
                  victims: tuple[CheckpointId, ...]) -> tuple[tuple[int, ...], int]:
        """The frontiers worth capturing, most valuable first, and how many of the victims a capture may displace
        (`retention.capture_plan`)."""
        if not self.prefix_caching:
            self._planned[rid] = {}
            return (), 0
        bound = self._bound()
        planned, displace = capture_plan(len(prompt), reused, hints, lambda f: self.index.holds(prompt, f),
                                         self._bytes_per_token(),
                                         (self.worth(self.catalog[c], bound).rank for c in victims))
        self._planned[rid] = planned
        return tuple(planned), displace

    def begin_materialize(self, rid: int, lane: int, choice: ResourceChoice) -> None:
        self._set_lane(lane, LaneState.MATERIALIZING, rid)
        if choice.source is not None:
            self.catalog[choice.source].pins += 1
            self._claims[rid] = choice.source
            src = self.catalog[choice.source]
            if src.continued:
                self._below[rid] = tuple(c for ids in self.index.matches(choice.prompt, 0, src.info.tokens)
                                         for c in ids if self.catalog[c].origin == src.origin)

    def capture_choice(self, handle: SequenceHandle, frontier: int) -> ResourceChoice | None:
        if not self.prefix_caching:
            return None
        return ResourceChoice(TransitionKind.CAPTURE, handle=handle, capture_at=frontier)

    def eviction_choice(self, cap: int | None, usage: ResourceUsage, share: float) -> ResourceChoice | None:
        """Past `cap` inactive checkpoints, delete the lowest-valued ones; past `share` of the KV pages held by
        inactive checkpoints only (the Program's summary), delete the lowest-valued one."""
        excess = len(self.catalog) - cap if cap is not None else 0
        if usage.checkpoint_pages > share * usage.total_pages:
            excess = max(excess, 1)
        victims = self.victims()[:max(excess, 0)]
        return ResourceChoice(TransitionKind.DELETE, victims=victims) if victims else None

    def placement_choice(self, revision: int) -> ResourceChoice | None:
        return self.placement.choice(revision, self.catalog)

    def defer_placement(self, revision: int) -> None:
        self.placement.defer(revision)

    def terminal_choice(self, handle: SequenceHandle, facts: TerminalFacts) -> ResourceChoice:
        """Retain the end of the output in the class `terminal_retention` gives it; release otherwise."""
        retention = terminal_retention(facts) if self.prefix_caching else None
        if retention is not None:
            self._planned[facts.request_id] = {facts.frontier: retention}
            return ResourceChoice(TransitionKind.RETAIN, handle=handle, capture_at=facts.frontier)
        return ResourceChoice(TransitionKind.RELEASE, handle=handle)

    def release_choice(self, handle: SequenceHandle) -> ResourceChoice:
        return ResourceChoice(TransitionKind.RELEASE, handle=handle)

    def adopt(self, result: ResourceResult, *, rid: int | None, lane: int | None, session_key: str | None = None,
              publication_order: int = 0) -> None:
        """Take the Program's complete result; the only way the catalog and lanes change after a transition."""
        self._clock += 1
        for cid in result.released:
            self._release(cid)
        for info in result.placed:
            self._place(info)
        if rid is not None and rid in self._claims:
            self._unpin(rid, result)
        if result.kind is TransitionKind.MATERIALIZE and result.succeeded and rid is not None:
            cause = self._miss.pop(rid, Miss.COLD if self.prefix_caching else Miss.DISABLED)
            self.stats.lookup(result.reused_tokens, cause)
        planned = self._planned.get(rid, {}) if rid is not None else {}
        for info in result.published:
            retention = planned.get(info.tokens, Retention.SESSION if result.kind is TransitionKind.RETAIN
                                    else Retention.PREFIX)
            self._publish(info, retention, session_key, publication_order, rid)
        if result.published and rid in self._sources:
            self._supersede(rid)
        if result.kind in (TransitionKind.RETAIN, TransitionKind.RELEASE) or (
                result.kind is TransitionKind.MATERIALIZE and not result.succeeded):
            for table in (self._planned, self._miss, self._sources, self._below):
                table.pop(rid, None)
        if lane is not None:
            self._adopt_lane(result, lane, rid)

    def _supersede(self, rid: int) -> None:
        """The request resumed from its source and published deeper: its conversation's later turns resume from
        those, so the source is superseded. When the source's own request had continued an earlier prompt's or
        output's end (an agent loop's later turn), the turn boundaries it captured below the source and that never
        earned a hit (its message ends, its point before `<think>`) are superseded too: nothing reuses them but a
        branch. Left protected, an idle conversation's dead boundaries, ever deeper, outrank every new
        conversation's live ones and crowd them out. The boundaries of a request that started from anything else
        (root, the shared header, a user turn's point before `<think>`) stay: its point before `<think>` is where
        a user turn after the whole tool loop resumes (docs/context-cache.md, "Concurrent conversations")."""
        for cid in (self._sources[rid], *self._below.get(rid, ())):
            entry = self.catalog.get(cid)
            if entry is not None and (cid == self._sources[rid] or entry.hits == 0):
                entry.superseded = True

    def _release(self, cid: CheckpointId) -> None:
        entry = self.catalog.pop(cid, None)
        if entry is None:
            raise EngineFailure(f"Program released unknown checkpoint {cid.value}")
        if entry.pins:
            raise EngineFailure(f"Program released pinned checkpoint {cid.value}")
        self.index.remove(entry.info, deleted=True)
        for key in [k for k, b in self.sessions.items() if b.checkpoint == cid]:
            del self.sessions[key]
        self.stats.deletions += 1

    def _place(self, info: CheckpointInfo) -> None:
        entry = self.catalog.get(info.id)
        if entry is None:
            raise EngineFailure(f"Program placed unknown checkpoint {info.id.value}")
        if entry.info.on_device != info.on_device:
            if info.on_device:
                self.stats.promotions += 1
                self.placement.placed(info.id)
            else:
                self.stats.demotions += 1
        entry.info = info

    def _unpin(self, rid: int, result: ResourceResult) -> None:
        source = self._claims.pop(rid)
        entry = self.catalog[source]
        entry.pins -= 1
        if result.succeeded and result.kind is TransitionKind.MATERIALIZE:
            entry.last_used, entry.hits = self._clock, entry.hits + 1
            self._sources[rid] = source
            if not entry.info.on_device:
                self.stats.host_resumes += 1
                self.placement.earned(source)

    def _publish(self, info: CheckpointInfo, retention: Retention, session_key: str | None, order: int,
                 rid: int | None) -> None:
        if info.id in self.catalog:
            raise EngineFailure(f"checkpoint {info.id.value} published twice")
        source = self.catalog.get(self._sources.get(rid)) if rid is not None else None
        continued = source is not None and source.retention in (Retention.PREFIX, Retention.OUTPUT, Retention.SESSION)
        self.catalog[info.id] = CatalogEntry(info, retention, self._clock, origin=rid, continued=continued)
        self.index.add(info)
        if retention in (Retention.OUTPUT, Retention.SESSION):
            self.stats.retained += 1
            if session_key is not None:
                self._bind_session(session_key, info.id, order)
        else:
            self.stats.captures += 1

    def _adopt_lane(self, result: ResourceResult, lane: int, rid: int | None) -> None:
        if result.kind is TransitionKind.MATERIALIZE:
            self._set_lane(lane, LaneState.ACTIVE if result.succeeded else LaneState.FREE,
                           rid if result.succeeded else None)
        elif result.kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
            self._set_lane(lane, LaneState.FREE, None)

    def _bind_session(self, key: str, cid: CheckpointId, order: int) -> None:
        """Only a later publication_order may replace a binding; the replaced checkpoint stays cached."""
        old = self.sessions.get(key)
        if old is None or order > old.publication_order:
            self.sessions[key] = SessionBinding(cid, order)

    def clear(self) -> None:
        """Engine failure: forget every lane, claim, checkpoint and binding (the Program is discarded too)."""
        self.lanes = [LaneState.FREE] * len(self.lanes)
        self.lane_owner = [None] * len(self.lanes)
        self.catalog.clear()
        self.sessions.clear()
        self.index = PrefixIndex()
        for table in (self._claims, self._planned, self._miss, self._sources, self._below):
            table.clear()
        self.placement.clear()

    def check_invariants(self) -> None:
        for i, (s, owner) in enumerate(zip(self.lanes, self.lane_owner)):
            assert (s is LaneState.FREE) == (owner is None), f"lane {i} is {s.value} with owner {owner}"
        owners = [o for o in self.lane_owner if o is not None]
        assert len(owners) == len(set(owners)), "a request owns two lanes"
        pins: dict[CheckpointId, int] = {}
        for cid in self._claims.values():
            pins[cid] = pins.get(cid, 0) + 1
        for cid, entry in self.catalog.items():
            assert entry.info.id == cid, "catalog key differs from its checkpoint id"
            assert entry.pins == pins.get(cid, 0), f"checkpoint {cid.value} pins {entry.pins} != claims"
        for key, b in self.sessions.items():
            assert b.checkpoint in self.catalog, f"session {key!r} bound to a released checkpoint"
        self.index.check(self.catalog)
        s = self.stats
        assert s.hits + sum(s.misses.values()) == s.lookups, "cache lookups do not add up"
