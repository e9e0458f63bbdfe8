"""PrefixMasks: a speculative round's grammar rows, filled in stream order from drafts that never left the device.

A row whose Frontend session constrains its block (`DraftMasks.fill`) needs one bitmask row per verified position,
row i after drafts[:i], before acceptance applies them to p. The drafts exist only on the device until the round's
one readback, so the fill runs as the seed's structured-output section orders it for device drafters (DFlash,
DFlash2; the MTP head's device drafts take the same path): D2H draft transfer, a CUDA host function that fills every
reachable prefix row, H2D mask transfer, then acceptance, with no host sync in between. The bracket is captured in
the round's verify graph (`VerifyGraphRunner`'s masked variants: one captured step), forked onto a side stream at the
pass's start and joined before its end, so the host's fill overlaps the target pass instead of stalling it (the
seed's order puts the fill before verification; only acceptance reads the rows, and it runs after the join):

    main stream:  drafts --copy into `drafts`--> [verify graph: fork ---- target pass ---- join] -> acceptance
    side stream:                                              [D2H drafts -> host function -> H2D words]

A round whose blocks fit no verify graph queues the same bracket eagerly on the side stream (`queue`, not
`in_pass`), and acceptance waits for its event. Every node address is this object's (the fixed `drafts` source, the
pinned `host_drafts` and `host_words`, the device `words`, the host function's trampoline), owned by the Program
and alive as long as its graphs.

The host function calls no CUDA API (numpy views of pinned buffers, CPU tensors of the session's fill). A row's
fill that raises or returns malformed rows fails that row alone (`failures`, read after the round's sync: the row
ends its request, the others are accepted); an error of the function itself is kept by `HostFunction` and raised
at the sync, before any token of the round is published. Without CUDA the function runs when queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ninfer.contracts import EngineFailure, RowFailure
from ninfer.fast.host_function import HostFunction
from ninfer.fast.ops.sample import layout as L

from .rows import mask_words


@dataclass(frozen=True)
class RowSource:
    """One row's grammar in a round: `fill(drafts) -> rows` over its first `n` drafts (read on the host function's
    side), or `words`: rows the host already has, one per verified position (None: unconstrained there)."""

    n: int
    fill: Callable[[Sequence[int]], Any] | None = None
    rows: Sequence[Any | None] = ()  # bitmask rows as the session gave them (int32 words or bool [V])

    @classmethod
    def of(cls, grammar: Any, n: int) -> "RowSource":
        """One row's entry of a round over n drafts: a `DraftMasks` whose fill reads the drafts, the host's rows
        (a list), or nothing (None, or a row that already failed)."""
        fill = getattr(grammar, "fill", None)
        if fill is not None:
            return cls(n, fill=fill)
        return cls(n, rows=tuple(grammar)) if isinstance(grammar, list) else cls(n)

    @property
    def masked(self) -> bool:
        return self.fill is not None or any(m is not None for m in self.rows)


@dataclass
class QueuedMasks:
    """A round's grammar rows as acceptance reads them: `words` [B * (k + 1), W] int32 on the device once `ready`
    has made the current stream wait; `failures[b]` is row b's fill failure, valid after the round's host sync."""

    words: torch.Tensor
    ready: Callable[[], None]
    failures: list[RowFailure | None] = field(default_factory=list)


class PrefixMasks:
    def __init__(self, max_batch: int, k: int, vocab: int, device: torch.device):
        self.max_batch, self.k1, self.vocab = max_batch, k + 1, vocab
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        W = L.bitmask_words(vocab)
        self.drafts = torch.zeros(max_batch, max(1, k), dtype=torch.long, device=device)  # the D2H copy's source
        self.host_drafts = torch.zeros(max_batch, max(1, k), dtype=torch.long, pin_memory=self.cuda)
        self.host_words = torch.zeros(max_batch * self.k1, W, dtype=torch.int32, pin_memory=self.cuda)
        self.words = torch.zeros(max_batch * self.k1, W, dtype=torch.int32, device=device)
        self._drafts_np, self._words_np = self.host_drafts.numpy(), self.host_words.numpy()
        self.function = HostFunction(self._fill)
        self._rows: Sequence[RowSource] = ()
        self._failures: list[RowFailure | None] = []
        self.side = torch.cuda.Stream(device) if self.cuda else None
        self._done = torch.cuda.Event() if self.cuda else None

    def _fill(self) -> None:
        """The host function: every row's words into `host_words` (rows b * k1 ..), from `host_drafts`."""
        k1 = self.k1
        for b, src in enumerate(self._rows):
            out = self._words_np[b * k1:(b + 1) * k1]
            out.fill(-1)  # every token allowed where nothing constrains (such positions are never masked)
            try:
                rows = [mask_words(m, self.vocab) if m is not None else None for m in src.rows] \
                    if src.fill is None else _filled(src.fill(self._drafts_np[b, :src.n].tolist()), src.n, self.vocab)
            except Exception:  # noqa: BLE001 - the session's grammar failed: its row alone
                self._failures[b] = RowFailure.INVALID_SAMPLING_INPUT
                continue
            for i, w in enumerate(rows):
                if w is not None:  # a malformed host row stays open: the host reported it before the launch
                    out[i] = w.numpy()

    def _body(self, B: int) -> None:
        """The bracket over B rows: D2H drafts, the host function, H2D words (on the current stream)."""
        stream = torch.cuda.current_stream() if self.cuda else None
        self.host_drafts[:B].copy_(self.drafts[:B], non_blocking=self.cuda)
        self.function.queue(stream)
        self.words[:B * self.k1].copy_(self.host_words[:B * self.k1], non_blocking=self.cuda)

    def fork(self, B: int) -> None:
        """The bracket over B rows on the side stream after the current stream's work so far (the start of a verify
        graph's body, captured with it; eager elsewhere); `join` makes the current stream wait for it."""
        if not self.cuda:
            self._body(B)
            return
        self.side.wait_stream(torch.cuda.current_stream(self.words.device))
        with torch.cuda.stream(self.side):
            self._body(B)

    def join(self) -> None:
        if self.cuda:
            torch.cuda.current_stream(self.words.device).wait_stream(self.side)

    def queue(self, tokens: torch.Tensor | None, rows: Sequence[RowSource], in_pass: bool = False) -> QueuedMasks:
        """Stage the round's rows and drafts (`tokens` [B, k] drawn on the current stream; None: no row reads
        drafts). `in_pass`: the verify pass queued next runs the bracket in its body (`fork` .. `join`), so the words
        are ready after it; otherwise the bracket is queued now on the side stream and acceptance waits for it."""
        B = len(rows)
        if not 1 <= B <= self.max_batch:
            raise ValueError(f"prefix masks take 1..{self.max_batch} rows, got {B}")
        self._rows, self._failures = tuple(rows), [None] * B
        if tokens is not None and tokens.shape[1]:
            self.drafts[:B, :tokens.shape[1]].copy_(tokens)
        words = self.words[:B * self.k1]
        if not in_pass:
            self.fork(B)  # without CUDA: the bracket runs now
            if self.cuda:
                self._done.record(self.side)
                return QueuedMasks(words, lambda: torch.cuda.current_stream(self.words.device).wait_event(self._done),
                                   self._failures)
        return QueuedMasks(words, lambda: None, self._failures)

    def check(self) -> None:
        """After the round's sync: raise what the host function itself raised (a fault of the Program, not a
        session's: an EngineFailure, before the round's PendingBatch exists)."""
        error = self.function.take_error()
        if error is not None:
            raise EngineFailure(f"the prefix-mask host function failed: {error!r}") from error


def _filled(rows: Any, n: int, vocab: int) -> list[torch.Tensor]:
    """A fill's rows 0..n as int32 words (bool rows packed); ValueError when one is malformed."""
    words = [mask_words(rows[i], vocab) for i in range(n + 1)]
    if any(w is None for w in words):
        raise ValueError(f"a grammar fill gave malformed rows for {n} drafts")
    return words
