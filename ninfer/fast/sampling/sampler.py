"""DeviceSampler: the sample and logprobs ops over static buffers, so that a decode graph ends in sampled tokens.

Per step the host fills one pinned parameter row per batch row (and the grammar mask rows), copies them into the
graph's input buffers, replays (or runs the ops eagerly on the same buffers), and copies back the B (token, status)
pairs, plus the logprob rows when some row asked for them: one host sync. A status other than OK becomes that row's
``RowFailure`` (the host sampler's ``SamplingError.failure`` for the same inputs), as do ids and masks the host
refuses before it looks at the logits (``rows.host_error``); those rows run as plain greedy rows on the device, and
their result is dropped. A failed row ends its request alone; the other rows of the step are drawn as usual.

The prefill draw (one row, logits from ``FastModel.prefill``) replays a sampling-only graph per variant, captured
at start on ``logits_in``; decode graphs call ``stages`` after the model (``DecodeGraphRunner``).
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch

from ninfer.fast.capture import no_collection_during_capture
from ninfer.fast.ops.logprobs import LogprobsWorkspace, logprobs, logprobs_naive
from ninfer.fast.ops.logprobs import layout as LP
from ninfer.fast.ops.sample import SampleInputs, SampleWorkspace, sample, sample_naive
from ninfer.fast.ops.sample import layout as L
from ninfer.contracts import RowFailure

from .rows import (GREEDY, SORT, TOP_K, TOP_K_BOUND, VARIANTS, SampleRow, fill_row, host_error, mask_words,
                   row_flags, variant_of)
from .tables import SequenceTables

NI, NF = L.INT_COLUMNS, L.FLOAT_COLUMNS
_STATUS_FAILURE = {L.BAD_LOGITS: RowFailure.NON_FINITE_LOGITS, L.ALL_MASKED: RowFailure.NOTHING_ALLOWED}

Drawn = tuple[int, tuple[float, tuple] | None]


class DeviceSampler:
    VARIANTS = VARIANTS

    def __init__(self, vocab: int, max_batch: int, table_rows: int, device: torch.device | str, *,
                 kernels: str = "triton", eos_token_ids: Sequence[int] = (), block_v: int = 2048,
                 use_graphs: bool = True):
        if kernels not in ("triton", "naive"):
            raise ValueError(f"unknown kernel backend {kernels!r}; expected 'triton' or 'naive'")
        self.vocab, self.max_batch, self.kernels = vocab, max_batch, kernels
        self.device = torch.device(device)
        self.eos = tuple(eos_token_ids)
        self.tables = t = SequenceTables(table_rows, vocab, device)
        dev = dict(device=device)
        self.params = torch.zeros(max_batch, NI + NF, dtype=torch.int64, **dev)  # [max_batch, NI | NF]
        self.masks = torch.zeros(max_batch, L.bitmask_words(vocab), dtype=torch.int32, **dev)
        self.inputs = SampleInputs(self.params[:, :NI], self.params[:, NI:].view(torch.float64), self.masks, t.bias,
                                   t.blocked, t.prompt_seen, t.counts)
        self.picked = torch.zeros(max_batch, 2, dtype=torch.int32, **dev)  # (token, status)
        self.lp = torch.zeros(max_batch, LP.COLUMNS, dtype=torch.int32, **dev)
        self.logits_in = torch.zeros(1, vocab, dtype=torch.float32, **dev)  # the prefill graphs' input
        self._cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.use_graphs = self._cuda and use_graphs  # False: the prefill draw runs its ops eagerly
        self._host = _HostBuffers(max_batch, vocab, self._cuda)
        self._banks, self._bank = (_ReadbackBank(max_batch, self._cuda), _ReadbackBank(max_batch, self._cuda)), 0
        self._staged = torch.cuda.Event() if self._cuda else None
        self._pending: tuple[int, list, list] | None = None
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        if kernels == "triton":
            self._ws = SampleWorkspace.allocate(max_batch, vocab, device, block_v)
            self._lp_ws = LogprobsWorkspace.allocate(max_batch, vocab, device, block_v)

    def stages(self, logits: torch.Tensor, variant: str) -> None:
        """Sample the first B = logits.shape[0] rows of the input buffers into ``picked`` (and ``lp``): what the
        graphs capture."""
        B = logits.shape[0]
        inp = self.inputs.rows(B)
        picked, lp, num = self.picked[:B], self.lp[:B], inp.iparams[:, L.NUM_LOGPROBS]
        if self.kernels == "naive":
            picked.copy_(sample_naive(logits, inp))
            if variant != GREEDY:
                lp.copy_(logprobs_naive(logits, picked[:, 0], num))
            return
        sample(logits, inp, race=variant != GREEDY, sort=variant in (TOP_K, SORT),
               top_k_bound=TOP_K_BOUND if variant == TOP_K else None, workspace=self._ws, out=picked)
        if variant != GREEDY:
            logprobs(logits, picked[:, 0], num, workspace=self._lp_ws, out=lp)

    def fill_dummy(self, B: int, variant: str) -> None:
        """Capture inputs: B rows on the dummy table row, every table flag off, greedy or not as the variant is."""
        ints = torch.zeros(B, NI, dtype=torch.int64)
        ints[:, L.ROW] = self.tables.dummy_row
        ints[:, L.FLAGS] = L.GREEDY if variant == GREEDY else 0
        ints[:, L.TOP_K] = 1 if variant in (TOP_K, SORT) else 0
        ints[:, L.NUM_LOGPROBS] = -1 if variant == GREEDY else 1
        floats = torch.ones(B, NF, dtype=torch.float64)
        floats[:, L.MIN_P] = floats[:, L.FREQUENCY] = floats[:, L.PRESENCE] = 0.0
        self.params[:B].copy_(torch.cat([ints, floats.view(torch.int64)], dim=1))

    def capture(self, warmup: int = 2) -> None:
        """One sampling-only graph per variant at B = 1 on ``logits_in`` (the prefill draw); a no-op without CUDA or
        with ``use_graphs`` off."""
        if not self.use_graphs:
            return
        with no_collection_during_capture():
            self._capture(warmup)
        torch.cuda.synchronize(self.device)

    def _capture(self, warmup: int) -> None:
        stream = torch.cuda.Stream(device=self.device)
        pool = None
        for variant in VARIANTS:
            self.fill_dummy(1, variant)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    self.stages(self.logits_in, variant)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.stages(self.logits_in, variant)
            pool = graph.pool() if pool is None else pool
            self.graphs[variant] = graph

    def prepare(self, rows: Sequence[SampleRow]) -> str:
        """Bind tables, fill the input buffers for these rows; returns the graph variant the batch needs."""
        B, V = len(rows), self.vocab
        if not 1 <= B <= self.max_batch:
            raise ValueError(f"batch {B} must lie in 1..{self.max_batch} (the sampler's max_batch)")
        if self._staged is not None:
            self._staged.synchronize()  # the last step's copies have left the staging rows
        errors, masked = [], False
        for i, r in enumerate(rows):
            if not self.tables.bound(r.table_row, r.owner):
                self.tables.bind(r.table_row, r.owner, r.params, r.history.prompt, r.history.outputs, self.eos)
            words = mask_words(r.mask, V) if r.mask is not None else None
            error = None
            if self.tables.invalid[r.table_row] or (r.mask is not None and words is None):
                error = host_error(r, V, self.eos)
            if words is not None and error is None:
                self._host.masks[i].copy_(words)
                masked = True
            fill_row(self._host.ints[i], self._host.floats[i], r, L.GREEDY if error else row_flags(r, self.eos))
            errors.append(error)
        self.params[:B].copy_(self._host.params[:B], non_blocking=True)
        if masked:
            self.masks[:B].copy_(self._host.masks[:B], non_blocking=True)
        if self._staged is not None:
            self._staged.record()
        self._pending = (B, errors, [r.params.logprobs for r in rows])
        return variant_of(rows)

    def collect(self) -> list[Drawn | RowFailure]:
        """Per prepared row, after the graph or ``stages`` ran: (token, (logprob, top) or None), or the RowFailure
        the host sampler would report for that row."""
        return self.readback()()

    def readback(self) -> Callable[[], list[Drawn | RowFailure]]:
        """Queue the prepared rows' results to the host now, right behind the graph or ``stages`` that drew them,
        and return the call that waits for that copy alone and reads them (``collect``'s result). So a step queued
        after this one (a chained step, which overwrites ``picked``) is not waited for. Two host banks alternate:
        at most two steps are read back at a time."""
        if self._pending is None:
            raise RuntimeError("collect without prepare")
        (B, errors, wants), self._pending = self._pending, None
        host, self._bank = self._banks[self._bank], 1 - self._bank
        host.picked[:B].copy_(self.picked[:B], non_blocking=True)
        if any(n is not None for n in wants):
            host.lp[:B].copy_(self.lp[:B], non_blocking=True)
        if host.copied is not None:
            host.copied.record()

        def read() -> list[Drawn | RowFailure]:
            if host.copied is not None:
                host.copied.synchronize()
            out = []
            for i, (token, status) in enumerate(host.picked[:B].tolist()):
                if errors[i] is not None:
                    out.append(errors[i].failure)
                elif status != L.OK:
                    out.append(_STATUS_FAILURE[status])
                else:
                    out.append((token, None if wants[i] is None else _logprobs(host.lp[i], wants[i], self.vocab)))
            return out
        return read

    def sample(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> list[Drawn | RowFailure]:
        """Draw from given logits [B, V] (the prefill draw): the B = 1 graph when captured, else eagerly."""
        self.queue(logits, rows)
        return self.collect()

    def queue(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> None:
        """`sample` without the wait: the draws queued on the device; `collect` reads them."""
        variant = self.prepare(rows)
        if len(rows) == 1 and variant in self.graphs:
            self.logits_in.copy_(logits.reshape(1, -1))
            self.graphs[variant].replay()
        else:
            self.stages(logits, variant)

    def record(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        """Count committed output tokens, (table row, owner, tokens) per row, for the penalties."""
        self.tables.add(committed)


def _logprobs(row: torch.Tensor, n: int, vocab: int) -> tuple[float, tuple]:
    """A logprobs row read back (int32 [LP.COLUMNS]): the chosen token's logprob and the top n (id, logprob)."""
    values = row.view(torch.float32)
    n = min(n, vocab)
    ids = row[LP.TOP_IDS:LP.TOP_IDS + n].tolist()
    top = values[LP.TOP_VALUES:LP.TOP_VALUES + n].tolist()
    return float(values[LP.CHOSEN]), tuple(zip(ids, top))


class _HostBuffers:
    """Pinned (on CUDA) host mirrors of the input rows; numpy views make per-row writes cheap."""

    def __init__(self, max_batch: int, vocab: int, pin: bool):
        def zeros(*shape, dtype):
            return torch.zeros(*shape, dtype=dtype, pin_memory=pin)
        self.params = zeros(max_batch, NI + NF, dtype=torch.int64)
        self.ints = self.params[:, :NI].numpy()
        self.floats = self.params[:, NI:].view(torch.float64).numpy()
        self.masks = zeros(max_batch, L.bitmask_words(vocab), dtype=torch.int32)


class _ReadbackBank:
    """Pinned (on CUDA) host mirrors of one step's outputs, and the event of their copy."""

    def __init__(self, max_batch: int, pin: bool):
        self.picked = torch.zeros(max_batch, 2, dtype=torch.int32, pin_memory=pin)
        self.lp = torch.zeros(max_batch, LP.COLUMNS, dtype=torch.int32, pin_memory=pin)
        self.copied = torch.cuda.Event() if pin else None
