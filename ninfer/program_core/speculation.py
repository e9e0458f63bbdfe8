"""A speculative decode round: draft, verify in one target pass, accept a prefix per row, one PendingBatch.

Per row, the backend drafts k' = min(k, output budget left - 1, the round's width - 1) tokens from the committed
state (so the block never writes past the full-growth reservation; the width is the Program's `DraftPolicy`'s),
the target consumes [pending, d1..dk'] at frontier.. in one pass on the live state (backed up first, pages taken
provisionally), and `ninfer.sampling.accept` keeps a prefix of the drafts plus one bonus (or residual) token: the
row's produced tokens. The Engine may cut that further (stops, max_tokens,
EOS inside the block); `Program.commit` keeps exactly the accepted tokens when fewer than the whole block were
consumed (`rollback`): the state after them from the executor's verify pass where it kept one per block position,
else replayed from the backup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from ninfer.contracts import BatchKind, DraftMasks, EngineFailure, PendingBatch, PendingRow, RowFailure
from ninfer.sampling import Accepted, RowContext, SamplingError, accept

from .execution import Provisional, grow
from .records import ActiveSequence

if TYPE_CHECKING:
    from .program import Program


def row_context(prog: "Program", seq: ActiveSequence) -> RowContext:
    return RowContext(seq.params, seq.seed, seq.prompt, seq.outputs, prog.limits.eos_token_ids)


def draft_room(prog: "Program", seq: ActiveSequence, mask: Any | None) -> int:
    """Drafts this row may take: none past its output budget or the block bound its session gave, and none when
    its grammar came as one plain bitmask row (only the first token could be constrained)."""
    room = min(prog.config.draft_tokens, seq.max_new - seq.num_outputs - 1)
    if isinstance(mask, DraftMasks):
        if mask.max_block is not None:
            room = min(room, mask.max_block - 1)
    elif mask is not None:
        room = 0
    return max(0, room)


def _mask_rows(mask: Any | None, drafts: tuple[int, ...]) -> list[Any | None]:
    """One grammar row per verified position (None: unconstrained)."""
    if isinstance(mask, DraftMasks):
        if mask.fill is None:
            return [None] * (len(drafts) + 1)
        rows = mask.fill(drafts)  # int32 [len(drafts) + 1, W]
        return [rows[i] for i in range(len(drafts) + 1)]
    if mask is None:
        return [None] * (len(drafts) + 1)
    return [mask]  # a plain bitmask row: no drafts were taken


def launch_round(prog: "Program", seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]
                 ) -> tuple[tuple[Provisional, ...], Callable[[], PendingBatch]]:
    """Queue one speculative round: (each row's provisional step, the call that waits for the acceptance and returns
    the round's PendingBatch). An executor with device acceptance (`accept`) leaves its one readback to that call;
    otherwise the round is accepted on the host here."""
    ctxs = [row_context(prog, s) for s in seqs]
    ex = prog.executor
    rooms = [draft_room(prog, s, m) for s, m in zip(seqs, masks)]
    width = prog.draft_policy.width(rooms)  # 1: no drafts this round, the plain step with the backend's state
    ks = [min(r, width - 1) for r in rooms]
    drafts = ex.draft(seqs, ctxs, ks)
    # drafts kept on the device supply their own fed blocks, whose lengths the host knows before any token
    feds = drafts.feds([s.pending for s in seqs]) if hasattr(drafts, "feds") else \
        [(s.pending,) + tuple(d) for s, (d, _) in zip(seqs, drafts)]
    provisional = tuple(Provisional(fed, grow(prog, s, s.frontier + len(fed))) for s, fed in zip(seqs, feds))
    if hasattr(ex, "accept"):  # acceptance on the executor's device, the same definition as `accept`
        device_drafts = hasattr(drafts, "feds")
        # a fill over drafts still on the device runs there in stream order (its failure comes back as the row's
        # result); any other grammar is read on the host now, without the drafts when it does not depend on them
        grammar = [m if device_drafts and _fills(m) else _grammar(m, fed) for m, fed in zip(masks, feds)]
        queued = ex.fill_masks(drafts, [None if isinstance(g, RowFailure) else g for g in grammar])
        targets = ex.verify(seqs, feds)  # [len(fed), V] fp32 each: p at frontier + 1 ..
        collect = ex.accept(seqs, ctxs, drafts, targets, queued)

        def accepted() -> list[PendingRow]:
            return [_row(s, g if isinstance(g, RowFailure) else a, len(fed) - 1)
                    for s, a, g, fed in zip(seqs, collect(), grammar, feds)]
    else:
        targets = ex.verify(seqs, feds)
        grammar = [_grammar(m, fed) for m, fed in zip(masks, feds)]
        rows = [_accepted_row(s, ctx, tuple(fed[1:]), q, target, g) for s, ctx, fed, (_, q), target, g in
                zip(seqs, ctxs, feds, drafts, targets, grammar)]

        def accepted() -> list[PendingRow]:
            return rows

    def finish() -> PendingBatch:
        got = accepted()
        kept = [(k, len(r.tokens)) for k, r in zip(ks, got) if r.failure is None]
        prog.draft_policy.observe(width, [k for k, _ in kept], [n for _, n in kept])
        return PendingBatch(BatchKind.DECODE, tuple(got), prog.resource_revision, payload=provisional)
    return provisional, finish


def _fills(mask: Any | None) -> bool:
    """Whether this row's grammar rows depend on its drafts (so the host must see them before acceptance)."""
    return isinstance(mask, DraftMasks) and mask.fill is not None


def _grammar(mask: Any | None, fed: Sequence[int]) -> list[Any | None] | RowFailure:
    """The grammar rows of the block `fed` ([pending, drafts..]; drafts still on the device are read only when the
    rows depend on them), or INVALID_SAMPLING_INPUT when its session's `fill` raised: a Frontend failure inside the
    round ends its own request, and the commit restores the row's provisional state."""
    try:
        return _mask_rows(mask, tuple(fed[1:]) if _fills(mask) else (0,) * (len(fed) - 1))
    except EngineFailure:
        raise
    except Exception:  # noqa: BLE001 - the session's grammar failed: its row alone
        return RowFailure.INVALID_SAMPLING_INPUT


def _accepted_row(seq: ActiveSequence, ctx: RowContext, drafts: tuple[int, ...], q: list[Any], target: Any,
                  grammar: list[Any | None] | RowFailure) -> PendingRow:
    """The row of one verified block; a failed row (its request ends alone) when p cannot be drawn from."""
    if isinstance(grammar, RowFailure):
        return PendingRow.failed(seq.handle, seq.frontier + 1, grammar)
    try:
        got = accept(target, drafts, q, ctx, seq.frontier + 1, grammar)
    except SamplingError as e:
        return PendingRow.failed(seq.handle, seq.frontier + 1, e.failure)
    return _row(seq, got, len(drafts))


def _row(seq: ActiveSequence, got: Accepted | RowFailure, drafted: int) -> PendingRow:
    if isinstance(got, RowFailure):
        return PendingRow.failed(seq.handle, seq.frontier + 1, got)
    lps, tops = (None, None) if got.logprobs is None else \
        (tuple(lp for lp, _ in got.logprobs), tuple(top for _, top in got.logprobs))
    return PendingRow(seq.handle, got.tokens, seq.frontier + 1, lps, tops, drafted=drafted)


def rollback(prog: "Program", seq: ActiveSequence, prov: Provisional, keep: int) -> tuple[int, ...]:
    """Keep only fed[:keep] of a speculative round's block (0 < keep < len(fed); a forced-control suffix is
    committed whole or not at all, so only a verified block is ever cut): the pages past frontier + keep returned,
    and the live state made the one after the kept tokens (GDN recurrent and conv state, the backend's state; KV by
    frontier). It comes from the states the verify pass kept per block position where the executor has them
    (`select`, the fast Program's): returns (). Otherwise the committed state comes back from the backup slot and
    the kept tokens are returned, for `replay` to consume on it (DESIGN.md section 7, docs/speculative.md)."""
    extra = len(seq.table) - prog.config.pages_for(seq.frontier + keep)
    for p in reversed(prov.grown[len(prov.grown) - extra:] if extra > 0 else ()):
        assert seq.table.pop() == p, f"{seq.handle}: block table changed under a pending batch"
        prog.alloc.unref(p)
        seq.reserve_left += 1
    select = getattr(prog.executor, "select", None)
    if select is not None and select(seq, keep):
        return ()
    prog.store.copy_slot(prog.config.backup_slot(seq.row), seq.handle.slot)
    return tuple(prov.fed[:keep])


def replay(prog: "Program", seqs: Sequence[ActiveSequence], feds: Sequence[tuple[int, ...]]) -> None:
    """The kept tokens of every row `rollback` cut without a kept state, consumed at their frontiers: in one model
    pass where the executor has one for several rows (`feed_rows`: a batch's replays cost one pass, not one a row),
    else row by row."""
    if not seqs:
        return
    feed_rows = getattr(prog.executor, "feed_rows", None)
    if feed_rows is not None:
        feed_rows(seqs, feds)
        return
    for seq, fed in zip(seqs, feds):
        prog.executor.feed(seq, fed)

