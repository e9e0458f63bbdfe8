"""ResourceManager: logical lanes, the checkpoint catalog, SessionIndex, prefix index and cache policy.

Pure Python. It makes logical choices and adopts the Program's complete ResourceResults; it keeps no mirror of
device/host bytes, page refcounts or allocator free space (those facts belong to the Program).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ninfer.contracts import (CheckpointId, CheckpointInfo, EngineFailure, LaneState, ResourceChoice,
                              ResourceResult, SequenceHandle, TransitionKind, check_lane_transition, token_digest)


class Retention(enum.Enum):
    PREFIX = "prefix"  # a prompt-end checkpoint: any request whose prompt starts with it may reuse it
    SESSION = "session"  # a finished conversation's frontier, bound to a session key


@dataclass
class CatalogEntry:
    info: CheckpointInfo
    retention: Retention
    session_key: str | None
    last_used: int  # logical clock of the last hit or publication (LRU victim order)
    pins: int = 0  # materializations currently reading this checkpoint as their source


@dataclass(frozen=True)
class SessionBinding:
    checkpoint: CheckpointId
    publication_order: int


class ResourceManager:
    def __init__(self, max_concurrency: int, *, prefix_caching: bool = True):
        self.lanes: list[LaneState] = [LaneState.FREE] * max_concurrency
        self.lane_owner: list[int | None] = [None] * max_concurrency
        self.catalog: dict[CheckpointId, CatalogEntry] = {}
        self.sessions: dict[str, SessionBinding] = {}
        # Prefix candidate index: frontier length -> digest of the tokens before it -> checkpoints. A lookup
        # digests the prompt once per distinct frontier length, deepest first.
        self.by_length: dict[int, dict[str, set[CheckpointId]]] = {}
        self.prefix_caching = prefix_caching
        self._claims: dict[int, CheckpointId] = {}  # request -> pinned source during materialization
        self._clock = 0

    # ---- lanes ---------------------------------------------------------------------------------------------
    def free_lane(self) -> int | None:
        for i, s in enumerate(self.lanes):
            if s is LaneState.FREE:
                return i
        return None

    def _set_lane(self, lane: int, state: LaneState, owner: int | None) -> None:
        check_lane_transition(self.lanes[lane], state)
        self.lanes[lane], self.lane_owner[lane] = state, owner

    def active_lanes(self) -> list[int]:
        return [i for i, s in enumerate(self.lanes) if s is not LaneState.FREE]

    # ---- admission choice ----------------------------------------------------------------------------------
    def find_source(self, prompt: tuple[int, ...], session_key: str | None) -> CatalogEntry | None:
        """The deepest published checkpoint that is a strict prefix of the prompt (the last prompt token must
        still run to give the first output token's logits): session binding first, then the prefix index."""
        if not self.prefix_caching:
            return None
        for n in sorted((n for n in self.by_length if 0 < n < len(prompt)), reverse=True):
            ids = self.by_length[n].get(token_digest(prompt[:n]), ())
            usable = [self.catalog[c] for c in ids if self.catalog[c].retention is Retention.PREFIX
                      or self.catalog[c].session_key == session_key]
            if usable:
                return max(usable, key=lambda e: e.last_used)
        return None

    def victims(self, exclude: CheckpointId | None = None) -> tuple[CheckpointId, ...]:
        """Inactive, unpinned checkpoints in release order: what a transition may release."""
        free = [e for e in self.catalog.values() if e.pins == 0 and e.info.id != exclude]
        bound = {b.checkpoint for b in self.sessions.values()}
        # A conversation's latest checkpoint (its SessionIndex binding) outlives superseded and prefix entries.
        return tuple(e.info.id for e in sorted(free, key=lambda e: (e.info.id in bound, e.last_used)))

    def materialize_choice(self, rid: int, prompt: tuple[int, ...], max_new_tokens: int, session_key: str | None,
                           sampling: object, seed: int, *, from_root: bool = False) -> ResourceChoice:
        source = None if from_root else self.find_source(prompt, session_key)
        sid = source.info.id if source else None
        return ResourceChoice(TransitionKind.MATERIALIZE, request_id=rid, prompt=prompt, max_new_tokens=max_new_tokens,
                              source=sid, victims=self.victims(exclude=sid), sampling=sampling, seed=seed)

    def begin_materialize(self, rid: int, lane: int, choice: ResourceChoice) -> None:
        self._set_lane(lane, LaneState.MATERIALIZING, rid)
        if choice.source is not None:
            self.catalog[choice.source].pins += 1
            self._claims[rid] = choice.source

    # ---- capture and terminal choices ------------------------------------------------------------------------
    def capture_choice(self, handle: SequenceHandle, frontier: int) -> ResourceChoice | None:
        if not self.prefix_caching:
            return None
        return ResourceChoice(TransitionKind.CAPTURE, handle=handle, capture_at=frontier, victims=self.victims())

    def eviction_choice(self, cap: int | None) -> ResourceChoice | None:
        """Retention policy: past `cap` inactive checkpoints, delete the first ones in release order."""
        if cap is None or len(self.catalog) <= cap:
            return None
        victims = self.victims()[:len(self.catalog) - cap]
        return ResourceChoice(TransitionKind.DELETE, victims=victims) if victims else None

    def terminal_choice(self, handle: SequenceHandle, frontier: int, session_key: str | None,
                        succeeded: bool) -> ResourceChoice:
        """Retain a finished conversation for its session key; release everything otherwise."""
        if self.prefix_caching and succeeded and session_key is not None and frontier > 0:
            return ResourceChoice(TransitionKind.RETAIN, handle=handle, capture_at=frontier, victims=self.victims())
        return ResourceChoice(TransitionKind.RELEASE, handle=handle)

    # ---- adoption ------------------------------------------------------------------------------------------
    def adopt(self, result: ResourceResult, *, rid: int | None, lane: int | None, session_key: str | None = None,
              publication_order: int = 0) -> None:
        """Take the Program's complete result; the only way the catalog and lanes change after a transition."""
        self._clock += 1
        for cid in result.released:
            entry = self.catalog.pop(cid, None)
            if entry is None:
                raise EngineFailure(f"Program released unknown checkpoint {cid.value}")
            self._unindex(entry.info)
            if entry.pins:
                raise EngineFailure(f"Program released pinned checkpoint {cid.value}")
            self._drop_session_binding(cid)
        if rid is not None and rid in self._claims:
            source = self._claims.pop(rid)
            self.catalog[source].pins -= 1
            if result.succeeded and result.kind is TransitionKind.MATERIALIZE:
                self.catalog[source].last_used = self._clock
        retention = Retention.SESSION if result.kind is TransitionKind.RETAIN else Retention.PREFIX
        for info in result.published:
            if info.id in self.catalog:
                raise EngineFailure(f"checkpoint {info.id.value} published twice")
            self.catalog[info.id] = CatalogEntry(info, retention, session_key if retention is Retention.SESSION
                                                 else None, self._clock)
            self.by_length.setdefault(info.tokens, {}).setdefault(info.digest, set()).add(info.id)
            if retention is Retention.SESSION and session_key is not None:
                self._bind_session(session_key, info.id, publication_order)
        if lane is not None:
            self._adopt_lane(result, lane, rid)

    def _adopt_lane(self, result: ResourceResult, lane: int, rid: int | None) -> None:
        if result.kind is TransitionKind.MATERIALIZE:
            self._set_lane(lane, LaneState.ACTIVE if result.succeeded else LaneState.FREE,
                           rid if result.succeeded else None)
        elif result.kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
            self._set_lane(lane, LaneState.FREE, None)

    def enter_terminal(self, lane: int) -> None:
        self._set_lane(lane, LaneState.TERMINAL_PENDING, self.lane_owner[lane])

    def _unindex(self, info: CheckpointInfo) -> None:
        same = self.by_length[info.tokens]
        same[info.digest].discard(info.id)
        if not same[info.digest]:
            del same[info.digest]
        if not same:
            del self.by_length[info.tokens]

    def _bind_session(self, key: str, cid: CheckpointId, order: int) -> None:
        """Only a later publication_order may replace a binding; the replaced checkpoint stays cached."""
        old = self.sessions.get(key)
        if old is None or order > old.publication_order:
            self.sessions[key] = SessionBinding(cid, order)

    def _drop_session_binding(self, cid: CheckpointId) -> None:
        for key in [k for k, b in self.sessions.items() if b.checkpoint == cid]:
            del self.sessions[key]

    def clear(self) -> None:
        """Engine failure: forget every lane, claim, checkpoint and binding (the Program is discarded too)."""
        self.lanes = [LaneState.FREE] * len(self.lanes)
        self.lane_owner = [None] * len(self.lanes)
        self.catalog.clear()
        self.sessions.clear()
        self.by_length.clear()
        self._claims.clear()

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
        indexed = {c for same in self.by_length.values() for ids in same.values() for c in ids}
        assert indexed == set(self.catalog), "prefix index and catalog disagree"
        for n, same in self.by_length.items():
            for digest, ids in same.items():
                assert all(self.catalog[c].info.tokens == n and self.catalog[c].info.digest == digest for c in ids)
