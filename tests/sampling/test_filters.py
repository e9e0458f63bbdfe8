"""Steps 5-8: temperature, top-k, top-p, min-p, on hand-built rows and as properties."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.sampling.filters import (
    apply_temperature, min_p_keep, rank_order, softmax64, top_k_keep, top_p_keep, truncate,
)

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True)
# few distinct values, so that ties are common
tied_rows = st.lists(st.sampled_from([-3.0, -1.0, 0.0, 0.5, 2.0, 4.0]), min_size=1, max_size=16)
rows = st.lists(st.floats(-20, 20, width=32), min_size=1, max_size=16)


def kept(z, top_k=0, top_p=1.0, min_p=0.0):
    out = truncate(torch.tensor([z]), torch.tensor([top_k]), torch.tensor([top_p]),
                   torch.tensor([min_p]))[0]
    return [t for t, v in enumerate(out.tolist()) if v != -math.inf]


def probs(z):
    return torch.softmax(torch.tensor(z, dtype=torch.float64), dim=-1).tolist()


def test_temperature_is_a_correctly_rounded_division():
    x = torch.tensor([[1.0, -3.0], [1.0, -3.0]])
    assert apply_temperature(x, torch.tensor([0.5, 2.0])).tolist() == [[2.0, -6.0], [0.5, -1.5]]
    x = torch.randn(3, 5000, generator=torch.Generator().manual_seed(0)) * 10
    t = torch.tensor([0.7, 1.3, 0.3]).reshape(-1, 1)
    # a float32 quotient rounded from float64 is correctly rounded; x * (1 / t) is not
    assert torch.equal(apply_temperature(x, t.reshape(-1)), (x.double() / t.double()).float())


def test_top_k_by_hand():
    assert kept([1.0, 5.0, 3.0, 5.0, 2.0], top_k=2) == [1, 3]
    assert kept([1.0, 5.0, 3.0, 5.0, 2.0], top_k=1) == [1]
    assert kept([1.0, 5.0, 3.0, 5.0, 2.0], top_k=3) == [1, 2, 3]
    assert kept([1.0, 5.0], top_k=9) == [0, 1]


@SETTINGS
@given(z=tied_rows, k=st.integers(1, 20))
def test_top_k_keeps_exactly_k_largest_lowest_id_on_ties(z, k):
    expected = sorted(sorted(range(len(z)), key=lambda t: (-z[t], t))[:k])
    assert kept(z, top_k=k) == expected


def test_rank_order_breaks_ties_by_lowest_id():
    assert rank_order(torch.tensor([[0.0, 2.0, 0.0, 2.0, 1.0]])).tolist() == [[1, 3, 4, 0, 2]]


def test_top_p_by_hand():
    z = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    assert kept(z, top_p=0.45) == [0]
    assert kept(z, top_p=0.75) == [0, 1]
    assert kept(z, top_p=0.85) == [0, 1, 2]
    assert kept(z, top_p=1.0) == [0, 1, 2, 3]


@SETTINGS
@given(z=rows, top_p=st.floats(0.01, 0.99))
def test_top_p_keeps_the_minimal_nucleus(z, top_p):
    p = probs(z)
    order = sorted(range(len(z)), key=lambda t: (-z[t], t))
    keep = kept(z, top_p=top_p)
    nucleus = order[:len(keep)]
    assert sorted(nucleus) == keep  # a prefix of the (prob desc, id asc) order
    mass = math.fsum(p[t] for t in nucleus)
    assert mass >= top_p - 1e-9 or len(keep) == len(z)
    # minimal: without its last token the nucleus would not reach top_p
    assert math.fsum(p[t] for t in nucleus[:-1]) < top_p + 1e-9


def test_top_p_runs_over_the_top_k_survivors():
    z = [math.log(p) for p in (0.4, 0.3, 0.2, 0.1)]
    # alone, 0.4 < 0.55 needs a second token; after top-2, 0.4 / 0.7 = 0.57 >= 0.55 does not
    assert kept(z, top_p=0.55) == [0, 1]
    assert kept(z, top_k=2, top_p=0.55) == [0]


def test_min_p_by_hand():
    z = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    assert kept(z, min_p=0.2) == [0, 1, 2]
    assert kept(z, min_p=0.7) == [0]
    assert kept(z, min_p=1.0) == [0]


@SETTINGS
@given(z=rows, min_p=st.floats(0.0, 1.0))
def test_min_p_keeps_tokens_at_least_min_p_of_the_best(z, min_p):
    p = probs(z)
    best = max(p)
    keep = set(kept(z, min_p=min_p))
    for t, pt in enumerate(p):
        if pt > min_p * best * (1 + 1e-9):
            assert t in keep
        elif pt < min_p * best * (1 - 1e-9):
            assert t not in keep


@SETTINGS
@given(z=rows, top_k=st.integers(0, 20), top_p=st.floats(0.01, 1.0), min_p=st.floats(0.0, 1.0))
def test_truncation_always_keeps_the_argmax_and_only_removes(z, top_k, top_p, min_p):
    keep = kept(z, top_k=top_k, top_p=top_p, min_p=min_p)
    best = max(range(len(z)), key=lambda t: (z[t], -t))
    assert best in keep
    assert set(keep) <= set(kept(z, top_k=top_k))


def test_filters_are_per_row_in_a_batch():
    z = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    order = rank_order(z)
    assert top_k_keep(order, torch.tensor([1, 0])).tolist() == [[True, False, False], [True] * 3]
    assert top_p_keep(z, order, torch.tensor([1.0, 0.5])).tolist() == [[True] * 3, [True, False, False]]
    assert min_p_keep(z, torch.tensor([0.0, 0.3])).tolist() == [[True] * 3, [True, True, False]]


def test_softmax64_is_torch_softmax_in_float64():
    # the same formula in ops that spread a long row over the device: equal to float64 rounding on rows with
    # masked (-inf) entries, and NaN for a row with nothing finite, as torch.softmax gives
    gen = torch.Generator().manual_seed(0)
    z = 8 * torch.randn(3, 1000, generator=gen)
    z[0, ::3] = float("-inf")
    z[2] = float("-inf")
    got, want = softmax64(z), torch.softmax(z.to(torch.float64), dim=-1)
    torch.testing.assert_close(got[:2], want[:2], rtol=1e-14, atol=1e-300)
    assert got.dtype == torch.float64 and torch.isnan(got[2]).all() and torch.isnan(want[2]).all()
