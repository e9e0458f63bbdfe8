"""How many prompt tokens one prefill unit runs: the Scheduler's chunk sizing over the Program's `PrefillCosts`
(the seed's prefill_signature). Pure Python: the Program reports the physics once at start, this decides.

When both have work, a prefill chunk rides in each decode round's pass where the Program runs it so (mixed units,
`ProgramLimits.mixed_steps`): a decoding row waits that one pass between its tokens. Otherwise the Scheduler
alternates a chunk with each decode round, and a decoding row waits one decode step plus one chunk. With rows
decoding, a chunk is the largest multiple of the GDN chunk (64 tokens) whose predicted time keeps that wait within
``itl_ratio`` plain steps (with `MARGIN` left for the prediction's error); with none decoding it is the Program's
largest piece (one-piece prefill throughput). Where
not even one GDN chunk fits (a piece's floor or fixed cost above the budget), the decoding rows wait that one
chunk's time anyway, so the chunk is the most tokens predicted to cost no more than it (a graphed bucket, or the
flat floor of an eager piece), not one GDN chunk. Without
measured costs (the generic fallback: the reference Program, a CPU) chunks are `FALLBACK_CHUNK` tokens, as an
explicit `EngineConfig.prefill_chunk` always is.
"""

from __future__ import annotations

from enum import Enum
from typing import Callable

from ninfer.contracts import PrefillCosts

GRID = 64  # the GDN chunk: chunks of whole GDN chunks keep a piece's chunk grid aligned to its start
FALLBACK_CHUNK = 512  # tokens per chunk without measured costs
MARGIN = 0.8  # share of the ITL budget a chunk's predicted time may use


class ChunkVerdict(Enum):
    FIXED = "fixed"  # an explicit chunk size, or no measured costs: that many tokens
    WHOLE = "whole"  # nothing decodes: the Program's largest piece
    ITL = "itl"  # sized so each decoding row's inter-token time stays within the bound
    # even one GDN chunk overruns the bound: the most tokens at no more than one GDN chunk's predicted time (decode
    # still alternates with it); FLOOR when that is the one GDN chunk
    THROUGHPUT = "throughput"
    FLOOR = "floor"


def prefill_chunk(costs: PrefillCosts, remaining: int, frontier: int, decode_rows: int, fixed: int | None,
                  itl_ratio: float, mixed: bool = False) -> tuple[int, ChunkVerdict]:
    """Prompt tokens for the next prefill unit of a prompt with `remaining` tokens left from `frontier`, while
    `decode_rows` requests are decode-ready, and why. `mixed`: the chunk rides in the decode round's pass, so a
    decoding row waits that one pass (`PrefillCosts.mixed_s`), not a step and then a chunk."""
    if remaining < 1:
        raise ValueError(f"a prefill chunk of a consumed prompt (remaining {remaining})")
    step = costs.step_s(decode_rows) if decode_rows else None
    if fixed is not None or not costs.measured or (decode_rows and step is None):
        return min(fixed or FALLBACK_CHUNK, remaining), ChunkVerdict.FIXED
    largest = max(GRID, costs.max_piece // GRID * GRID)
    if not decode_rows:
        return min(largest, remaining), ChunkVerdict.WHOLE
    if mixed:
        cost: Callable[[int], float] = lambda t: costs.mixed_s(t, frontier, decode_rows)  # noqa: E731
        budget = MARGIN * itl_ratio * step
    else:
        cost, budget = (lambda t: costs.piece_s(t, frontier)), MARGIN * (itl_ratio - 1.0) * step
    most = min(remaining, largest)
    if cost(most) <= budget:
        return most, ChunkVerdict.ITL
    chunks = _fitting_chunks(cost, most, budget)
    if chunks:
        return chunks * GRID, ChunkVerdict.ITL
    one = min(GRID, remaining)
    chunks = _fitting_chunks(cost, most, cost(one))
    if chunks > 1:
        return chunks * GRID, ChunkVerdict.THROUGHPUT
    return one, ChunkVerdict.FLOOR


def _fitting_chunks(cost: Callable[[int], float], most: int, budget: float) -> int:
    """The most whole GDN chunks (of at most `most` tokens) predicted within `budget` (0: not one). The cost grows
    with the tokens, so bisection finds it (this runs at every prefill boundary beside decoding rows: O(log)
    predictions, not one per 64 tokens)."""
    lo, hi = 0, most // GRID  # lo chunks fit (0: none known), hi + 1 do not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid * GRID) <= budget else (lo, mid - 1)
    return lo
