"""Model transactions: the move-only PendingBatch and the accepted-prefix decision rules.

Prefill finalization, decode and forced control each produce one PendingBatch. The Engine previews every row
through the Frontend, forms one RowDecision per row, and consumes the whole batch with exactly one Program commit
or abort_pending; the Program then moves Main/backend KV, recurrent state, RNG position and speculative state
together. Rows are never abandoned one by one.

A row whose token the Program could not draw (`RowFailure`: non-finite logits, nothing left to draw) stays in the
batch with no tokens: the Engine drops it with a cancelled-row decision and ends that request alone, and the
Program restores the row's provisional state as for any dropped row. A sampling failure never fails the Engine.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Sequence

from .errors import EngineFailure


@dataclass(frozen=True)
class SequenceHandle:
    """The Program's execution resource of one active request. `generation` changes on every reuse of `slot`,
    so a stale handle is detected instead of silently addressing another request's state."""

    slot: int
    generation: int


class BatchKind(enum.Enum):
    PREFILL = "prefill"  # the last prompt chunk, sampling the first output token
    DECODE = "decode"  # one ordinary or speculative decode round over the compact batch
    CONTROL = "control"  # a forced-control suffix supplied by the Frontend; no sampling, no RNG advance
    # a decode round that carried one prompt's prefill chunk in its model pass: the decode rows, then, when the
    # chunk finished the prompt, that request's first-token row (a PREFILL row: nothing provisional)
    MIXED = "mixed"


class RowFailure(enum.Enum):
    """Why a Program drew no token for one row. Request-level: only that request ends."""

    NON_FINITE_LOGITS = "non_finite_logits"  # NaN or +inf in the row's logits after its adjustments
    NOTHING_ALLOWED = "nothing_allowed"  # logit_bias, grammar mask, min_tokens and stop ids leave no token
    INVALID_SAMPLING_INPUT = "invalid_sampling_input"  # a token id or mask the sampler refuses


ROW_FAILURE_TEXT = {
    RowFailure.NON_FINITE_LOGITS: "the logits of this request contain NaN or +inf",
    RowFailure.NOTHING_ALLOWED: "no token is allowed: the grammar, logit_bias, min_tokens and stop ids of this "
                                "request exclude every token",
    RowFailure.INVALID_SAMPLING_INPUT: "the sampler refused a token id or mask of this request",
}


@dataclass(frozen=True, slots=True)
class PendingRow:
    handle: SequenceHandle
    tokens: tuple[int, ...]  # provisional tokens; len(tokens) is the produced extent
    base_frontier: int  # absolute position of tokens[0]
    # Raw-distribution logprob of each provisional token, when the request asked for logprobs.
    logprobs: tuple[float, ...] | None = None
    # Per token: ((token id, logprob), ...) of the top alternatives, when asked for.
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    # Set when no token could be drawn: then `tokens` is empty and the row must get a cancelled-row decision.
    failure: RowFailure | None = None
    # Speculative rows: drafts the backend proposed; tokens[:produced - 1] are the ones verification accepted and
    # tokens[-1] is the bonus (or residual) token. 0 for an ordinary row.
    drafted: int = 0

    @property
    def produced(self) -> int:
        return len(self.tokens)

    @classmethod
    def drawn(cls, handle: SequenceHandle, tokens: tuple[int, ...], base_frontier: int,
              logprob: tuple[float, tuple] | None) -> "PendingRow":
        """A one-token row, with its (logprob, top alternatives) when the request asked for them."""
        if logprob is None:
            return cls(handle, tokens, base_frontier)
        return cls(handle, tokens, base_frontier, logprobs=(logprob[0],), top_logprobs=(logprob[1],))

    @classmethod
    def failed(cls, handle: SequenceHandle, base_frontier: int, failure: RowFailure) -> "PendingRow":
        """A row whose draw failed: no tokens; its request ends alone."""
        return cls(handle, (), base_frontier, failure=failure)


@dataclass(frozen=True, slots=True)
class RowDecision:
    accepted: int
    terminal: bool
    cancelled: bool = False
    # Frontend metadata: where, inside the accepted span, the history renderer can reproduce the output exactly
    # (relative index, e.g. just after <|im_end|>); the Program converts it to an absolute position on commit.
    boundary: int | None = None


def row_decision_legal(produced: int, accepted: int, terminal: bool, cancelled: bool) -> bool:
    """The seed's accepted-prefix rule as a predicate (crosshair checks these contracts).

    pre: produced >= 1
    post: not __return__ or 0 <= accepted <= produced
    post: not (__return__ and cancelled) or (accepted == 0 and terminal)
    post: not (__return__ and not cancelled) or accepted >= 1
    post: not (__return__ and not terminal) or accepted == produced
    """
    if cancelled:
        return accepted == 0 and terminal
    return 1 <= accepted <= produced and (terminal or accepted == produced)


def check_row_decision(produced: int, decision: RowDecision) -> None:
    """Raises EngineFailure on an illegal decision: a violation is an Engine bug, not a request error."""
    a = decision.accepted
    if not row_decision_legal(produced, a, decision.terminal, decision.cancelled):
        raise EngineFailure(f"illegal row decision (accepted={a}, terminal={decision.terminal}, "
                            f"cancelled={decision.cancelled}) for {produced} produced tokens: cancelled rows accept 0 "
                            f"and end; others accept 1..produced, and all of them unless terminal")
    if decision.boundary is not None and not 0 <= decision.boundary <= a:
        raise EngineFailure(f"boundary {decision.boundary} outside the accepted span 0..{a}")


@dataclass(eq=False)
class PendingBatch:
    """Frozen membership and provisional tokens; the Program keeps its provisional state in `payload`.

    Move-only: `take()` hands it over exactly once, to commit or abort_pending.
    """

    kind: BatchKind
    rows: tuple[PendingRow, ...]
    resource_revision: int
    payload: Any = None
    _consumed: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if not self.rows:
            raise EngineFailure("a PendingBatch needs at least one row")
        slots = [r.handle.slot for r in self.rows]
        if len(set(slots)) != len(slots):
            raise EngineFailure(f"a PendingBatch names slot(s) twice: {slots}")
        if any((r.produced < 1) != (r.failure is not None) for r in self.rows):
            raise EngineFailure("every PendingBatch row produces at least one token, except a failed row: none")

    @property
    def consumed(self) -> bool:
        return self._consumed

    def take(self) -> "PendingBatch":
        if self._consumed:
            raise EngineFailure("PendingBatch consumed twice")
        self._consumed = True
        return self

    def check_decisions(self, decisions: Sequence[RowDecision]) -> None:
        if len(decisions) != len(self.rows):
            raise EngineFailure(f"{len(decisions)} decisions for a batch of {len(self.rows)} rows")
        for row, d in zip(self.rows, decisions):
            if row.failure is not None and not d.cancelled:
                raise EngineFailure(f"failed row {row.handle} ({row.failure.value}) needs a cancelled-row decision")
            check_row_decision(row.produced, d)
            if self.kind is BatchKind.CONTROL and d.accepted not in (0, row.produced):
                raise EngineFailure("a forced-control suffix is committed whole or not at all")
