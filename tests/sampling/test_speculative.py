"""Speculative acceptance (ninfer.sampling.speculative): greedy is the autoregressive argmax chain; sampled
acceptance reproduces the target distribution (a chi-square test over a fixed seed set on a tiny Markov chain)."""

from __future__ import annotations

import pytest
import torch

from ninfer.sampling import RowContext, SamplingParams, accept, draw_draft, processed_logits

V = 3
START = 0


def _tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft next-token logits per previous token [V, V]; the draft is deliberately far from the target,
    so rejections and residual draws are frequent."""
    g = torch.Generator().manual_seed(7)
    return torch.randn(V, V, generator=g) * 1.5, torch.randn(V, V, generator=g) * 3.0


def _ctx(params: SamplingParams, seed: int, outputs: list[int]) -> RowContext:
    return RowContext(params, seed, prompt=(START,), outputs=tuple(outputs), eos_token_ids=())


def _speculate(target, draft, params, seed, k, n) -> list[int]:
    """Generate n tokens after START by rounds of k drafts, as a Program does (positions 1, 2, ...)."""
    out: list[int] = []
    while len(out) < n:
        last, pos = (out[-1] if out else START), 1 + len(out)
        ctx = _ctx(params, seed, out)
        drafts, q = [], []
        for i in range(k):
            d, qi = draw_draft(draft[drafts[-1] if drafts else last], ctx, pos + i, drafts)
            drafts.append(d)
            q.append(qi)
        rows = torch.stack([target[t] for t in [last] + drafts])  # [k + 1, V]: p at pos.. given the drafts
        out.extend(accept(rows, drafts, q, ctx, pos, [None] * (k + 1)).tokens)
    return out[:n]


def test_greedy_is_the_argmax_chain():
    target, draft = _tables()
    greedy = SamplingParams(temperature=0.0)
    chain, last = [], START
    for _ in range(6):
        last = int(torch.argmax(target[last]))
        chain.append(last)
    for k in (1, 3, 5):
        assert _speculate(target, draft, greedy, 0, k, 6) == chain
        assert _speculate(target, target, greedy, 0, k, 6) == chain  # the draft is the target: all accepted


def test_full_acceptance_emits_the_bonus():
    target, _ = _tables()
    greedy = SamplingParams(temperature=0.0)
    chain = [int(torch.argmax(target[START]))]
    chain.append(int(torch.argmax(target[chain[0]])))
    rows = torch.stack([target[START], target[chain[0]]])
    got = accept(rows, chain[:1], [None], _ctx(greedy, 0, []), 1, [None, None])
    assert got.tokens == tuple(chain)


def test_grammar_mask_of_a_draft_prefix_rejects_the_draft():
    target, _ = _tables()
    greedy = SamplingParams(temperature=0.0)
    top = int(torch.argmax(target[START]))
    mask = torch.ones(V, dtype=torch.bool)
    mask[top] = False  # the grammar forbids the target's argmax at the first position
    got = accept(torch.stack([target[START], target[top]]), [top], [None], _ctx(greedy, 0, []), 1, [mask, None])
    assert len(got.tokens) == 1 and got.tokens[0] != top


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0  # cells truncation removes: never drawn (asserted), no degree of freedom
    assert not counts[~keep].any(), "a token outside the truncated target distribution was emitted"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum())


def _joint_statistic(params: SamplingParams, seeds: int, k: int) -> float:
    """Two tokens by rounds of k drafts from a different draft model, against the exact Markov joint
    p(a | START) p(b | a): the chi-square statistic over V * V cells."""
    target, draft = _tables()
    ctx = _ctx(params, 0, [])
    p = torch.stack([torch.softmax(processed_logits(target[t], ctx.at(1, (), None)).double(), -1)
                     for t in range(V)])  # [V, V]: no penalties, so p(. | t) is the same at every position
    joint = p[START][:, None] * p  # [V, V]: joint[a, b]
    counts = torch.zeros(V, V, dtype=torch.float64)
    for seed in range(seeds):
        a, b = _speculate(target, draft, params, seed, k, 2)
        counts[a, b] += 1
    return _chi_square(counts.flatten(), joint.flatten())


def test_sampled_acceptance_is_lossless():
    """300 fixed seeds, k = 2: chi-square with V * V - 1 = 8 degrees of freedom below its 0.1% critical value
    26.12 (this seed set gives 7.3). Accepting every draft gives 14037, drawing a rejection from p instead of
    the residual (p - q)+ gives 59, accepting with probability p(d) instead of p(d) / q(d) 128."""
    assert _joint_statistic(SamplingParams(temperature=1.0), 300, 2) < 26.12


@pytest.mark.slow
def test_sampled_acceptance_is_lossless_with_truncation_many_seeds():
    """3000 seeds, k = 3, temperature and top_k 2 (3 cells of 9 truncated away: 5 degrees of freedom, 0.1%
    critical value 20.52)."""
    assert _joint_statistic(SamplingParams(temperature=0.7, top_k=2), 3000, 3) < 20.52
