"""Retention policy of the context cache: which frontiers are worth capturing, which output ends are retained, and
what each checkpoint is worth.

Pure functions over ints (docs/context-cache.md). A checkpoint's value is the prefill work a hit saves per byte it
holds, weighted by its retention class and its observed hits, and decayed by how long ago it was last used:

    value = class_weight * (1 + hits) * recompute(tokens) / bytes / (1 + age / HALF_LIFE)

where recompute(t) = t * (1 + t / QUADRATIC_AT) (prefill is linear in t plus attention's quadratic share) and
age counts the ResourceManager's logical clock (one tick per adopted transition). class_weight also doubles for a
SessionIndex binding and quarters for a superseded checkpoint. A capture not yet made counts its class's prior
hits; it may displace only victims worth less than it.
Victims are taken lowest value first; a protected one (earned hits, or belongs to a conversation) is demoted to
a host replica instead of deleted where the cost model (`cost_model.py`) says a copy beats recomputing it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable

from ninfer.contracts import CheckpointInfo

HALF_LIFE = 256  # logical ticks after which an unused checkpoint is worth half as much
QUADRATIC_AT = 8192  # tokens at which attention's share of the prefill work equals the linear part
MAX_CAPTURES = 4  # capture frontiers one request may ask for (each costs a state slot, and a cut in the prefill)
CHUNK = 64  # the GDN chunk: a chunk-boundary capture sits at an absolute multiple of it


class Retention(enum.Enum):
    """Why a checkpoint exists; the class weighs its value."""

    PREFIX = "prefix"  # a prompt's end: reused by a request with the same prompt and more
    CHUNK = "chunk"  # a GDN chunk boundary inside a prompt: reused by a prompt that diverges after it
    TURN = "turn"  # a Frontend turn boundary inside a prompt (a message end, the point before dropped reasoning)
    OUTPUT = "output"  # the end of an output history reproduces: the next request of the conversation continues it
    SESSION = "session"  # the end of an output retained only for its session key (history may not reproduce it)


CLASS_WEIGHT = {Retention.PREFIX: 1.0, Retention.CHUNK: 1.0, Retention.TURN: 2.0, Retention.OUTPUT: 3.0,
                Retention.SESSION: 0.5}
BOUND_WEIGHT = 2.0  # a conversation's latest checkpoint (its SessionIndex binding)
# A checkpoint a request resumed from and then published a deeper one of: the conversation's later turns resume
# from the deeper one, so this one is worth only what another branch from it would be.
SUPERSEDED_WEIGHT = 0.25
# The hits a capture not yet made is expected to earn: a turn boundary or a retained output is what the next request
# of its conversation resumes from, so a new conversation may displace an idle one's checkpoint of equal worth,
# while one-off prompts (no prior) never displace a conversation's.
PRIOR_HITS = {Retention.PREFIX: 0, Retention.CHUNK: 0, Retention.TURN: 1, Retention.OUTPUT: 1, Retention.SESSION: 0}


def recompute(tokens: int) -> float:
    """Relative prefill work to rebuild a checkpoint of `tokens` tokens from root."""
    return tokens * (1.0 + tokens / QUADRATIC_AT)


@dataclass(frozen=True)
class Worth:
    """What a checkpoint's value is computed from (everything the ResourceManager observes of it)."""

    retention: Retention
    tokens: int
    bytes: int
    hits: int
    age: int
    bound: bool
    superseded: bool = False

    @classmethod
    def of(cls, info: CheckpointInfo, retention: Retention, hits: int, age: int, bound: bool,
           superseded: bool) -> "Worth":
        return cls(retention, info.tokens, info.device_bytes + info.host_bytes, hits, age, bound, superseded)

    @property
    def value(self) -> float:
        weight = CLASS_WEIGHT[self.retention] * (BOUND_WEIGHT if self.bound else 1.0) * \
            (SUPERSEDED_WEIGHT if self.superseded else 1.0)
        return weight * (1 + self.hits) * recompute(self.tokens) / max(self.bytes, 1) / (1 + self.age / HALF_LIFE)

    @property
    def protected(self) -> bool:
        """Proven or meant for reuse (a hit, a session binding, a turn boundary or a reproduced output) and not
        superseded: it gives way only to checkpoints of its own rank, so one-off prompts never flush a
        conversation however long it stays idle; it keeps a host replica when it must leave the device."""
        return not self.superseded and (self.hits > 0 or self.bound or
                                         self.retention in (Retention.TURN, Retention.OUTPUT))

    @property
    def demote(self) -> bool:
        return self.protected

    @property
    def rank(self) -> tuple[bool, float]:
        """Victims go lowest rank first: unprotected before protected, then by value."""
        return self.protected, self.value


def capture_candidates(prompt_len: int, reused: int, hints: tuple[int, ...]) -> dict[int, Retention]:
    """Frontiers of one prompt worth a capture: its end, the Frontend's turn boundaries, and the deepest chunk
    boundary short of the end (a prompt diverging in its last chunk resumes there); only past the reused part.
    A prompt whose end is itself a chunk boundary gets no extra chunk capture: the end capture already serves every
    prompt that extends this one, and another would hold a state slot for little."""
    out: dict[int, Retention] = {}
    chunk = prompt_len // CHUNK * CHUNK
    if reused < chunk < prompt_len:
        out[chunk] = Retention.CHUNK
    for h in hints:
        if reused < h < prompt_len:
            out[h] = Retention.TURN
    if reused < prompt_len:
        # Below the turn boundaries: the Frontend's point before an opened <think> serves the next turn whether it
        # drops this turn's reasoning (a user turn) or keeps it (an agent loop), at 2 tokens more than the end.
        out[prompt_len] = Retention.PREFIX
    return out


def fresh_worth(retention: Retention, tokens: int, bytes_per_token: float) -> Worth:
    """A capture not yet made: its class's prior hits, age 0, bytes estimated from the catalog's checkpoints."""
    return Worth(retention, tokens, max(1, round(bytes_per_token * tokens)), PRIOR_HITS[retention], 0, False)


def capture_plan(prompt_len: int, reused: int, hints: tuple[int, ...], held: Callable[[int], bool],
                 bytes_per_token: float, victim_ranks: Iterable[tuple[bool, float]]
                 ) -> tuple[dict[int, Retention], int]:
    """The capture candidates not `held` already, most valuable first (at most MAX_CAPTURES), with their classes,
    and how many of the victims (their ranks, in victim order) rank below the most valuable one: those a capture
    may displace. The ranks are read only when some frontier is worth capturing."""
    wanted = {f: r for f, r in capture_candidates(prompt_len, reused, hints).items() if not held(f)}
    ranked = sorted(wanted, key=lambda f: fresh_worth(wanted[f], f, bytes_per_token).rank, reverse=True)
    planned = {f: wanted[f] for f in ranked[:MAX_CAPTURES]}
    if not planned:
        return planned, 0
    best = fresh_worth(wanted[ranked[0]], ranked[0], bytes_per_token).rank
    return planned, sum(1 for rank in victim_ranks if rank < best)


@dataclass(frozen=True)
class TerminalFacts:
    """What the Engine knows of a finished request when it asks for its terminal choice."""

    request_id: int
    frontier: int  # tokens the sequence has consumed
    boundary: int | None  # the last committed Frontend boundary, absolute (None: none)
    session_key: str | None
    succeeded: bool


def terminal_retention(facts: TerminalFacts) -> Retention | None:
    """The class in which the end of a finished output is retained, None to release it: OUTPUT when the request
    succeeded and the Frontend says history reproduces it (its boundary is at the frontier or just after the
    pending token), SESSION when only its session key asks for it."""
    if not facts.succeeded or facts.frontier <= 0:
        return None
    if facts.boundary is not None and facts.boundary >= facts.frontier:
        return Retention.OUTPUT
    return Retention.SESSION if facts.session_key is not None else None
