"""Driving a speculative Program in tests, for the reference and the fast Program alike: the prompts both test
suites serve, a sequence started by hand, decode rounds until a block of some length, a row's rounds with an abort and a
cut, a recorder of the drafts,
and the checks that read the same for every backend (greedy output unchanged, rows of one round accepting
different lengths, a sampled prefix hit equal to the cold run)."""

from __future__ import annotations

from typing import Any, Callable

from ninfer.contracts import BatchKind, ResourceChoice, RowDecision, TransitionKind
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import assert_drained, in_turns, serve
from ninfer.testing.sessions import token_request
from ninfer.testing.speculation import CyclingWidths


def spec_prompts(prompt_of: Callable[..., tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Four prompts of awkward lengths (one longer than a page)."""
    return [prompt_of(n, seed=70 + n) for n in (5, 11, 19, 70)]


def start_decoding(program, prompt, max_new: int = 24, chunk: int = 64, **choice):
    """Materialize `prompt` (`choice`: more ResourceChoice fields, its sampling and seed), prefill it in chunks of
    `chunk` and commit its first token; returns the handle."""
    txn = program.start(program.plan(ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt,
                                                    max_new_tokens=max_new, **choice)))
    h = program.advance(txn).handle
    while (batch := program.prefill(h, chunk)) is None:  # a chunk short of the prompt's end samples nothing
        pass
    program.commit(batch.take(), [RowDecision(1, False)])
    return h


def decode_until_drafted(program, h, need: int):
    """Commit decode rounds until one row carries at least `need` tokens; return that batch, uncommitted."""
    for _ in range(20):
        batch = program.decode([h])
        if batch.rows[0].produced >= need:
            return batch
        program.commit(batch.take(), [RowDecision(batch.rows[0].produced, False)])
    raise AssertionError("no block of the wanted length")


def mixed_rounds(program, h, check: Callable[[], None], rounds: int = 8) -> None:
    """Decode rounds of one row: round 3 aborted, the last cut after one token (the Engine's terminal rule), the
    others committed as produced; `check()` and the invariants after each."""
    for i in range(rounds):
        batch = program.decode([h])
        if i == 3:
            program.abort_pending(batch.take())
        elif i == rounds - 1:
            program.commit(batch.take(), [RowDecision(1, True)])
        else:
            program.commit(batch.take(), [RowDecision(batch.rows[0].produced, False)])
        check()
        program.check_invariants()


def record_drafts(program) -> list[tuple[int, ...]]:
    """Wrap the program's drafter: the returned list fills with every row's drafts, in call order."""
    seen, draft = [], program.executor.draft

    def record(seqs, ctxs, ks):
        out = draft(seqs, ctxs, ks)
        seen.extend(d for d, _ in out)
        return out
    program.executor.draft = record
    return seen


def drafts_on_device(program) -> None:
    """Wrap the fast program's drafter (a ForcedDrafts, say) so that its host drafts reach the core as a
    `DraftBlock` on the program's device, as the MTP head's and the DFlash drafter's do (the round then reads them
    only on the device: the fed blocks, the grammar fill in stream order, acceptance)."""
    from ninfer.fast.sampling.draft_block import DraftBlock

    ex, draft = program.executor, program.executor.draft

    def on_device(seqs, ctxs, ks):
        return DraftBlock.from_host(draft(seqs, ctxs, ks), [c.params.is_greedy for c in ctxs], ex.spec.k,
                                    program.limits.vocab_size, ex.device)
    ex.draft = on_device


def record_blocks(program) -> list[tuple[tuple[int, ...], list]]:
    """Like `record_drafts`, with each row's q (one [V] tensor per draft, None for a greedy row) beside its drafts."""
    seen, draft = [], program.executor.draft

    def record(seqs, ctxs, ks):
        out = draft(seqs, ctxs, ks)
        seen.extend((tuple(d), [None if q is None else q.detach().to("cpu", copy=True) for q in qs]) for d, qs in out)
        return out
    program.executor.draft = record
    return seen


def assert_resumed_drafts_equal(hit: list, cold: list, q_tol: float | None) -> None:
    """The drafts of a request that ran alone last on the hit Program (the tail of `hit`, from `record_blocks`)
    equal its cold run's, and with `q_tol` each q within that absolute difference: a backend state off at the
    checkpoint can leave the drafts, and so the sampled tokens, equal while q moves (zeroed MTP keys after an
    image: q moved 5e-4 on the reference Program, against 1e-9 between a correct hit and the cold run)."""
    tail = hit[-len(cold):] if cold else []
    assert cold and [d for d, _ in tail] == [d for d, _ in cold], ([d for d, _ in hit], [d for d, _ in cold])
    if q_tol is not None:
        worst = max((float((a - b).abs().max()) for (_, qa), (_, qb) in zip(tail, cold) for a, b in zip(qa, qb)
                     if a is not None), default=None)
        assert worst is not None and worst <= q_tol, f"q differs by {worst} from the cold run's (tolerance {q_tol})"


def assert_greedy_unchanged(make: Callable[..., Any], prompt_of, k: int, forced: bool) -> None:
    """`make(k, forced=...)` drafting k tokens serves greedy requests exactly as `make(0)` (no backend) does; with
    ForcedDrafts, blocks accepting none, all and at least two drafts all occurred."""
    prompts = spec_prompts(prompt_of)
    plain = serve(make(0), [token_request(p, 12) for p in prompts], max_concurrency=2, prefill_chunk=9)
    program = make(k, forced=forced)
    spec = serve(program, [token_request(p, 12) for p in prompts], max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    if forced:
        lengths = program.executor.draft.forced
        assert any(n == 0 for n, _ in lengths) and any(n == m for n, m in lengths), lengths
        assert any(n >= 2 for n, _ in lengths)
        assert any(r.usage.completion_tokens > 1 for r in spec)
    assert_drained(program)


def assert_every_width_keeps_greedy(make: Callable[..., Any], prompt_of, k: int, forced: bool
                                    ) -> tuple[Any, list[int]]:
    """`make(k, forced=..., adaptive=True)` with rounds of every width in turn (`CyclingWidths`: the plain step,
    each narrower block, the full one) serves greedy requests exactly as `make(0)` does; returns the Program and
    the length of the longest block of each of its verify passes where it has a verifier (else [])."""
    prompts = spec_prompts(prompt_of)
    plain = serve(make(0), [token_request(p, 14) for p in prompts], max_concurrency=2, prefill_chunk=9)
    program = make(k, forced=forced, adaptive=True)
    program.draft_policy = policy = CyclingWidths(k)
    verifier, longest = getattr(program.executor, "verifier", None), []
    if verifier is not None:
        run = verifier.run
        verifier.run = lambda *a, **kw: longest.append(max(a[4])) or run(*a, **kw)
    spec = serve(program, [token_request(p, 14) for p in prompts], max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert set(policy.widths) == set(range(1, k + 2)), policy.widths
    assert_drained(program)
    return program, longest


def assert_draft_vocab_bounds(make: Callable[..., Any], prompt_of, k: int, size: int) -> None:
    """`make(k, draft_vocab=size)` draws every draft below `size` (where `make(k)` drafts past it) and serves greedy
    requests exactly as `make(0)` does."""
    prompts = spec_prompts(prompt_of)
    plain = serve(make(0), [token_request(p, 14) for p in prompts], max_concurrency=2, prefill_chunk=9)
    runs = []
    for vocab in (None, size):
        program = make(k, draft_vocab=vocab)
        drafts = record_drafts(program)
        out = serve(program, [token_request(p, 14) for p in prompts], max_concurrency=2, prefill_chunk=9)
        assert [r.token_ids for r in out] == [r.token_ids for r in plain]
        runs.append([t for d in drafts for t in d])
    whole, bounded = runs
    assert len(bounded) > 20 and max(bounded) < size, bounded
    assert max(whole) >= size  # the bound is what kept them there
    assert_drained(program)


def assert_rows_accept_different_lengths(program, prompt_of, k: int) -> None:
    """Two rows decoding together under forced acceptance: some round commits blocks of different lengths."""
    hs = [start_decoding(program, prompt_of(n, seed=90 + n)) for n in (6, 13)]
    seen = set()
    for _ in range(6):
        batch = program.decode(hs)
        assert batch.kind is BatchKind.DECODE and all(r.drafted <= k for r in batch.rows)
        seen.add(tuple(r.produced for r in batch.rows))
        program.commit(batch.take(), [RowDecision(r.produced, False) for r in batch.rows])
        program.check_invariants()
    assert any(a != b for a, b in seen)


def assert_sampled_hit_equals_cold(make: Callable[[], Any], prompt_of, base_len: int, reused: int,
                                   q_tol: float | None = None) -> None:
    """The drafts depend on the backend's state: a request resumed from a checkpoint (`reused` prompt tokens hit)
    drafts, and so samples, what its cold run on a fresh `make()` does only when the checkpoint carried the
    backend state of its frontier. The drafts are compared, not only the tokens: a rejected draft's residual draw
    often lands on the token the right draft would have given (a zeroed MTP hidden or MTP keys at the checkpoint
    left every sampled token equal); with `q_tol` their q too (`assert_resumed_drafts_equal`)."""
    base = prompt_of(base_len, seed=11)
    second = base[:min(base_len, 80)] + prompt_of(9, seed=12)
    sampled = dict(sampling=SamplingParams(temperature=0.9), seed=5)
    program = make()
    blocks = record_blocks(program)
    _, hit = in_turns(program, [[token_request(base, 4, **sampled)], [token_request(second, 10, **sampled)]],
                      max_concurrency=2, prefill_chunk=48)
    assert hit[0].usage.cached_prompt_tokens == reused
    cold_program = make()
    cold_blocks = record_blocks(cold_program)
    (cold,) = serve(cold_program, [token_request(second, 10, **sampled)], max_concurrency=1, prefix_caching=False)
    assert hit[0].token_ids == cold.token_ids
    # the second request runs alone after the first: its drafts are the last ones the hit Program made
    assert_resumed_drafts_equal(blocks, cold_blocks, q_tol)
    assert_drained(program, published=True)
