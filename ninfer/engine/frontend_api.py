"""What the Engine needs of a Frontend's per-request OutputSession (the Frontend owns output semantics).

The Engine previews each PendingBatch row on a fork, commits the Program first, then the session, then
publishes what `commit` returned. A dropped preview leaves the session untouched. A request that ends without a
terminal row (deadline, cancellation while active) ends its session with `end`, so its result holds the output
so far.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ninfer.contracts import FinishReason


class OutputPreview(Protocol):
    accepted: int  # provisional tokens this row keeps (<= produced)
    terminal: bool
    finish_reason: FinishReason | None  # set when terminal
    boundary: int | None  # reconstruction boundary relative to the accepted span
    needs_control: bool  # once committed, the session needs a forced-control suffix next (scheduler accounting)


class OutputSession(Protocol):
    def preview(self, tokens: Sequence[int], *, forced: bool = False) -> OutputPreview: ...

    def commit(self, preview: OutputPreview) -> Any:
        """Move the preview into the session; returns the delta the Engine publishes."""

    def next_token_mask(self) -> Any | None:
        """The allowed-token bitmask for the next sampled token (int32 [ceil(V/32)]), None when unconstrained.
        The Engine hands it to the Program with the row; the Program applies it before penalties and sampling."""

    def draft_masks(self) -> Any | None:
        """With a speculative backend, instead of `next_token_mask`: the row's `DraftMasks` (the committed
        grammar's rows for a block of drafts, the block bound before a forced control), None when unconstrained."""

    def end(self, reason: FinishReason) -> Any | None:
        """End the output before the model did (the request's deadline passed, or it was cancelled while active):
        release what was held back, close the channels, record `reason`. Returns the last delta to publish, or
        None when nothing was held back. Called once, after the terminal resource result was adopted."""

    def control_suffix(self) -> tuple[int, ...] | None:
        """A forced-control suffix the session needs committed next (e.g. `</think>` after a thinking budget)."""

    def result(self) -> Any:
        """The final aggregate (content, reasoning, tool calls, ...), placed in GenerationResult.output."""
