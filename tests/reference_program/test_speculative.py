"""The reference Program with the MTP backend: start-up errors, greedy equal to the autoregressive run (real MTP
drafts and forced random acceptance lengths), partial acceptance and its rollback, abort, prefix hits equal to the
cold run with the backend (sampled, so a wrong MTP state at the checkpoint would show), and drained pools."""

from __future__ import annotations

import pytest
import torch

from ninfer.contracts import RowDecision
from ninfer.program_core.speculative import (MissingBackendWeights, SpeculativeConfig, SpeculativeConfigError,
                                             SpeculativeMethod)
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.testing.spec_driving import (assert_draft_vocab_bounds, assert_every_width_keeps_greedy,
                                         assert_greedy_unchanged,
                                         assert_rows_accept_different_lengths, assert_sampled_hit_equals_cold,
                                         decode_until_drafted, start_decoding)


@pytest.mark.parametrize("raw, field", [({"method": "eagle", "num_speculative_tokens": 2}, "method"),
                                        ({"method": "mtp", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                                        ({"method": "mtp", "num_speculative_tokens": 8}, "num_speculative_tokens"),
                                        ({"method": "mtp", "num_speculative_tokens": True}, "num_speculative_tokens"),
                                        ({"method": "mtp"}, "num_speculative_tokens"),
                                        ({"method": "mtp", "num_speculative_tokens": 2, "model": "x"}, "model"),
                                        ({"method": "mtp", "num_speculative_tokens": 2, "adaptive": 1}, "adaptive"),
                                        ({"method": "mtp", "num_speculative_tokens": 2, "draft_vocab_size": 0},
                                         "draft_vocab_size"),
                                        ({"method": "mtp", "num_speculative_tokens": 2, "draft_vocab_size": "8k"},
                                         "draft_vocab_size"),
                                        ({"method": "mtp", "num_speculative_tokens": 2, "quantization": "int4"},
                                         "quantization"),
                                        ({"method": "dflash", "num_speculative_tokens": 7, "quantization": "fp8"},
                                         "quantization")])
def test_bad_speculative_config_names_the_field(raw, field):
    with pytest.raises(SpeculativeConfigError) as e:
        SpeculativeConfig.parse(raw)
    assert e.value.field == field and field in str(e.value)


def test_speculative_config_parses_vllm_shape():
    assert SpeculativeConfig.parse(None) is None
    spec = SpeculativeConfig.parse({"method": "mtp", "num_speculative_tokens": 3})
    assert spec == SpeculativeConfig(SpeculativeMethod.MTP, 3) and spec.name == "mtp (k=3)"
    assert spec.method is SpeculativeMethod.MTP and spec.adaptive  # parsed once into the enum; adaptive by default
    fixed = SpeculativeConfig.parse({"method": "mtp", "num_speculative_tokens": 3, "adaptive": False})
    assert not fixed.adaptive and fixed.name == "mtp (k=3, fixed width)"
    hot = SpeculativeConfig.parse({"method": "mtp", "num_speculative_tokens": 3, "draft_vocab_size": 32768})
    assert hot.draft_vocab_size == 32768 and hot.name == "mtp (k=3, draft vocab 32768)"
    assert hot.for_vocab(248320) is hot and hot.for_vocab(32768).draft_vocab_size is None  # the whole one: no bound
    fp8 = SpeculativeConfig.parse({"method": "mtp", "num_speculative_tokens": 3, "quantization": "fp8"})
    assert fp8.quantization == "fp8" and fp8.name == "mtp (k=3, fp8 draft weights)"
    with pytest.raises(SpeculativeConfigError, match="must be a SpeculativeMethod") as e:
        SpeculativeConfig("mtp", 3)
    assert e.value.field == "method"


def test_mtp_without_mtp_weights_is_a_start_error(model32):
    with pytest.raises(MissingBackendWeights, match="mtp"):
        ReferenceProgram(model32, ReferenceProgramConfig(speculative=SpeculativeConfig(SpeculativeMethod.MTP, 2)))


def test_limits_name_the_backend(make_spec):
    limits = make_spec(3).limits
    assert (limits.speculative, limits.draft_tokens) == ("mtp (k=3)", 3)
    assert make_spec(0).limits.speculative is None


@pytest.mark.parametrize("k, forced", [(1, False), (3, False), (3, True), (7, True)])
def test_greedy_with_mtp_equals_greedy_without(make_spec, prompt_of, k, forced):
    assert_greedy_unchanged(make_spec, prompt_of, k, forced)


def test_a_draft_vocabulary_bounds_every_draft_and_keeps_greedy(make_spec, prompt_of):
    assert_draft_vocab_bounds(make_spec, prompt_of, 3, 48)  # of the model's 97 ids


def test_a_draft_vocabulary_past_the_models_is_a_start_error(make_spec):
    with pytest.raises(SpeculativeConfigError, match="draft_vocab_size: 98 is past the model's 97") as e:
        make_spec(3, draft_vocab=98)
    assert e.value.field == "draft_vocab_size"


@pytest.mark.parametrize("forced", [False, True], ids=["mtp-drafts", "forced-drafts"])
def test_rounds_of_every_width_keep_greedy(make_spec, prompt_of, forced):
    """The draft policy's narrower rounds, the plain step among them (1..k + 1 in turn): greedy as without."""
    assert_every_width_keeps_greedy(make_spec, prompt_of, 3, forced)


def test_abort_and_cancel_restore_the_whole_state(make_spec, prompt_of):
    program = make_spec(3, forced=True)
    h = start_decoding(program, prompt_of(9, seed=3))
    batch = decode_until_drafted(program, h, 2)
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


def test_a_cut_block_replays_only_the_kept_tokens(make_spec, prompt_of):
    """The Engine's terminal rule keeps 1 of a longer block: the state equals a plain run that consumed the same
    tokens (GDN, KV and MTP state), and the block table covers exactly the new frontier."""
    prompt = prompt_of(9, seed=4)
    program = make_spec(3, forced=True)
    h = start_decoding(program, prompt)
    batch = decode_until_drafted(program, h, 3)
    seq = program.sequence(h)
    pending, first = seq.pending, batch.rows[0].tokens[0]
    program.commit(batch.take(), [RowDecision(1, True)])
    assert seq.frontier == len(prompt) + len(seq.outputs) - 1 and seq.pending == first
    assert len(seq.table) == program.config.pages_for(seq.frontier)
    program.check_invariants()
    # the reference: a fresh plain-decoding Program over the same tokens, then one consumed step
    ref = make_spec(1)
    r = start_decoding(ref, tuple(seq.tokens[:-1]) if seq.tokens[-1] == pending else prompt, max_new=24)
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
    """A wrong MTP state at the checkpoint changes the resumed request's drafts or their q (compared with the cold
    run's), even where the sampled tokens come out the same."""
    assert_sampled_hit_equals_cold(lambda: make_spec(3), prompt_of, base_len, reused, q_tol=1e-4)


def test_rows_of_one_round_accept_different_lengths(make_spec, prompt_of):
    assert_rows_accept_different_lengths(make_spec(4, forced=True), prompt_of, 4)


def test_a_block_drafts_no_further_than_the_output_budget(make_spec, prompt_of):
    """k' = min(k, budget left - 1): the block's bonus token is the last output the budget allows, so no row
    produces past max_new_tokens (nothing drafted, verified and paged only for the Engine to cut it)."""
    program = make_spec(3)
    h = start_decoding(program, prompt_of(9, seed=6), max_new=7)
    seq = program.sequence(h)
    rounds = 0
    while (left := seq.max_new - seq.num_outputs) > 0:
        batch = program.decode([h])
        (row,) = batch.rows
        assert row.drafted == min(3, left - 1) and row.produced <= left, (left, row.drafted, row.produced)
        program.commit(batch.take(), [RowDecision(row.produced, row.produced == left)])
        program.check_invariants()
        rounds += 1
    assert seq.num_outputs == 7 and rounds >= 2


def test_a_plain_bitmask_row_takes_no_drafts(make_spec, prompt_of):
    """A session whose grammar comes as one plain bitmask (not `DraftMasks`) constrains only the next token: the
    round drafts nothing for that row, and its one token obeys the mask."""
    program = make_spec(3, forced=True)
    h = start_decoding(program, prompt_of(9, seed=7), max_new=12)
    ids = torch.arange(program.limits.vocab_size)
    allowed = (ids % 2 == 1)  # bool [V]: odd tokens only
    batch = program.decode([h], [allowed])
    (row,) = batch.rows
    assert row.drafted == 0 and row.produced == 1 and row.tokens[0] % 2 == 1, row
    program.commit(batch.take(), [RowDecision(1, False)])
    program.check_invariants()
