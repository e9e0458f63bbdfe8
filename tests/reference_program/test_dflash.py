"""The reference Program with the DFlash / DFlash2 backends: start-up errors name the field, greedy equals the
autoregressive run (real drafts and forced acceptance lengths, with and without a draft window), the drafter's
context after prefill chunks, verified blocks, rollbacks and aborts equals the context built from scratch over the
committed tokens, and a sampled prefix hit equals the cold run (the checkpoint carries the drafter context)."""

from __future__ import annotations

import functools

import pytest
import torch

from ninfer.program_core.speculative import (MissingBackendWeights, SpeculativeConfig, SpeculativeConfigError,
                                             SpeculativeMethod)
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.program_core.speculation import row_context
from ninfer.testing.drafters import reference_drafter
from ninfer.testing.serving import assert_drained, serve
from ninfer.testing.sessions import token_request
from ninfer.testing.spec_driving import (assert_draft_vocab_bounds, assert_every_width_keeps_greedy,
                                         assert_sampled_hit_equals_cold, mixed_rounds, spec_prompts, start_decoding)


def _spec(method: str, k: int) -> SpeculativeConfig:
    return SpeculativeConfig(SpeculativeMethod(method), k)


@pytest.mark.parametrize("raw, field", [({"method": "dflash", "num_speculative_tokens": 16}, "num_speculative_tokens"),
                                        ({"method": "dflash2", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                                        ({"method": "mtp", "num_speculative_tokens": 3, "draft_window_size": 8},
                                         "draft_window_size"),
                                        ({"method": "dflash", "num_speculative_tokens": 7, "draft_window_size": 0},
                                         "draft_window_size"),
                                        ({"method": "dflash", "num_speculative_tokens": 7, "window": 8}, "window")])
def test_bad_dflash_config_names_the_field(raw, field):
    with pytest.raises(SpeculativeConfigError) as e:
        SpeculativeConfig.parse(raw)
    assert e.value.field == field and field in str(e.value)


def test_dflash_config_parses():
    spec = SpeculativeConfig.parse({"method": "dflash2", "num_speculative_tokens": 15, "draft_window_size": 64})
    assert spec == SpeculativeConfig(SpeculativeMethod.DFLASH2, 15, 64) and spec.name == "dflash2 (k=15, window 64)"


def test_a_missing_or_unfit_drafter_is_a_start_error(model32, make_dflash):
    with pytest.raises(MissingBackendWeights, match="'dflash' needs a dflash drafter") as e:
        ReferenceProgram(model32, ReferenceProgramConfig(speculative=_spec("dflash", 7)))
    assert e.value.field == "method"
    plain = make_dflash("dflash", 0).drafter
    with pytest.raises(MissingBackendWeights, match="carries a dflash drafter"):
        ReferenceProgram(model32, ReferenceProgramConfig(speculative=_spec("dflash2", 7)), plain)
    block8 = reference_drafter(model32, "dflash", block_size=8)
    with pytest.raises(SpeculativeConfigError, match="trained for blocks of 8") as e:
        ReferenceProgram(model32, ReferenceProgramConfig(speculative=_spec("dflash", 15)), block8)
    assert e.value.field == "num_speculative_tokens"
    assert ReferenceProgram(model32, ReferenceProgramConfig(speculative=_spec("dflash", 7)),
                            block8).limits.draft_tokens == 7


@pytest.fixture(scope="module")
def plain_greedy(make_dflash, prompt_of):
    requests = [token_request(p, 12) for p in spec_prompts(prompt_of)]
    return [r.token_ids for r in serve(make_dflash("dflash", 0), requests, max_concurrency=2, prefill_chunk=9)]


@pytest.mark.parametrize("kind, k, forced, window", [("dflash", 15, False, None), ("dflash2", 15, False, None),
                                                     ("dflash", 7, True, None), ("dflash2", 7, True, 6),
                                                     ("dflash2", 3, True, None)])
def test_greedy_with_dflash_equals_greedy_without(make_dflash, prompt_of, plain_greedy, kind, k, forced, window):
    program = make_dflash(kind, k, forced=forced, window=window)
    spec = serve(program, [token_request(p, 12) for p in spec_prompts(prompt_of)], max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == plain_greedy
    assert program.limits.speculative == SpeculativeConfig(SpeculativeMethod(kind), k, window).name
    if forced:
        assert any(r.usage.accepted_draft_tokens > 1 for r in spec)
    assert_drained(program)


@pytest.mark.parametrize("kind, forced", [("dflash", True), ("dflash2", False)])
def test_rounds_of_every_width_keep_greedy(make_dflash, prompt_of, kind, forced):
    """The draft policy's narrower rounds (1..8 in turn at block 8, the plain step among them; the drafter context
    extended by each): greedy as without a backend."""
    program, longest = assert_every_width_keeps_greedy(functools.partial(make_dflash, kind), prompt_of, 7, forced)
    assert not longest  # the reference Program has no verify buffers


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_draft_vocabulary_bounds_every_draft_and_keeps_greedy(make_dflash, prompt_of, kind):
    assert_draft_vocab_bounds(functools.partial(make_dflash, kind), prompt_of, 7, 48)  # of the model's 97 ids


# chunks of 7: the drafter context is built in pieces
_start = functools.partial(start_decoding, max_new=40, chunk=7)


def _scratch(program, seq, window):
    """The drafter context of the consumed tokens, from one fresh target pass and one extension."""
    model, drafter = program.model, program.drafter
    taps: dict = {}
    model.prefill(torch.tensor(list(seq.tokens[:seq.frontier])), model.new_state(), chunked=False, taps=taps)
    ctx = drafter.empty_context()
    drafter.extend(ctx, torch.cat([taps[i] for i in drafter.cfg.target_layer_ids], dim=-1), 0, window)
    return ctx


def _assert_same(a, b):
    assert (a.start, a.end) == (b.start, b.end)
    for x, y in zip(a.kv, b.kv):
        torch.testing.assert_close(x.k, y.k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.v, y.v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind, window", [("dflash", None), ("dflash2", 9)])
def test_drafter_context_follows_the_committed_tokens(make_dflash, prompt_of, kind, window):
    """Rounds that accept all, some (a rollback replays the kept tokens) or none of their drafts, a cut block and
    an aborted round: after each commit the context is exactly the one built from scratch."""
    program = make_dflash(kind, 5, forced=True, window=window)
    h = _start(program, prompt_of(17, seed=3))
    seq = program.sequence(h)
    _assert_same(program.states.load_backend(h.slot), _scratch(program, seq, window))
    mixed_rounds(program, h, lambda: _assert_same(program.states.load_backend(h.slot), _scratch(program, seq, window)))
    assert any(n not in (0, m) for n, m in program.executor.draft.forced)  # a partial acceptance was replayed


def test_drafting_leaves_the_context_alone(make_dflash, prompt_of):
    program = make_dflash("dflash2", 15)
    h = _start(program, prompt_of(9, seed=8))
    seq = program.sequence(h)
    before = program.states.load_backend(h.slot)
    one = program.executor.draft([seq], [row_context(program, seq)], [15])
    two = program.executor.draft([seq], [row_context(program, seq)], [15])
    assert one[0][0] == two[0][0] and len(one[0][0]) == 15
    _assert_same(program.states.load_backend(h.slot), before)


@pytest.mark.parametrize("kind, window, base_len, reused", [("dflash", None, 12, 12), ("dflash2", None, 100, 64),
                                                            ("dflash2", 10, 100, 64)])
def test_sampled_prefix_hit_with_dflash_equals_the_cold_run(make_dflash, prompt_of, kind, window, base_len, reused):
    """A checkpoint without the drafter context of its frontier would change the drafts and with them the sampled
    tokens."""
    assert_sampled_hit_equals_cold(lambda: make_dflash(kind, 7, window=window), prompt_of, base_len, reused)
