"""The reference Program with the MTP backend: start-up errors, greedy equal to the autoregressive run (real MTP
drafts and forced random acceptance lengths), partial acceptance and its rollback, abort, prefix hits equal to the
cold run with the backend (sampled, so a wrong MTP state at the checkpoint would show), and drained pools."""

from __future__ import annotations

import pytest
import torch

from ninfer.contracts import BatchKind, RowDecision
from ninfer.program_core.speculative import MissingBackendWeights, SpeculativeConfig, SpeculativeConfigError
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import assert_drained, in_turns, serve
from ninfer.testing.sessions import token_request


@pytest.mark.parametrize("raw, field", [({"method": "eagle", "num_speculative_tokens": 2}, "method"),
                                        ({"method": "mtp", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                                        ({"method": "mtp", "num_speculative_tokens": 8}, "num_speculative_tokens"),
                                        ({"method": "mtp", "num_speculative_tokens": True}, "num_speculative_tokens"),
                                        ({"method": "mtp"}, "num_speculative_tokens"),
                                        ({"method": "mtp", "num_speculative_tokens": 2, "model": "x"}, "model")])
def test_bad_speculative_config_names_the_field(raw, field):
    with pytest.raises(SpeculativeConfigError) as e:
        SpeculativeConfig.parse(raw)
    assert e.value.field == field and field in str(e.value)


def test_speculative_config_parses_vllm_shape():
    assert SpeculativeConfig.parse(None) is None
    spec = SpeculativeConfig.parse({"method": "mtp", "num_speculative_tokens": 3})
    assert spec == SpeculativeConfig("mtp", 3) and spec.name == "mtp (k=3)"


def test_mtp_without_mtp_weights_is_a_start_error(model32):
    with pytest.raises(MissingBackendWeights, match="mtp"):
        ReferenceProgram(model32, ReferenceProgramConfig(speculative=SpeculativeConfig("mtp", 2)))


def test_limits_name_the_backend(make_spec):
    limits = make_spec(3).limits
    assert (limits.speculative, limits.draft_tokens) == ("mtp (k=3)", 3)
    assert make_spec(0).limits.speculative is None


def _prompts(prompt_of):
    return [prompt_of(n, seed=70 + n) for n in (5, 11, 19, 70)]


@pytest.mark.parametrize("k, forced", [(1, False), (3, False), (3, True), (7, True)])
def test_greedy_with_mtp_equals_greedy_without(make_spec, prompt_of, k, forced):
    prompts = _prompts(prompt_of)
    plain = serve(make_spec(0), [token_request(p, 12) for p in prompts], max_concurrency=2, prefill_chunk=9)
    program = make_spec(k, forced=forced)
    spec = serve(program, [token_request(p, 12) for p in prompts], max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    if forced:
        forced = program.executor.draft.forced
        assert any(n == 0 for n, _ in forced) and any(n == m for n, m in forced), forced  # none and all accepted
        assert any(n >= 2 for n, _ in forced)
        assert any(r.usage.completion_tokens > 1 for r in spec)
    assert_drained(program)


def _decode_until_drafted(program, h, need):
    """Commit decode rounds until one row carries at least `need` tokens; return that batch, uncommitted."""
    for _ in range(20):
        batch = program.decode([h])
        if batch.rows[0].produced >= need:
            return batch
        program.commit(batch.take(), [RowDecision(batch.rows[0].produced, False)])
    raise AssertionError("no block of the wanted length")


def _start(program, prompt, max_new=24):
    from ninfer.contracts import ResourceChoice, TransitionKind
    txn = program.start(program.plan(ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt, max_new_tokens=max_new)))
    h = program.advance(txn).handle
    batch = program.prefill(h, 64)
    program.commit(batch.take(), [RowDecision(1, False)])
    return h


def test_abort_and_cancel_restore_the_whole_state(make_spec, prompt_of):
    program = make_spec(3, forced=True)
    h = _start(program, prompt_of(9, seed=3))
    batch = _decode_until_drafted(program, h, 2)
    program.abort_pending(batch.take())
    seq = program.sequence(h)
    before = (seq.frontier, list(seq.table), seq.reserve_left, program.states.recurrent[h.slot].clone(),
              program.states.load_backend(h.slot))
    again = program.decode([h])
    assert again.rows == batch.rows  # the same drafts, verified the same way: nothing leaked
    program.commit(again.take(), [RowDecision(0, True, cancelled=True)])
    mtp = program.states.load_backend(h.slot)
    assert (seq.frontier, seq.table, seq.reserve_left) == before[:3]
    assert torch.equal(program.states.recurrent[h.slot], before[3])
    assert torch.equal(mtp.hidden, before[4].hidden) and torch.equal(mtp.kv[0].k, before[4].kv[0].k)
    program.check_invariants()


def test_a_cut_block_replays_only_the_kept_tokens(make_spec, make_program, mtp_model, prompt_of):
    """The Engine's terminal rule keeps 1 of a longer block: the state equals a plain run that consumed the same
    tokens (GDN, KV and MTP state), and the block table covers exactly the new frontier."""
    prompt = prompt_of(9, seed=4)
    program = make_spec(3, forced=True)
    h = _start(program, prompt)
    batch = _decode_until_drafted(program, h, 3)
    seq = program.sequence(h)
    pending, first = seq.pending, batch.rows[0].tokens[0]
    program.commit(batch.take(), [RowDecision(1, True)])
    assert seq.frontier == len(prompt) + len(seq.outputs) - 1 and seq.pending == first
    assert len(seq.table) == program.config.pages_for(seq.frontier)
    program.check_invariants()
    # the reference: a fresh plain-decoding Program over the same tokens, then one consumed step
    ref = make_spec(1)
    r = _start(ref, tuple(seq.tokens[:-1]) if seq.tokens[-1] == pending else prompt, max_new=24)
    rs = ref.sequence(r)
    while rs.frontier < seq.frontier:
        nxt = ref.control(r, (seq.tokens[rs.frontier + 1] if rs.frontier + 1 < seq.frontier else first,))
        ref.commit(nxt.take(), [RowDecision(1, False)])
    assert rs.tokens == seq.tokens and rs.pending == seq.pending
    assert torch.allclose(ref.states.recurrent[r.slot], program.states.recurrent[h.slot], atol=1e-5)
    a, b = ref.states.load_backend(r.slot), program.states.load_backend(h.slot)
    assert a.kv[0].length == b.kv[0].length == seq.frontier - 1
    assert torch.allclose(a.hidden, b.hidden, atol=1e-5) and torch.allclose(a.kv[0].k, b.kv[0].k, atol=1e-5)


@pytest.mark.parametrize("base_len, reused", [(12, 12), (100, 64)])
def test_sampled_prefix_hit_with_mtp_equals_the_cold_run(make_spec, prompt_of, base_len, reused):
    """Sampled tokens depend on the drafts, and the drafts on the MTP state: a resumed request equals the cold run
    only when the checkpoint carried the MTP state of its frontier."""
    base = prompt_of(base_len, seed=11)
    second = base[:min(base_len, 80)] + prompt_of(9, seed=12)
    sampled = dict(sampling=SamplingParams(temperature=0.9), seed=5)
    program = make_spec(3)
    _, hit = in_turns(program, [[token_request(base, 4, **sampled)], [token_request(second, 10, **sampled)]],
                      max_concurrency=2, prefill_chunk=48)
    assert hit[0].usage.cached_prompt_tokens == reused
    (cold,) = serve(make_spec(3), [token_request(second, 10, **sampled)], max_concurrency=1, prefix_caching=False)
    assert hit[0].token_ids == cold.token_ids
    assert_drained(program, published=True)


def test_rows_of_one_round_accept_different_lengths(make_spec, prompt_of):
    program = make_spec(4, forced=True)
    hs = [_start(program, prompt_of(n, seed=90 + n)) for n in (6, 13)]
    seen = set()
    for _ in range(6):
        batch = program.decode(hs)
        assert batch.kind is BatchKind.DECODE and all(r.drafted <= 4 for r in batch.rows)
        seen.add(tuple(r.produced for r in batch.rows))
        program.commit(batch.take(), [RowDecision(r.produced, False) for r in batch.rows])
        program.check_invariants()
    assert any(a != b for a, b in seen)
