"""GrammarState: one request's matcher, advanced only through preview forks that a commit adopts.

Bitmasks are int32 rows of ceil(vocab/32) words (xgrammar.allocate_token_bitmask). For speculative backends
`fill_bitmask(drafts, out)` writes len(drafts)+1 rows: row i is the grammar after drafts[0..i). After an
illegal draft, or after a draft that ends the output (a stop token), later rows are unreachable: they get
an all-allowed mask (no grammar traversal, and no all -inf logits row downstream) and are not counted.
"""

from __future__ import annotations

from typing import Sequence

import torch
import xgrammar as xgr


class GrammarState:
    def __init__(self, matcher: xgr.GrammarMatcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.accepted_tokens = 0

    def fork(self) -> "GrammarState":
        twin = GrammarState(self.matcher.fork(), self.vocab_size)
        twin.accepted_tokens = self.accepted_tokens
        return twin

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) when the grammar forbids it."""
        if not self.matcher.accept_token(int(token_id)):
            return False
        self.accepted_tokens += 1
        return True

    @property
    def terminated(self) -> bool:
        """The grammar accepted a stop token: nothing may follow."""
        return self.matcher.is_terminated()

    @property
    def completed(self) -> bool:
        """The output so far is a complete sentence of the grammar (a stop token may come next)."""
        return self.matcher.is_completed()

    def allocate(self, rows: int = 1) -> torch.Tensor:
        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def fill_next(self, out: torch.Tensor, row: int = 0) -> None:
        """The ordinary single-row fill: the mask of the next token into out[row]."""
        self._fill(self.matcher, out, row)

    def fill_bitmask(self, drafts: Sequence[int], out: torch.Tensor) -> int:
        """Rows 0..len(drafts) of `out`, row i after drafts[0..i); returns the number of reachable rows."""
        if out.shape[0] < len(drafts) + 1:
            raise ValueError(f"bitmask has {out.shape[0]} rows, {len(drafts) + 1} needed for {len(drafts)} drafts")
        self._fill(self.matcher, out, 0)
        if not drafts:
            return 1
        walker = self.matcher.fork()
        for i, token in enumerate(drafts):
            if walker.is_terminated() or not walker.accept_token(int(token)) or walker.is_terminated():
                out[i + 1:len(drafts) + 1].fill_(-1)
                return i + 1
            self._fill(walker, out, i + 1)
        return len(drafts) + 1

    def _fill(self, matcher: xgr.GrammarMatcher, out: torch.Tensor, row: int) -> None:
        """A dead end (a mask allowing nothing, which a request's own schema can reach) stays all-zero: the sampler
        then reports NOTHING_ALLOWED for that row and the request ends alone, never the Engine."""
        if matcher.is_terminated():
            out[row].fill_(-1)
            return
        matcher.fill_next_token_bitmask(out, row)
