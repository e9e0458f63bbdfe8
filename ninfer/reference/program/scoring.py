"""CausalScoring: per-token log-probabilities of a text under the model, with sliding windows for long texts.

Each window starts from an empty temporary state (no request, continuation, checkpoint or cache entry), so
scoring never reaches the Scheduler, the ResourceManager or the checkpoint catalog. Windows begin every `stride`
tokens and hold at most `window` tokens; a token is scored by the first window that holds it and at least one
token before it, and never again (lm-eval's rolling loglikelihood with `window - stride` tokens of overlap).
The first token has no prefix and is not scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ninfer.reference.model import ReferenceModel


@dataclass(frozen=True)
class ScoreResult:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]  # logprobs[j] = log p(tokens[j + 1] | its window's tokens before it)
    greedy: tuple[bool, ...]  # greedy[j]: tokens[j + 1] is the argmax (lowest id on ties) at its position
    top: tuple[tuple[int, float], ...]  # top[j]: (argmax id, its logprob) at position j + 1
    next_top: tuple[int, float]  # the argmax after the last token, given the last window (a max_tokens=1 echo)
    windows: int  # forward passes run

    @property
    def total(self) -> float:
        return sum(self.logprobs)

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy)


class CausalScoring:
    def __init__(self, model: ReferenceModel):
        self.model = model

    def score(self, tokens: Sequence[int], *, window: int, stride: int) -> ScoreResult:
        """Score tokens[1:], each given up to `window - 1` tokens before it. Requires 1 <= stride < window, so
        every window's first token was already scored by the window before it."""
        tokens = tuple(int(t) for t in tokens)
        if not tokens:
            raise ValueError("score needs at least one token")
        if window < 2 or not 1 <= stride < window:
            raise ValueError(f"need window >= 2 and 1 <= stride < window, got window={window} stride={stride}")
        logprobs: list[float] = []
        greedy: list[bool] = []
        top: list[tuple[int, float]] = []
        scored, windows = 1, 0  # scored: the next position still to score
        for begin in range(0, len(tokens), stride):
            # At least one window runs, also for a single token: it gives the argmax after the last token.
            if windows and scored >= len(tokens):
                break
            end = min(begin + window, len(tokens))
            lp, best, next_top = self._window(tokens, begin, end, scored)
            logprobs.extend(lp)
            greedy.extend(b[0] == t for b, t in zip(best, tokens[scored:end]))
            top.extend(best)
            scored, windows = end, windows + 1
        return ScoreResult(tokens, tuple(logprobs), tuple(greedy), tuple(top), next_top, windows)

    def _window(self, tokens: tuple[int, ...], begin: int, end: int, first: int):
        """Positions first..end-1 scored from a fresh state over tokens[begin:end]: their logprobs, the argmax
        (id, logprob) at each, and the argmax after tokens[end - 1]."""
        state = self.model.new_state()
        logits = self.model.prefill(torch.tensor(tokens[begin:end]), state)  # [end - begin, V]
        wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
        logp = torch.log_softmax(logits.to(wide), dim=-1)  # [end - begin, V]
        best_lp, best = logp.max(dim=-1)  # first maximum: ties to the lowest id
        rows = range(first - 1 - begin, end - 1 - begin)  # row r predicts position begin + r + 1
        chosen = [float(logp[r, tokens[begin + r + 1]]) for r in rows]
        argmax = [(int(best[r]), float(best_lp[r])) for r in rows]
        return chosen, argmax, (int(best[-1]), float(best_lp[-1]))
