"""Drawing tokens: determinism, position-keyed replay, greedy, batch == per-row, statistics."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ninfer.sampling.sampler as sampler_module
from ninfer.sampling.params import SamplingParams, resolve_seed
from ninfer.sampling.processors import SamplingError
from ninfer.sampling.sampler import RowSampling, processed_logits, sample, sample_row

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
PROBS = (0.4, 0.3, 0.2, 0.1)
LOG_PROBS = torch.tensor([math.log(p) for p in PROBS])
# chi-square critical values at 0.999: goodness of fit with 3 degrees of freedom, independence
# of two 4-way variables (9 degrees of freedom)
CHI2_DF3 = 16.27
CHI2_DF9 = 27.88


def rows_at(params, seed, positions):
    return [RowSampling(params, seed=seed, position=p) for p in positions]


def draw_many(params, seed, positions, logits=LOG_PROBS):
    batch = logits.expand(len(positions), -1)
    return sample(batch, rows_at(params, seed, positions)).tolist()


def goodness_of_fit(tokens, probs):
    counts = [tokens.count(t) for t in range(len(probs))]
    n = len(tokens)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))


def independence(pairs, size=4):
    table = [[0] * size for _ in range(size)]
    for a, b in pairs:
        table[a][b] += 1
    n = len(pairs)
    rows = [sum(r) for r in table]
    cols = [sum(c) for c in zip(*table)]
    return sum((table[i][j] - rows[i] * cols[j] / n) ** 2 / (rows[i] * cols[j] / n)
               for i in range(size) for j in range(size))


def test_same_seed_and_position_give_the_same_token_anywhere():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    row = RowSampling(SamplingParams(temperature=1.3, top_p=0.95), seed=77, position=12)
    first = sample_row(logits, row)
    assert all(sample_row(logits, row) == first for _ in range(3))
    # the same draw inside a batch, at another row index, next to other requests
    others = [RowSampling(SamplingParams(), seed=s, position=3) for s in range(3)]
    batch = sample(logits.expand(4, -1), others[:2] + [row] + others[2:])
    assert int(batch[2]) == first


def generate(params, seed, logits_table, prompt, start, history):
    """Autoregressive toy loop: the logits of each step come from a fixed table by position."""
    output = list(history)
    for position in range(start, logits_table.shape[0]):
        row = RowSampling(params, seed=seed, position=position, prompt_token_ids=prompt,
                          output_token_ids=output)
        output.append(sample_row(logits_table[position], row))
    return output


def test_rollback_is_recomputation_from_the_position():
    table = torch.randn(24, 11, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.4)
    prompt = [1, 2, 3]
    full = generate(params, 5, table, prompt, len(prompt), [])
    cut = 9  # roll back to absolute position len(prompt) + cut and redraw the rest
    replay = generate(params, 5, table, prompt, len(prompt) + cut, full[:cut])
    assert replay == full
    assert generate(params, 6, table, prompt, len(prompt), []) != full


def test_greedy_equals_argmax_with_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, -1.0, 0.0]])
    rows = [RowSampling(SamplingParams(temperature=0.0), seed=s, position=0) for s in (1, 2)]
    assert sample(logits, rows).tolist() == [1, 0]
    assert [sample_row(logits[b], rows[b]) for b in range(2)] == [1, 0]


@SETTINGS
@given(st.lists(st.floats(-50, 50, width=32), min_size=1, max_size=40), st.integers(0, 2 ** 64 - 1))
def test_greedy_ignores_seed_and_noise(values, seed):
    logits = torch.tensor(values)
    row = RowSampling(SamplingParams(temperature=0.0, top_k=1, top_p=0.5), seed=seed, position=seed % 99)
    assert sample_row(logits, row) == int(torch.argmax(logits))


def test_all_greedy_batch_never_touches_the_rng(monkeypatch):
    def no_rng(*args, **kwargs):
        raise AssertionError("the RNG ran for an all-greedy batch")

    monkeypatch.setattr(sampler_module, "gumbel_noise", no_rng)
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(2))
    params = SamplingParams.create(temperature=0.0, logit_bias={4: 100.0})
    rows = [RowSampling(params, seed=0, position=p) for p in range(3)]
    assert sample(logits, rows).tolist() == [4, 4, 4]


row_params = st.builds(
    SamplingParams.create,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.sampled_from([-1, 0, 1, 3]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]),
    min_p=st.sampled_from([0.0, 0.1]),
    repetition_penalty=st.sampled_from([1.0, 1.4]),
    presence_penalty=st.sampled_from([0.0, 0.5]),
    frequency_penalty=st.sampled_from([0.0, -0.3]),
    logit_bias=st.dictionaries(st.integers(0, 5), st.floats(-5, 5), max_size=2),
    min_tokens=st.integers(0, 2),
    stop_token_ids=st.lists(st.integers(0, 5), max_size=2),
)


@st.composite
def batches(draw):
    vocab = draw(st.integers(6, 40))
    size = draw(st.integers(1, 5))
    logits = torch.tensor(draw(st.lists(st.floats(-10, 10, width=32), min_size=vocab * size,
                                        max_size=vocab * size))).reshape(size, vocab)
    rows = []
    for _ in range(size):
        allowed = torch.tensor(draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab)))
        allowed[vocab - 1] = True  # never stopped by min_tokens (stop/eos ids are < 6)
        rows.append(RowSampling(
            draw(row_params), seed=draw(st.integers(0, 2 ** 64 - 1)),
            position=draw(st.integers(0, 2 ** 40)),
            prompt_token_ids=draw(st.lists(st.integers(0, vocab - 1), max_size=6)),
            output_token_ids=draw(st.lists(st.integers(0, vocab - 1), max_size=3)),
            eos_token_ids=(0,), allowed=draw(st.sampled_from([None, allowed]))))
    return logits, rows


@SETTINGS
@given(batches())
def test_batch_equals_per_row(batch):
    logits, rows = batch
    expected = [sample_row(logits[b], row) for b, row in enumerate(rows)]
    assert sample(logits, rows).tolist() == expected
    for b, row in enumerate(rows):
        # the drawn token always survives every filter
        assert processed_logits(logits[b], row)[expected[b]] != -math.inf


def test_draws_fit_the_distribution():
    tokens = draw_many(SamplingParams(), seed=2024, positions=range(4000))
    assert goodness_of_fit(tokens, PROBS) < CHI2_DF3


def test_draws_across_seeds_fit_the_distribution():
    rows = [RowSampling(SamplingParams(), seed=seed, position=7) for seed in range(4000)]
    tokens = sample(LOG_PROBS.expand(len(rows), -1), rows).tolist()
    assert goodness_of_fit(tokens, PROBS) < CHI2_DF3


def test_temperature_flattens_the_distribution():
    tokens = draw_many(SamplingParams(temperature=2.0), seed=99, positions=range(4000))
    weights = [p ** 0.5 for p in PROBS]
    assert goodness_of_fit(tokens, [w / sum(weights) for w in weights]) < CHI2_DF3


def test_top_k_draws_fit_the_renormalised_survivors():
    tokens = draw_many(SamplingParams(top_k=2), seed=3, positions=range(3000))
    assert set(tokens) == {0, 1}
    assert goodness_of_fit(tokens, [4 / 7, 3 / 7]) < 10.83  # 1 degree of freedom


def test_consecutive_positions_are_independent():
    tokens = draw_many(SamplingParams(), seed=11, positions=range(6001))
    assert independence(list(zip(tokens[:-1], tokens[1:]))) < CHI2_DF9


def test_neighbouring_seeds_are_independent():
    # resolve_seed gives the n choices of one request seeds s, s + 1, ...
    positions = range(3000)
    first = draw_many(SamplingParams(), resolve_seed(500, 0), positions)
    second = draw_many(SamplingParams(), resolve_seed(500, 1), positions)
    assert independence(list(zip(first, second))) < CHI2_DF9


def test_min_tokens_blocks_eos_until_reached():
    logits = torch.tensor([0.0, 0.0, 20.0])  # EOS (2) all but certain when allowed
    params = SamplingParams(min_tokens=3, temperature=1.0)
    early = [sample_row(logits, RowSampling(params, seed=s, position=5, output_token_ids=[0, 1],
                                            eos_token_ids=(2,))) for s in range(50)]
    assert 2 not in early
    late = RowSampling(params, seed=0, position=6, output_token_ids=[0, 1, 1], eos_token_ids=(2,))
    assert sample_row(logits, late) == 2


def test_logit_bias_and_mask_steer_the_draw():
    logits = torch.zeros(6)
    biased = SamplingParams.create(logit_bias={3: 100.0})
    assert {sample_row(logits, RowSampling(biased, seed=s, position=0)) for s in range(20)} == {3}
    only = torch.tensor([False, True, False, False, True, False])
    drawn = {sample_row(logits, RowSampling(SamplingParams(), seed=s, position=0, allowed=only))
             for s in range(40)}
    assert drawn == {1, 4}


def test_unusable_rows_are_refused():
    params = SamplingParams(min_tokens=1)
    with pytest.raises(SamplingError, match="every token is masked"):
        sample_row(torch.zeros(2), RowSampling(params, seed=0, position=0, eos_token_ids=(0, 1)))
    with pytest.raises(SamplingError, match="NaN"):
        sample(torch.tensor([[0.0, float("nan")]]), [RowSampling(SamplingParams(), seed=0, position=0)])
    with pytest.raises(SamplingError, match="B = len"):
        sample(torch.zeros(2, 3), [RowSampling(SamplingParams(), seed=0, position=0)])
    with pytest.raises(ValueError, match="seed"):
        RowSampling(SamplingParams(), seed=-1, position=0)
    with pytest.raises(ValueError, match="position"):
        RowSampling(SamplingParams(), seed=0, position=1 << 63)
