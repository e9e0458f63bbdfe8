"""ModelExecutor: the tensor math a Program supplies to the shared Program core, and nothing else.

The core decides what runs (which tokens, which positions, where a prefill chunk is cut, which pages a step takes,
when a state is backed up, restored or kept); the executor runs the model on a sequence's live state in place
through its own store and draws tokens with the shared sampling semantics (`ninfer.sampling`). Every call works on
state the core has already made room for: the block table covers every position written.
"""

from __future__ import annotations

from typing import Any, Hashable, Protocol, Sequence

from ninfer.contracts import RowFailure
from ninfer.sampling import RowContext

from .records import ActiveSequence

# (token, (its raw logprob, the top alternatives) when the request asked for logprobs), or the RowFailure of a row
# the sampler could not draw: that request ends alone (docs/sampling.md section 8)
Drawn = "tuple[int, tuple[float, tuple] | None] | RowFailure"


class ModelExecutor(Protocol):
    def prefill(self, seq: ActiveSequence, start: int, end: int, captures: Sequence[tuple[int, int]] = ()) -> Any:
        """Consume prompt[start:end] at positions start.. on the live state (slot, pages) in place; returns the
        distribution at `end` in whatever form `draw_first` takes (fp32 logits [V]). `captures` (frontier, slot),
        frontiers ascending strictly inside (start, end): within the same one model call, the complete state after
        the tokens before each frontier (GDN state and any backend state; KV is paged) is written into its slot,
        equal to what the live slot would hold had the prefill been cut there."""

    def draw_first(self, seq: ActiveSequence, logits: Any, mask: Any | None) -> Drawn:
        """The first output token at position len(prompt), from what the last `prefill` returned."""

    def decode(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[Drawn]:
        """For every row: save the committed state into `backup_slot(row)`, consume the pending token at the
        frontier in place, and draw the token at frontier + 1."""

    # optional: launch(seqs, masks) -> a call returning decode's draws. `decode` without the wait, for the step
    # launched ahead (`ahead.py`); an executor without it runs the step at launch time.

    # optional, together: a `chains` property true when launch(seqs, masks, bank=1, behind=True) queues the step
    # behind the one just launched for the same rows (its tokens that step's draws on the device, unmasked, one
    # position past each frontier, each row backed up into `chained_backup(row)`: `chain.py`); bank 0 backs up
    # into backup_slot(row) as decode does.

    # optional: mixed_launch(seqs, masks, pseq, start, end, captures) -> (a call returning decode's draws, what
    # `prefill` of pseq's prompt[start:end] returns): both in one model pass, queued (`mixed.py`); an executor
    # without it runs the prefill, then the decode step.

    def feed(self, seq: ActiveSequence, tokens: Sequence[int]) -> None:
        """Consume forced tokens at the frontier in place (no draw); the core has backed the state up."""

    # optional: feed_rows(seqs, feds) -> None. `feed` of several rows in one model pass (a commit's replays of cut
    # speculative blocks, `speculation.replay`); without it the core feeds row by row.

    def record(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        """(row, handle, tokens) just committed as outputs: the penalties' history follows them."""

    def draft(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], ks: Sequence[int]
              ) -> list[tuple[tuple[int, ...], list[Any]]]:
        """With a speculative backend (config.speculative) only, as `verify`: ks[i] draft tokens for row i from its
        committed state (nothing is changed), each drawn with `ninfer.sampling.draw_draft` at positions
        frontier + 1 ..; with each its q (None for a greedy row)."""

    def verify(self, seqs: Sequence[ActiveSequence], feds: Sequence[tuple[int, ...]]) -> list[Any]:
        """For every row: save the committed state into `backup_slot(row)`, then consume fed = [pending, drafts]
        at the frontier in place, in one target pass; fp32 logits [len(fed), V] per row (row i: the distribution
        at frontier + 1 + i), valid until the executor's next model call (the fast Program's are views of its verify
        graphs' output, which the next pass overwrites)."""

    # optional: select(seq, keep) -> bool. After a `verify`, the state after fed[:keep] of the row's block
    # (0 < keep < len(fed); GDN and backend state) put into its live slot from states the pass kept per block
    # position; False when it kept none, and the core replays the kept tokens from the backup instead.

    # optional, together: fill_masks(drafts, grammar) -> the round's queued grammar (or None), then
    # accept(seqs, ctxs, drafts, targets, queued) -> a call returning [Accepted | RowFailure] per row:
    # `ninfer.sampling.accept` queued on the executor's device (the fast Program's one host copy a round, waited for
    # by the call, so a round launched ahead holds it). grammar[i] is row i's mask rows (one per verified position)
    # or, for drafts kept on the device, its `DraftMasks`, whose fill the executor runs in stream order once the
    # drafts exist (the fast Program's host function, `fast/sampling/prefix_masks.py`); a fill that raises fails
    # its row (RowFailure in the call's result). `fill_masks` comes before `verify`, so the fill can run inside the
    # target pass (the fast Program's masked verify graphs). A `draft` result may also keep its drafts on the
    # device and supply the fed blocks itself (`drafts.feds(pending)`, lengths on the host); without `accept` the
    # core accepts on the host.
