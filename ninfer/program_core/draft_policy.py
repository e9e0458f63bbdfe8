"""DraftPolicy: the verify width of each speculative round (1 + the drafts a row may take), chosen from the
round's measured costs and the acceptance seen so far, so that speculation does not run at a loss.

A round of B rows at width w costs ``RoundCosts.seconds(B, w)`` (the draft of w - 1 tokens and the verify pass of
blocks of w tokens; width 1 drafts nothing: the verify pass of the pending token alone is the plain step, with the
backend's state kept, so speculation can resume any round). It yields, per row, one token plus the drafts accepted
among its min(room, w - 1). The policy picks the width of most expected tokens per second.

Acceptance is modelled per draft index j (0-based) as the chance a_j that draft j is accepted once drafts 0..j-1
were: the expected tokens of n drafts are ``1 + sum_{j<n} prod_{i<=j} a_i``. Each a_j is a ratio of decayed counts
with one pseudo-trial that accepted (the prior), so an index not tried lately drifts back to 1: after a run of
narrow rounds the full width is tried again, and a change in the text (a code block, a summary) is noticed. Every
row of a verified round updates the indices it tried: draft j was tried when it was offered (j < the row's drafts)
and drafts 0..j-1 were accepted.

Without measured costs (the reference Program, a CPU, ``"adaptive": false``) every round takes the full width:
each row drafts as far as its room allows. Greedy output does not depend on the width (each width reproduces the
autoregressive argmax); sampled output does (speculative sampling is lossless in distribution, not token for token),
so with sampled rows the choice, which follows the measured costs, can differ between processes: ``"adaptive":
false`` makes a seed reproduce its tokens (docs/speculative.md, "Adaptive width").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

PRIOR = 1.0  # pseudo-trials, all accepted, each draft index starts with and decays back to
DECAY = 0.98  # per verified round, the weight the evidence before it keeps (about 50 rounds of memory)


def candidate_widths(k: int) -> tuple[int, ...]:
    """The verify widths a Program measures and captures for k drafts: 1, the powers of two below k + 1, and
    k + 1 (k = 3: 1, 2, 4; k = 15: 1, 2, 4, 8, 16)."""
    return tuple(sorted({1 << i for i in range(k.bit_length() + 1) if 1 << i < k + 1} | {k + 1}))


@dataclass(frozen=True)
class RoundCosts:
    """Seconds of one speculative round of B rows at each verify width, measured by the Program at start, and of
    the replay a cut block costs at commit where the Program keeps no state per block position (`replays`; empty:
    a cut costs nothing measurable, a slot copy)."""

    widths: tuple[int, ...]  # ascending; widths[0] == 1 (no drafts), widths[-1] == k + 1
    per_batch: tuple[tuple[float, ...], ...]  # [B - 1][i]: B rows at widths[i]
    replays: tuple[tuple[float, ...], ...] = ()  # [B - 1][i]: one pass over B rows' kept tokens, at widths[i]

    def __post_init__(self) -> None:
        if not self.widths or self.widths[0] != 1 or list(self.widths) != sorted(set(self.widths)):
            raise ValueError(f"round widths must ascend from 1, got {self.widths}")
        bad = [row for row in self.per_batch if len(row) != len(self.widths) or
               not all(math.isfinite(s) and s > 0 for s in row)]
        if not self.per_batch or bad:
            raise ValueError(f"round costs need a positive second per width for each B, got {self.per_batch}")
        if self.replays and (len(self.replays) != len(self.per_batch) or any(
                len(row) != len(self.widths) or not all(math.isfinite(s) and s >= 0 for s in row)
                for row in self.replays)):
            raise ValueError(f"replay costs need a second per width for each B, got {self.replays}")

    def seconds(self, B: int, i: int) -> float:
        """A round of B rows (1..the Program's lanes, every B measured) at widths[i]."""
        return self.per_batch[B - 1][i]

    def replay(self, B: int, i: int) -> float:
        """The replay after a round of B rows at widths[i] cut one block or more (0: the Program keeps states)."""
        return self.replays[B - 1][i] if self.replays else 0.0


class DraftPolicy:
    def __init__(self, k: int, costs: RoundCosts | None = None):
        if costs is not None and costs.widths[-1] != k + 1:
            raise ValueError(f"round costs end at width {costs.widths[-1]}, the backend verifies blocks of {k + 1}")
        self.k, self.costs = k, costs
        self.hits = [0.0] * k  # decayed: draft j accepted
        self.trials = [0.0] * k  # decayed: draft j offered after drafts 0..j-1 were accepted
        self.rounds = {w: 0 for w in (costs.widths if costs else (k + 1,))}  # rounds verified at each width

    def rates(self) -> list[float]:
        """a_j per draft index: (hits + PRIOR) / (trials + PRIOR)."""
        return [(h + PRIOR) / (t + PRIOR) for h, t in zip(self.hits, self.trials)]

    def expected(self, drafts: int, rates: Sequence[float] | None = None) -> float:
        """Expected tokens of a row offered `drafts` drafts: 1 plus the chance each of them is reached and kept."""
        rates = self.rates() if rates is None else rates
        total, reach = 1.0, 1.0
        for a in rates[:drafts]:
            reach *= a
            total += reach
        return total

    def width(self, rooms: Sequence[int]) -> int:
        """The verify width for rows that may take rooms[i] drafts each (their `draft_room`): the full block
        without costs, else the width of most expected tokens per second, a round's seconds counting its replay
        weighted by the chance that some row's block is cut; the rows then draft min(rooms[i], width - 1) each."""
        if self.costs is None:
            return self.k + 1
        rates, B = self.rates(), len(rooms)
        best, best_rate = 1, 0.0
        for i, w in enumerate(self.costs.widths):
            if w > 1 and w - 1 > max(rooms, default=0):
                break  # no row could fill it: a wider block only pads
            whole = math.prod(math.prod(rates[:min(r, w - 1)]) for r in rooms)  # every row keeps its block
            seconds = self.costs.seconds(B, i) + (1.0 - whole) * self.costs.replay(B, i)
            gain = sum(self.expected(min(r, w - 1), rates) for r in rooms) / seconds
            if gain > best_rate:
                best, best_rate = w, gain
        return best

    def observe(self, width: int, offered: Sequence[int], produced: Sequence[int]) -> None:
        """One verified round at `width`: row i was offered offered[i] drafts and produced produced[i] tokens
        (accepted drafts + 1; a failed row is left out by the caller)."""
        self.rounds[width] = self.rounds.get(width, 0) + 1
        self.hits = [h * DECAY for h in self.hits]
        self.trials = [t * DECAY for t in self.trials]
        for n, got in zip(offered, produced):
            accepted = got - 1
            for j in range(min(n, accepted + 1)):
                self.trials[j] += 1.0
                self.hits[j] += 1.0 if j < accepted else 0.0
