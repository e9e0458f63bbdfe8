"""SpecSampler: a speculative round's draws on the device, so the round reads back one packed int32 tensor.

- ``draft_rows`` + ``draw``: the draft token at every draft position F + 1 + j of every row, drawn as
  ``ninfer.sampling.draw_draft`` does (processed draft logits, penalties over the drafts before; greedy rows the
  argmax, random rows the race on stream ``STREAM_DRAFT``), the processed logits kept as q, a row whose draft
  distribution cannot be drawn from ending its drafts there (``DraftBlock.num``).
- ``accept``: p at every verified position (steps 1-8 with that draft prefix's grammar mask and the drafts before it
  in the penalties' history), ``spec_accept`` (the host ``accept``, tested equal to it), the raw logprobs of every
  emitted token, and one host copy of (count, status, tokens, drafts, logprobs) for the whole batch, queued
  (``accept_later``): the host waits for it only when it reads the results.

The host ``ninfer.sampling.speculative`` stays the definition: ``tests/fast_program/test_spec_sampler.py`` checks
these draws against it row by row. Rows the host sampler refuses before reading logits (ids outside the vocabulary,
a malformed mask: ``rows.host_error``) run as plain greedy rows and report the host's failure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ninfer.contracts import RowFailure
from ninfer.fast import hostcopy
from ninfer.fast.hostcopy import to_device
from ninfer.fast.ops.greedy_draw import greedy_draw, greedy_draw_naive, record_draft
from ninfer.fast.ops.gumbel_race import RaceWorkspace, gumbel_race, gumbel_race_naive
from ninfer.fast.ops.logprobs import LogprobsWorkspace, logprobs, logprobs_naive
from ninfer.fast.ops.logprobs import layout as LP
from ninfer.fast.ops.sample import layout as L
from ninfer.fast.ops.spec_accept import SpecAcceptWorkspace, spec_accept, spec_accept_naive
from ninfer.fast.ops.spec_accept import layout as A
from ninfer.sampling import Accepted, RowContext
from ninfer.sampling.philox import STREAM_DRAFT

from .draft_block import DraftBlock
from .draw_variants import draw_steps, draw_variant
from .prefix_masks import PrefixMasks, QueuedMasks, RowSource
from .row_params import RowParams
from .rows import SampleRow, fill_row, host_error, mask_words, row_flags
from .sampler import DeviceSampler
from .spec_steps import Steps, adjust, draft_counts, drawable, truncated
from .static_draws import StaticDraws

NI, NF = L.INT_COLUMNS, L.FLOAT_COLUMNS
_FAILURE = {L.BAD_LOGITS: RowFailure.NON_FINITE_LOGITS, L.ALL_MASKED: RowFailure.NOTHING_ALLOWED}


@dataclass
class RoundGrammar:
    """A round's grammar: each row's source and the rows queued for acceptance."""

    sources: list[RowSource]
    queued: QueuedMasks


class SpecSampler:
    def __init__(self, sampler: DeviceSampler, k: int, block_v: int = 2048, masks: PrefixMasks | None = None):
        """`masks`: the round's grammar rows, the Program's (its verify graphs run their bracket); None: made here
        when a round first needs them, queued eagerly."""
        self.sampler, self.k, self.tables = sampler, k, sampler.tables
        self.vocab, self.device, self.max_batch = sampler.vocab, sampler.device, sampler.max_batch
        self.triton, self.block_v = sampler.kernels == "triton", block_v
        self._masks = masks
        if self.triton:
            self._ws = SpecAcceptWorkspace.allocate(self.max_batch, k, self.vocab, self.device, block_v)
            # a block draw races every slot of every row at once
            self._race_ws = RaceWorkspace.allocate(self.max_batch * k, self.vocab, block_v, self.device)
            self._lp_ws = LogprobsWorkspace.allocate(self.max_batch * (k + 1), self.vocab, self.device, block_v)

    def _bind(self, seq, ctx: RowContext) -> None:
        if not self.tables.bound(seq.row, seq.handle):
            self.tables.bind(seq.row, seq.handle, ctx.params, ctx.prompt, ctx.outputs, ctx.eos_token_ids)

    def _rows(self, bases: Sequence[SampleRow], plain: Sequence[bool], n: int,
              masked: Sequence[Sequence[bool]] | None = None) -> RowParams:
        """Parameter rows b * n + i (i < n): bases[b] (drawn at its position) i positions on, with i more outputs
        (the drafts before it) for min_tokens, and masked[b][i] saying whether a grammar row constrains it; a plain
        row runs as plain greedy. The flags decide the steps now; the rows are filled (one host fill per base row)
        and copied once, when first read."""
        flags: list[int] = []
        for b, (r, pl) in enumerate(zip(bases, plain)):
            flags += [L.GREEDY] * n if pl else \
                [row_flags(r, self.sampler.eos, i, bool(masked and masked[b][i])) for i in range(n)]

        def stage() -> torch.Tensor:
            base = np.zeros((len(bases), NI + NF), dtype=np.int64)
            for b, r in enumerate(bases):
                fill_row(base[b, :NI], base[b, NI:].view(np.float64), r, 0)
            host = torch.from_numpy(np.repeat(base, n, axis=0))  # [B * n, NI | NF]
            ints = host[:, :NI].numpy()
            ints[:, L.POSITION] += np.tile(np.arange(n), len(bases))
            ints[:, L.FLAGS] = flags
            return host
        params = [r.params for r, pl in zip(bases, plain) if not pl]
        any_mask = masked is not None and any(any(m) for m in masked)
        return RowParams(stage, self.device, Steps.of(flags, params, any_mask))

    def _base(self, seq, ctx: RowContext) -> SampleRow:
        """The row's draw at frontier + 1, its tables bound."""
        self._bind(seq, ctx)
        return SampleRow(ctx.params, ctx.seed, seq.frontier + 1, seq.row, seq.handle, seq.num_outputs, seq)

    def draft_rows(self, seqs: Sequence[Any], ctxs: Sequence[RowContext], k: int) -> RowParams:
        """Row b * k + j: the draft at position frontier + 1 + j (no grammar mask: lossless for any q)."""
        bases = [self._base(s, c) for s, c in zip(seqs, ctxs)]
        rows = self._rows(bases, [bool(self.tables.invalid[s.row]) for s in seqs], k)
        # the draft graph variant's steps: a step no row of the call needs is an identity per row, so the eager
        # draws and the graphed ones run the same steps
        rows.penalized = rows.steps.penalties
        rows.steps = draw_steps(draw_variant(rows.steps))
        return rows

    def draw(self, rows: RowParams, block: DraftBlock, j: int, live: torch.Tensor, logits: torch.Tensor
             ) -> torch.Tensor:
        """Draft j of the batch rows `live` [b] long from the draft logits [b, V]; recorded in `block`; returns the
        tokens [b] long (the next draft step's inputs)."""
        at = live * self.k + j
        upto = torch.full_like(live, j) if j else None  # no drafts before the first: no counts to add
        token, z, ok = self._draw(rows.ip[at], rows.fp[at], rows.steps, block.tokens[live], upto, logits)
        if z is not None:
            block.z[live, j] = z
        block.tokens[live, j] = token
        # a row keeps drafting while every draft so far could be drawn: num counts that unbroken prefix
        room = to_device(block.lens, self.device)[live]
        block.num[live] += (ok & (block.num[live] == j) & (j < room)).to(torch.int32)
        return token

    def draw_static(self, d: StaticDraws, B: int, steps: Steps, logits: torch.Tensor) -> torch.Tensor:
        """`draw` on the draft graphs' buffers (graph-safe): draft d.j of rows 0..B-1 from logits [B, V] with the
        variant's steps, recorded in `d` (d.j advanced); returns the tokens [B] long."""
        j = d.j  # [1] long
        if not steps.reads_params:  # a lean greedy draw: the argmax, its column and the count in one op
            token = (greedy_draw if self.triton else greedy_draw_naive)(logits, d.drafts, d.num, d.room, j)
            j += 1
            return token
        ip, fp = d.ip[:B].index_select(1, j)[:, 0], d.fp[:B].index_select(1, j)[:, 0]  # [B, NI], [B, NF]
        token, z, ok = self._draw(ip, fp, steps, d.drafts[:B], j.expand(B), logits)
        if z is not None:
            d.z[:B].index_copy_(1, j, z[:, None])
        record_draft(d.drafts, d.num, d.room, j, token, ok)
        j += 1
        return token

    def draw_block_static(self, d: StaticDraws, B: int, steps: Steps, logits: torch.Tensor) -> None:
        """Every draft of a block at once, for a drafter whose slots' logits [B, k, V] all exist before any draw
        (DFlash) and a round whose rows have no penalties (`steps.penalties` False: no draft sees the ones before
        it, so the k draws are independent): what k `draw_static` calls leave in `d`, in one pass over B * k rows."""
        assert not steps.penalties, "penalties make each draft depend on the ones before it"
        k = self.k
        token, z, ok = self._draw(d.ip[:B].reshape(B * k, NI), d.fp[:B].reshape(B * k, NF), steps, d.drafts[:B],
                                  None, logits.reshape(B * k, -1))
        d.drafts[:B].copy_(token.view(B, k))
        if z is not None:
            d.z[:B].copy_(z.view(B, k, -1))
        # a row keeps drafting while every draft so far could be drawn, up to its room
        alive = torch.cumprod(ok.view(B, k).to(torch.int32), dim=1)  # [B, k]
        within = torch.arange(k, device=logits.device)[None, :] < d.room[:B, None]
        d.num[:B].copy_((alive * within).sum(1).to(torch.int32))
        d.j += k

    def _draw(self, ip: torch.Tensor, fp: torch.Tensor, steps: Steps, prior: torch.Tensor, upto: torch.Tensor | None,
              logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """One draft per row: the processed logits of the row's parameters (ip/fp [b, NI]/[b, NF]) with its first
        upto[r] drafts of prior [b, k] in the penalties' history; (tokens [b] long: argmax or, random rows, the race
        on STREAM_DRAFT; z [b, V] the processed logits, None when no row is random; drawable [b] bool)."""
        V = logits.shape[-1]
        extra = draft_counts(prior, upto, V) if steps.penalties and upto is not None else None
        x = adjust(logits, ip, fp, None, self.tables, steps, extra)
        ok = drawable(x)
        token = torch.argmax(x, dim=-1)
        if not steps.random:
            return token, None, ok
        z = truncated(x, ip, fp, steps)
        return torch.where(ip[:, L.FLAGS] & L.GREEDY != 0, token, self._race(z, ip)), z, ok

    def _race(self, z: torch.Tensor, ip: torch.Tensor) -> torch.Tensor:
        """The random rows' draft from their processed logits z [b, V]: the race on STREAM_DRAFT, [b] long."""
        seeds, positions = ip[:, L.SEED], ip[:, L.POSITION]
        if self.triton:
            return gumbel_race(z, seeds, positions, STREAM_DRAFT, block=self.block_v, workspace=self._race_ws)
        return gumbel_race_naive(z, seeds, positions, STREAM_DRAFT)

    def accept(self, seqs: Sequence[Any], ctxs: Sequence[RowContext], block: DraftBlock,
               targets: Sequence[torch.Tensor], masks: Sequence[Any]) -> list[Accepted | RowFailure]:
        """targets[b]: the raw target logits [lens[b] + 1, V]; masks[b]: one grammar row (or None) per verified
        position, or a `DraftMasks` whose fill reads the drafts. Returns each row's accepted drafts plus bonus (or
        residual) token, or its failure."""
        return self.accept_later(seqs, ctxs, block, targets, self.queue_masks(block.lens, block.tokens, masks))()

    def queue_masks(self, lens: Sequence[int], tokens: torch.Tensor | None, grammar: Sequence[Any],
                    in_pass: bool = False) -> RoundGrammar | None:
        """Queue the round's grammar rows for blocks of `lens` drafts (`tokens` [B, k]: the drafts on the device,
        which a fill reads through `PrefixMasks`' host function in stream order); `in_pass`: the verify pass queued
        next runs their bracket (its masked graph), else it is queued now beside what follows. None when no row is
        constrained."""
        sources = [RowSource.of(g, n) for g, n in zip(grammar, lens)]
        if not any(s.masked for s in sources):
            return None
        fills = any(s.fill is not None for s in sources)
        if fills and tokens is None:
            raise ValueError("a grammar fill needs the round's drafts on the device")
        if self._masks is None:  # a sampler used alone (tests)
            self._masks = PrefixMasks(self.max_batch, self.k, self.vocab, self.device)
        return RoundGrammar(sources, self._masks.queue(tokens if fills else None, sources, in_pass))

    def accept_later(self, seqs: Sequence[Any], ctxs: Sequence[RowContext], block: DraftBlock,
                     targets: Sequence[torch.Tensor], grammar: RoundGrammar | None
                     ) -> Callable[[], list[Accepted | RowFailure]]:
        """`accept` queued on the device with its host copy (`grammar`: the rows `queue_masks` queued): the returned
        call waits for that copy (the round's one host sync) and reads the results, so a round launched ahead
        (async scheduling) holds it across the host's work."""
        B, K1, V = len(seqs), self.k + 1, self.vocab
        rows, errors = self._verify_rows(seqs, ctxs, block, None if grammar is None else grammar.sources)
        raw = self._stack(targets, block.lens)  # [B * K1, V]
        extra = None
        if rows.steps.penalties:  # row (b, i) counts the drafts d_1..d_i of block b
            upto = torch.arange(K1, device=self.device).repeat(B)
            extra = draft_counts(block.tokens.repeat_interleave(K1, dim=0), upto, V)
        mask_dev = None
        if grammar is not None:
            grammar.queued.ready()
            mask_dev = grammar.queued.words
        x = adjust(raw, rows.ip, rows.fp, mask_dev, self.tables, rows.steps, extra)
        z = truncated(x, rows.ip, rows.fp, rows.steps)
        out = self._accept(z.view(B, K1, V), block, rows.ip.view(B, K1, NI)[:, 0])
        wants = [c.params.logprobs for c in ctxs]
        lp = self._logprobs(raw, out, rows) if any(n is not None for n in wants) else None
        host = self._queue_read_back(out, block, lp)

        def collect() -> list[Accepted | RowFailure]:
            hostcopy.host_sync(self.device)
            failures = [None] * B
            if grammar is not None:
                self._masks.check()
                failures = grammar.queued.failures
            array = host.numpy()
            k = self.k
            block.fill_host(array[:, A.TOKENS + k + 1:A.TOKENS + 2 * k + 1].tolist())
            return [self._result(array, b, errors[b], wants[b]) if failures[b] is None else failures[b]
                    for b in range(B)]
        return collect

    def _verify_rows(self, seqs, ctxs, block: DraftBlock, sources: Sequence[RowSource] | None
                     ) -> tuple[RowParams, list]:
        """Row b * K1 + i: p at position frontier + 1 + i with that prefix's mask (a fill's rows: every verified
        position); each row's host error (ids or a host mask it refuses before reading logits: the row runs as
        plain greedy and reports it)."""
        K1, V = self.k + 1, self.vocab
        bases = [self._base(s, c) for s, c in zip(seqs, ctxs)]
        errors, masked = [], []
        for b, (s, base) in enumerate(zip(seqs, bases)):
            src = RowSource(block.lens[b]) if sources is None else sources[b]
            row_masks = [src.rows[i] if i < len(src.rows) else None for i in range(K1)]
            error = None
            for i, mask in enumerate(row_masks[:block.lens[b] + 1]):
                if error is None and (self.tables.invalid[s.row] or
                                      (mask is not None and mask_words(mask, V) is None)):
                    error = host_error(dataclasses.replace(base, position=base.position + i,
                                                           num_outputs=base.num_outputs + i, mask=mask),
                                       V, self.sampler.eos)
            masked.append([i <= src.n for i in range(K1)] if src.fill is not None else
                          [m is not None for m in row_masks])
            errors.append(error)
        any_mask = any(any(m) for m in masked)
        return self._rows(bases, [e is not None for e in errors], K1, masked if any_mask else None), errors

    def _stack(self, targets: Sequence[torch.Tensor], lens: Sequence[int]) -> torch.Tensor:
        """Verified row (b, i) of the rows' logits [B * K1, V] (rows past a block's end repeat its last row:
        acceptance never reads them)."""
        flat = torch.cat([t.to(self.device, torch.float32) for t in targets])
        K1, index, start = self.k + 1, [], 0
        for n in lens:
            index += [start + min(i, n) for i in range(K1)]
            start += n + 1
        return flat.index_select(0, to_device(index, self.device, torch.long))

    def _accept(self, z: torch.Tensor, block: DraftBlock, iparams: torch.Tensor) -> torch.Tensor:
        if self.triton:
            return spec_accept(z, block.tokens, block.num, iparams, block.z, workspace=self._ws)
        return spec_accept_naive(z, block.tokens, block.num, iparams, block.z)

    def _logprobs(self, raw: torch.Tensor, out: torch.Tensor, rows: RowParams) -> torch.Tensor:
        """The raw logprobs of every emitted token (row (b, i) at out's token i), int32 [B * K1, LP.COLUMNS]."""
        chosen = out[:, A.TOKENS:].reshape(-1).clamp(min=0)
        num = rows.ip[:, L.NUM_LOGPROBS]
        if self.triton:
            return logprobs(raw, chosen, num, workspace=self._lp_ws)
        return logprobs_naive(raw, chosen, num)

    def _queue_read_back(self, out: torch.Tensor, block: DraftBlock, lp: torch.Tensor | None) -> torch.Tensor:
        """The round's one host copy, queued: [B, 2 + K1 | k drafts | K1 * LP.COLUMNS] int32 (pinned on CUDA)."""
        B = out.shape[0]
        parts = [out, block.tokens.to(torch.int32)] + ([] if lp is None else [lp.view(B, -1)])
        packed = torch.cat(parts, dim=1)
        host = torch.empty(packed.shape, dtype=torch.int32, pin_memory=packed.is_cuda)
        host.copy_(packed, non_blocking=True)
        return host

    def _result(self, host: np.ndarray, b: int, error, want: int | None) -> Accepted | RowFailure:
        if error is not None:
            return error.failure
        row = host[b]
        if row[A.STATUS] != L.OK:
            return _FAILURE[int(row[A.STATUS])]
        tokens = tuple(int(t) for t in row[A.TOKENS:A.TOKENS + int(row[A.COUNT])])
        if want is None:
            return Accepted(tokens, None)
        base = A.TOKENS + 2 * self.k + 1
        lps = []
        for i in range(len(tokens)):
            lp = row[base + i * LP.COLUMNS:base + (i + 1) * LP.COLUMNS]
            values = lp.view(np.float32)
            n = min(want, self.vocab)
            lps.append((float(values[LP.CHOSEN]), tuple(zip(lp[LP.TOP_IDS:LP.TOP_IDS + n].tolist(),
                                                            values[LP.TOP_VALUES:LP.TOP_VALUES + n].tolist()))))
        return Accepted(tokens, tuple(lps))
