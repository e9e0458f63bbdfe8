"""SpecSampler: a speculative round's draws on the device, so the round reads back one packed int32 tensor.

- ``draft_rows`` + ``draw``: the draft token at every draft position F + 1 + j of every row, drawn as
  ``ninfer.sampling.draw_draft`` does (processed draft logits, penalties over the drafts before; greedy rows the
  argmax, random rows the race on stream ``STREAM_DRAFT``), the processed logits kept as q, a row whose draft
  distribution cannot be drawn from ending its drafts there (``DraftBlock.num``).
- ``accept``: p at every verified position (steps 1-8 with that draft prefix's grammar mask and the drafts before it
  in the penalties' history), ``spec_accept`` (the host ``accept``, tested equal to it), the raw logprobs of every
  emitted token, and one host copy of (count, status, tokens, drafts, logprobs) for the whole batch.

The host ``ninfer.sampling.speculative`` stays the definition: ``tests/fast_program/test_spec_sampler.py`` checks
these draws against it row by row. Rows the host sampler refuses before reading logits (ids outside the vocabulary,
a malformed mask: ``rows.host_error``) run as plain greedy rows and report the host's failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ninfer.contracts import RowFailure
from ninfer.fast import hostcopy
from ninfer.fast.hostcopy import to_device
from ninfer.fast.ops.logprobs import LogprobsWorkspace, logprobs, logprobs_naive
from ninfer.fast.ops.logprobs import layout as LP
from ninfer.fast.ops.sample import layout as L
from ninfer.fast.ops.spec_accept import SpecAcceptWorkspace, spec_accept, spec_accept_naive
from ninfer.fast.ops.spec_accept import layout as A
from ninfer.sampling import Accepted, RowContext
from ninfer.sampling.philox import STREAM_DRAFT, gumbel_noise

from .draft_block import DraftBlock
from .rows import SampleRow, fill_row, host_error, mask_words, row_flags
from .sampler import DeviceSampler
from .spec_steps import Steps, adjust, draft_counts, status, truncated

NI, NF = L.INT_COLUMNS, L.FLOAT_COLUMNS
_FAILURE = {L.BAD_LOGITS: RowFailure.NON_FINITE_LOGITS, L.ALL_MASKED: RowFailure.NOTHING_ALLOWED}


@dataclass
class RowParams:
    """Sample-layout parameter rows of one call on the device: ip [N, NI] int64, fp [N, NF] float64."""

    ip: torch.Tensor
    fp: torch.Tensor
    steps: Steps


class SpecSampler:
    def __init__(self, sampler: DeviceSampler, k: int, block_v: int = 2048):
        self.sampler, self.k, self.tables = sampler, k, sampler.tables
        self.vocab, self.device, self.max_batch = sampler.vocab, sampler.device, sampler.max_batch
        self.triton = sampler.kernels == "triton"
        if self.triton:
            self._ws = SpecAcceptWorkspace.allocate(self.max_batch, k, self.vocab, self.device, block_v)
            self._lp_ws = LogprobsWorkspace.allocate(self.max_batch * (k + 1), self.vocab, self.device, block_v)

    # ---- parameter rows ---------------------------------------------------------------------------------------
    def _bind(self, seq, ctx: RowContext) -> None:
        if not self.tables.bound(seq.row, seq.handle):
            self.tables.bind(seq.row, seq.handle, ctx.params, ctx.prompt, ctx.outputs, ctx.eos_token_ids)

    def _rows(self, entries: list[tuple[SampleRow, bool]], masked: bool) -> RowParams:
        """One parameter row per (row, run as plain greedy) entry, filled on the host and copied once."""
        host = torch.zeros(len(entries), NI + NF, dtype=torch.int64)
        ints, floats = host[:, :NI].numpy(), host[:, NI:].view(torch.float64).numpy()
        flags = []
        for n, (r, plain) in enumerate(entries):
            flags.append(L.GREEDY if plain else row_flags(r, self.sampler.eos))
            fill_row(ints[n], floats[n], r, flags[-1])
        dev = host.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else \
            host.to(self.device)
        params = [r.params for r, plain in entries if not plain]
        return RowParams(dev[:, :NI], dev[:, NI:].view(torch.float64), Steps.of(flags, params, masked))

    def draft_rows(self, seqs: Sequence[Any], ctxs: Sequence[RowContext], k: int) -> RowParams:
        """Row b * k + j: the draft at position frontier + 1 + j (no grammar mask: lossless for any q)."""
        entries = []
        for s, c in zip(seqs, ctxs):
            self._bind(s, c)
            plain = self.tables.invalid[s.row]
            entries += [(SampleRow(c.params, c.seed, s.frontier + 1 + j, s.row, s.handle, s.num_outputs + j, s),
                         plain) for j in range(k)]
        return self._rows(entries, False)

    def draw(self, rows: RowParams, block: DraftBlock, j: int, live: torch.Tensor, logits: torch.Tensor
             ) -> torch.Tensor:
        """Draft j of the batch rows `live` [b] long from the draft logits [b, V]; recorded in `block`; returns the
        tokens [b] long (the next draft step's inputs)."""
        k, V = self.k, logits.shape[-1]
        at = live * k + j
        ip, fp = rows.ip[at], rows.fp[at]
        extra = draft_counts(block.tokens[live], torch.full_like(live, j), V) if rows.steps.penalties and j else None
        x = adjust(logits, ip, fp, None, self.tables, rows.steps, extra)
        ok = status(x) == L.OK
        token = torch.argmax(x, dim=-1)
        if rows.steps.random:
            z = truncated(x, ip, fp, rows.steps)
            noise = gumbel_noise(ip[:, L.SEED], ip[:, L.POSITION], V, STREAM_DRAFT)
            race = torch.argmax(z.double() + noise.double(), dim=-1)
            token = torch.where(ip[:, L.FLAGS] & L.GREEDY != 0, token, race)
            block.z[live, j] = z
        block.tokens[live, j] = token
        # a row keeps drafting while every draft so far could be drawn: num counts that unbroken prefix
        room = to_device(block.lens, self.device)[live]
        block.num[live] += (ok & (block.num[live] == j) & (j < room)).to(torch.int32)
        return token

    # ---- acceptance -------------------------------------------------------------------------------------------
    def accept(self, seqs: Sequence[Any], ctxs: Sequence[RowContext], block: DraftBlock,
               targets: Sequence[torch.Tensor], masks: Sequence[list[Any | None]]) -> list[Accepted | RowFailure]:
        """targets[b]: the raw target logits [lens[b] + 1, V]; masks[b]: one grammar row (or None) per verified
        position. Returns each row's accepted drafts plus bonus (or residual) token, or its failure."""
        B, K1, V = len(seqs), self.k + 1, self.vocab
        rows, errors, words = self._verify_rows(seqs, ctxs, block, masks)
        raw = self._stack(targets, block.lens)  # [B * K1, V]
        extra = None
        if rows.steps.penalties:  # row (b, i) counts the drafts d_1..d_i of block b
            upto = torch.arange(K1, device=self.device).repeat(B)
            extra = draft_counts(block.tokens.repeat_interleave(K1, dim=0), upto, V)
        mask_dev = None if words is None else to_device(words.tolist(), self.device)
        x = adjust(raw, rows.ip, rows.fp, mask_dev, self.tables, rows.steps, extra)
        z = truncated(x, rows.ip, rows.fp, rows.steps)
        out = self._accept(z.view(B, K1, V), block, rows.ip.view(B, K1, NI)[:, 0])
        wants = [c.params.logprobs for c in ctxs]
        lp = self._logprobs(raw, out, rows) if any(n is not None for n in wants) else None
        host = self._read_back(out, block, lp)
        return [self._result(host, b, errors[b], wants[b]) for b in range(B)]

    def _verify_rows(self, seqs, ctxs, block: DraftBlock, masks) -> tuple[RowParams, list, torch.Tensor | None]:
        """Row b * K1 + i: p at position frontier + 1 + i with that prefix's mask; each row's host error (ids or a
        mask the host refuses before reading logits: the row runs as plain greedy and reports it); the masks."""
        K1, V = self.k + 1, self.vocab
        entries, errors, words = [], [], None
        for b, (s, c) in enumerate(zip(seqs, ctxs)):
            self._bind(s, c)
            error = None
            for i in range(K1):
                mask = masks[b][i] if i < len(masks[b]) else None
                r = SampleRow(c.params, c.seed, s.frontier + 1 + i, s.row, s.handle, s.num_outputs + i, s, mask)
                w = None if mask is None else mask_words(mask, V)
                if error is None and i <= block.lens[b] and (self.tables.invalid[s.row] or
                                                             (mask is not None and w is None)):
                    error = host_error(r, V, self.sampler.eos)
                if w is not None:
                    if words is None:
                        words = torch.zeros(len(seqs) * K1, L.bitmask_words(V), dtype=torch.int32)
                    words[b * K1 + i] = w
                entries.append(r)
            errors.append(error)
        rows = self._rows([(r, errors[n // K1] is not None) for n, r in enumerate(entries)], words is not None)
        return rows, errors, words

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

    def _read_back(self, out: torch.Tensor, block: DraftBlock, lp: torch.Tensor | None) -> np.ndarray:
        """The round's one host copy: [B, 2 + K1 | k drafts | K1 * LP.COLUMNS] int32."""
        B = out.shape[0]
        parts = [out, block.tokens.to(torch.int32)] + ([] if lp is None else [lp.view(B, -1)])
        packed = torch.cat(parts, dim=1)
        host = torch.empty(packed.shape, dtype=torch.int32, pin_memory=packed.is_cuda)
        host.copy_(packed, non_blocking=True)
        hostcopy.host_sync(self.device)
        array = host.numpy()
        k = self.k
        block.fill_host(array[:, A.TOKENS + k + 1:A.TOKENS + 2 * k + 1].tolist())
        return array

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
