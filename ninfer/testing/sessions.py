"""TokenSession: a minimal OutputSession over token ids (stop ids, max_tokens, min_tokens, a thinking budget).

It stands in for the real Frontend in Engine tests and the property harness, and follows the same contract:
preview on a fork, commit moves the fork in, a dropped preview changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ninfer.contracts import DraftMasks, FinishReason


@dataclass(frozen=True, slots=True)
class TokenPreview:
    accepted: int
    terminal: bool
    finish_reason: FinishReason | None
    boundary: int | None
    tokens: tuple[int, ...]
    forced: bool
    needs_control: bool = False


class TokenSession:
    def __init__(self, max_tokens: int, *, stop_ids: Sequence[int] = (0,), min_tokens: int = 0,
                 think_budget: int | None = None, think_end: int = 1,
                 commit_guard: Callable[[TokenPreview], None] | None = None, mask: Any = None):
        self.max_tokens, self.stop_ids, self.min_tokens = max_tokens, frozenset(stop_ids), min_tokens
        # the mask of every sampled token (bool [V]; None: unconstrained), or a callable of the committed token count
        # giving it; under speculation such a callable also says its `vocab` (`AlternateMask` does)
        self.mask = mask
        self.think_budget, self.think_end = think_budget, think_end
        self.tokens: list[int] = []
        self.forced: list[tuple[int, ...]] = []
        self.commits = 0
        self.finish: FinishReason | None = None
        self.commit_guard = commit_guard

    def preview(self, tokens: Sequence[int], *, forced: bool = False) -> TokenPreview:
        n = len(self.tokens)
        for i, t in enumerate(tokens):
            count = n + i + 1
            if not forced and t in self.stop_ids and count > self.min_tokens:
                return TokenPreview(i + 1, True, FinishReason.STOP, i + 1, tuple(tokens[:i + 1]), forced)
            if count >= self.max_tokens:
                return TokenPreview(i + 1, True, FinishReason.LENGTH, None, tuple(tokens[:i + 1]), forced)
        control = self._control_after(self.tokens + list(tokens), bool(self.forced) or forced)
        return TokenPreview(len(tokens), False, None, None, tuple(tokens), forced, control is not None)

    def commit(self, preview: TokenPreview) -> tuple[int, ...]:
        if self.commit_guard is not None:
            self.commit_guard(preview)
        self.tokens.extend(preview.tokens)
        if preview.forced:
            self.forced.append(preview.tokens)
        self.commits += 1
        if preview.terminal:
            self.finish = preview.finish_reason
        return preview.tokens

    def end(self, reason: FinishReason) -> None:
        """Nothing is ever held back here, so no last delta."""
        if self.finish is not None:
            raise AssertionError(f"TokenSession.end({reason}) after the output ended with {self.finish}")
        self.finish = reason

    def next_token_mask(self) -> Any:
        return self.mask(len(self.tokens)) if callable(self.mask) else self.mask

    def draft_masks(self) -> DraftMasks | None:
        """The mask of each draft prefix's next token (a `mask` that depends on the count alone, as `AlternateMask`
        does, is the same for every draft); while a thinking budget is running, a speculative block stops at it (the
        forced think-end comes right after the budget's last token, as in a plain run)."""
        budget = self.think_budget is not None and not self.forced and self.think_end not in self.tokens
        max_block = max(1, self.think_budget - len(self.tokens)) if budget else None
        if self.mask is None:
            return None if max_block is None else DraftMasks(max_block=max_block)
        return DraftMasks(fill=self._draft_rows, max_block=max_block)

    def _draft_rows(self, drafts: Sequence[int]) -> Any:
        """int32 [len(drafts) + 1, ceil(V / 32)] bitmask rows (bit t % 32 of word t // 32), row i the mask after
        drafts[:i] (a bool [V] mask, or a callable of the count with a `vocab`); an unconstrained position allows
        every token."""
        import numpy as np
        import torch

        n = len(self.tokens)
        masks = [self.mask(n + i) if callable(self.mask) else self.mask for i in range(len(drafts) + 1)]
        vocab = self.mask.vocab if callable(self.mask) else self.mask.shape[0]
        bits = np.zeros((len(masks), -(-vocab // 32) * 32), dtype=bool)
        for i, m in enumerate(masks):
            bits[i, :vocab] = True if m is None else m.numpy()
        return torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view("<i4").copy())

    def control_suffix(self) -> tuple[int, ...] | None:
        """Once the thinking budget is spent without a think-end token, force one (once)."""
        return self._control_after(self.tokens, bool(self.forced))

    def _control_after(self, tokens: Sequence[int], forced: bool) -> tuple[int, ...] | None:
        if self.think_budget is None or forced or self.think_end in tokens:
            return None
        if len(tokens) >= self.think_budget and len(tokens) < self.max_tokens:
            return (self.think_end,)
        return None

    def result(self) -> dict[str, object]:
        if self.finish is None:
            raise AssertionError("TokenSession.result before the output ended")
        return {"tokens": tuple(self.tokens), "forced": tuple(self.forced), "finish": self.finish}


def token_request(prompt, max_tokens: int = 6, *, think_budget: int | None = None, **kw):
    """A GenerationRequest with a TokenSession: the usual request of Engine tests."""
    from ninfer.engine.records import GenerationRequest

    return GenerationRequest(tuple(prompt), TokenSession(max_tokens, think_budget=think_budget), max_tokens, **kw)


class AlternateMask:
    """A grammar stand-in for `TokenSession(mask=...)`: every other sampled output token (the 2nd, 4th, ...) is
    limited to a fixed set that holds the stop id 0, the others are unconstrained, so a batch's rounds alternate
    between masked and unmasked."""

    def __init__(self, vocab: int, allowed: Sequence[int] = (0, 3, 5, 8, 13)):
        import torch

        self.vocab = vocab
        self.allowed = torch.zeros(vocab, dtype=torch.bool)  # [V]
        self.allowed[[t % vocab for t in allowed]] = True

    def __call__(self, count: int) -> Any:
        return self.allowed if count % 2 == 1 else None



class ParityMask:
    """A grammar stand-in for `TokenSession(mask=...)` whose rows differ at every position: output i must have the
    parity of i (and is never the stop id 0), so a speculative round needs one row per draft prefix."""

    def __init__(self, vocab: int):
        import torch

        self.vocab = vocab
        ids = torch.arange(vocab)
        self.rows = ((ids % 2 == 0) & (ids != 0), (ids % 2 == 1) & (ids != 0))  # bool [V] each

    def __call__(self, count: int) -> Any:
        return self.rows[count % 2]
