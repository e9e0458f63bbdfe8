"""The device sampler draws exactly what the host sampler (``ninfer.sampling.draw``) draws from the same logits,
parameters, seed, position, history and mask: greedy, temperature, top-k, top-p, min-p, penalties, logit bias,
grammar bitmasks, min_tokens, logprobs, and the host's errors. On CPU the "naive" ops run at V = 1000 and 97 and the
Triton kernels in the interpreter on a few mixed batches; with NINFER_TEST_DEVICE=cuda both run on the GPU, the
Triton kernels also at the real vocabulary. Logits are random normals on a 2^-10 grid: no top-p boundary is a float64
tie, and logprob ranks and ties do not hang on the last bit of a log-sum-exp. Each case's settings decide some of its
draws (`WITHOUT`: the host's draws change when a setting is taken away), so a sampler that ignored one would fail."""

from dataclasses import dataclass, field, replace

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from ninfer.fast.ops.sample.layout import pack_bits
from ninfer.fast.sampling import DeviceSampler, SampleRow, variant_of
from ninfer.contracts import RowFailure
from ninfer.sampling import SamplingError, SamplingParams, draw

EOS = (2, 5)
KERNELS = ["naive", "triton"]


@dataclass
class History:
    prompt: tuple = ()
    outputs: list = field(default_factory=list)


def _sampler(vocab, kernels, max_batch=4):
    block = 2048 if vocab > 10_000 else (256 if vocab >= 1000 else 32)
    return DeviceSampler(vocab, max_batch, max_batch, DEVICE, kernels=kernels, eos_token_ids=EOS, block_v=block)


def _rows(cases, position, owners=None):
    """cases: (params, seed, history, mask) per row; the table rows run backwards, so they differ from the batch
    positions."""
    n = len(cases)
    return [SampleRow(p, seed, position + i, n - 1 - i, (owners or {}).get(i, ("seq", i, id(h))),
                      len(h.outputs), h, mask) for i, (p, seed, h, mask) in enumerate(cases)]


def _host(logits, rows):
    return [draw(logits[i].cpu(), r.params, r.seed, r.position, prompt=r.history.prompt, outputs=r.history.outputs,
                 eos_token_ids=EOS, mask=r.mask) for i, r in enumerate(rows)]


def _assert_same(got, want):
    assert [g[0] for g in got] == [w[0] for w in want]
    for g, w in zip(got, want):
        assert (g[1] is None) == (w[1] is None)
        if w[1] is not None:
            assert g[1][0] == pytest.approx(w[1][0], rel=1e-5, abs=1e-5)
            assert [t for t, _ in g[1][1]] == [t for t, _ in w[1][1]]
            assert [v for _, v in g[1][1]] == pytest.approx([v for _, v in w[1][1]], rel=1e-5, abs=1e-5)


def _logits(cases, vocab, positions):
    """The logits [B, V] drawn at each position (the same for the same cases, vocabulary and positions)."""
    gen = torch.Generator().manual_seed(vocab + len(cases))
    # a 2^-10 grid keeps distinct logits distinct logprobs under either log-sum-exp rounding (test_logprobs)
    return [(torch.round(2048 * torch.randn(len(cases), vocab, generator=gen)) / 1024).to(DEVICE) for _ in positions]


def _check(sampler, cases, vocab, positions=(0, 17)):
    for pos, logits in zip(positions, _logits(cases, vocab, positions)):
        rows = _rows(cases, pos)
        _assert_same(sampler.sample(logits, rows), _host(logits, rows))


# each case's feature taken away from its rows' params (one entry per setting): the host's draws must change,
# or a device sampler that ignored the setting would pass the case (top-p, the presence penalty and min_tokens'
# stop ids once did: their rows drew the same tokens without them)
WITHOUT = {
    "temperature": [lambda p: replace(p, temperature=1.0)],
    "top_k": [lambda p: replace(p, top_k=0)],
    "top_p": [lambda p: replace(p, top_p=1.0)],
    "top_k_top_p": [lambda p: replace(p, top_k=0), lambda p: replace(p, top_p=1.0)],
    "min_p": [lambda p: replace(p, min_p=0.0)],
    "penalties": [lambda p: replace(p, repetition_penalty=1.0), lambda p: replace(p, frequency_penalty=0.0),
                  lambda p: replace(p, presence_penalty=0.0)],
    "logit_bias": [lambda p: replace(p, logit_bias=())],
    "min_tokens": [lambda p: replace(p, min_tokens=0)],
}


def _assert_each_setting_bites(batches, vocab, positions, names):
    """Taking any setting of `names` away from every row changes some host draw of `batches`."""
    def draws(change):
        return [[w[0] for pos, logits in zip(positions, _logits(cases, vocab, positions))
                 for w in _host(logits, _rows([(change(p), s, h, m) for p, s, h, m in cases], pos))]
                for cases in batches]
    same = draws(lambda p: p)
    for name in names:
        for i, without in enumerate(WITHOUT[name]):
            assert draws(without) != same, f"{name} setting {i} changes no draw at V = {vocab}"


def _mask(vocab, keep, seed=0, bool_mask=False):
    allowed = torch.rand(vocab, generator=torch.Generator().manual_seed(seed)) < keep
    return allowed if bool_mask else pack_bits(allowed)


def _history(vocab, n_prompt, n_out, seed=1):
    g = torch.Generator().manual_seed(seed)
    return History(tuple(torch.randint(0, vocab, (n_prompt,), generator=g).tolist()),
                   torch.randint(0, vocab, (n_out,), generator=g).tolist())


def _cases(name, vocab):
    P = SamplingParams
    h = _history(vocab, 30, 12)
    half = History((), list(range(0, vocab, 2)) + list(range(0, vocab, 4)))
    table = {
        "greedy": [(P(temperature=0.0), 0, History(), None)] * 2,
        "temperature": [(P(temperature=t), s, History(), None) for t, s in ((0.7, 1), (1.0, 2 ** 64 - 1), (1.6, 3),
                                                                             (4.0, 23))],
        "top_k": [(P(temperature=0.9, top_k=k), s, History(), None) for k, s in ((1, 4), (5, 5), (vocab + 3, 6))],
        # hot rows with a small nucleus: without the cut most draws fall outside it
        "top_p": [(P(temperature=t, top_p=p), s, History(), None) for t, p, s in ((0.8, 0.5, 7), (1.2, 0.93, 8),
                                                                                 (2.0, 0.3, 21), (3.0, 0.15, 27))],
        "top_k_top_p": [(P(top_k=40, top_p=0.7), 9, History(), None), (P(temperature=0.5), 10, History(), None),
                        (P(temperature=2.0, top_k=8, top_p=0.3), 24, History(), None)],
        "min_p": [(P(temperature=1.3, min_p=m), s, History(), None) for m, s in ((0.05, 11), (0.3, 12))],
        # penalties that decide draws: repetition below 1 lifts the whole history's positive logits; over `half`
        # (every even id an output, the multiples of 4 twice) presence and frequency push the evens down
        "penalties": [(P(temperature=0.0, repetition_penalty=1.4, frequency_penalty=0.6, presence_penalty=-0.5),
                       0, h, None),
                      (P(temperature=0.9, repetition_penalty=0.2, presence_penalty=1.2), 13, h, None),
                      (P(temperature=0.0, presence_penalty=2.0), 0, half, None),
                      (P(temperature=0.0, frequency_penalty=2.0), 0, half, None)],
        "logit_bias": [(P.create(temperature=0.0, logit_bias={4: 100.0, 9: -100.0}), 0, History(), None),
                       (P.create(temperature=1.0, logit_bias={0: 3.5, vocab - 1: 8.0}), 15, History(), None)],
        "bitmask": [(P(temperature=0.0), 0, History(), _mask(vocab, 0.3)),
                    (P(temperature=1.1, top_p=0.9), 16, History(), _mask(vocab, 0.05, seed=1)),
                    (P(temperature=0.8), 17, History(), _mask(vocab, 0.5, seed=2, bool_mask=True))],
        # a bias makes the id the block is about the certain draw: the stop id 7 blocked before 3 outputs, the
        # EOS 2 free once 1 output is in, the EOS 5 never blocked under ignore_eos
        "min_tokens": [(P.create(temperature=0.0, min_tokens=3, stop_token_ids=[7], logit_bias={7: 100.0}), 0,
                        History((1,), [4]), None),
                       (P.create(temperature=0.0, min_tokens=1, logit_bias={2: 100.0}), 0, History((1,), [4]), None),
                       (P.create(temperature=1.0, min_tokens=2, ignore_eos=True, logit_bias={5: 100.0}), 18,
                        History(), None)],
        "logprobs": [(P(temperature=0.0, logprobs=0), 0, History(), None),
                     (P(temperature=0.9, top_k=30, logprobs=3), 19, History(), None),
                     (P(temperature=1.0, logprobs=20), 20, h, _mask(vocab, 0.5, seed=3))],
    }
    return table[name]


CASES = ["greedy", "temperature", "top_k", "top_p", "top_k_top_p", "min_p", "penalties", "logit_bias", "bitmask",
         "min_tokens", "logprobs"]


@pytest.mark.parametrize("vocab", [1000, 97])
@pytest.mark.parametrize("case", CASES)
def test_naive_equals_host_draw(case, vocab):
    _check(_sampler(vocab, "naive"), _cases(case, vocab), vocab)
    _assert_each_setting_bites([_cases(case, vocab)], vocab, (0, 17), [case] if case in WITHOUT else [])


def _mixed(vocab):
    """Every feature across three batches of four rows: (no sort), (sort) and the penalties."""
    c = {name: _cases(name, vocab) for name in CASES}
    plain = [c["temperature"][3], c["min_p"][1], c["logprobs"][2], c["min_tokens"][0]]
    sorted_ = [c["top_k"][1], c["top_p"][3], c["bitmask"][1], c["logit_bias"][1]]
    return plain, sorted_, c["penalties"]


@pytest.mark.parametrize("vocab", [1000, 97] + ([248320] if ON_GPU else []))
def test_triton_equals_host_draw(vocab):
    sampler = _sampler(vocab, "triton")
    sampler.capture()  # the prefill draw's B = 1 graphs, one per variant (CUDA only)
    assert sorted(sampler.graphs) == (sorted(sampler.VARIANTS) if ON_GPU else [])
    plain, sorted_, penalties = _mixed(vocab)
    c = {name: _cases(name, vocab) for name in ("top_k", "top_k_top_p")}
    bounded = [c["top_k"][1], c["top_k_top_p"][0], c["top_k_top_p"][2], plain[0]]  # top-k <= TOP_K_BOUND: no sort
    assert variant_of(_rows(bounded, 0)) == "top_k"
    batches = (plain, sorted_, penalties, plain[:1], sorted_[:1], plain[1:2], bounded)
    for cases in batches:
        _check(sampler, cases, vocab, positions=(3,) if not ON_GPU else (0, 3, 17, 1 << 33))
    if vocab < 10_000:  # at position 3 (on every device) each setting decides some draw
        _assert_each_setting_bites(batches, vocab, (3,), [name for name in WITHOUT if name != "top_k_top_p"])


@pytest.mark.parametrize("kernels", KERNELS)
def test_penalty_counts_follow_commits(kernels):
    """A generation loop: each drawn token is recorded as committed, so the device counts equal the host's history
    at every step (repetition, frequency and presence all on); a new owner on the same table row starts over."""
    V = 97
    sampler = _sampler(V, kernels)
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.8, presence_penalty=0.6),
              SamplingParams(temperature=0.7, frequency_penalty=1.9, min_tokens=4, logprobs=2)]
    gen = torch.Generator().manual_seed(5)
    for owner in ("first", "second"):
        hist = [History((1, 2, 3), [4] if owner == "second" else []), History((9,))]
        for step in range(5):
            logits = (torch.round(512 * torch.randn(2, V, generator=gen)) / 1024).to(DEVICE)
            rows = [SampleRow(p, 11, 3 + step, i, (owner, i), len(h.outputs), h)
                    for i, (p, h) in enumerate(zip(params, hist))]
            got = sampler.sample(logits, rows)
            _assert_same(got, _host(logits, rows))
            for i, (token, _) in enumerate(got):
                hist[i].outputs.append(token)
            sampler.record([(i, (owner, i), [token]) for i, (token, _) in enumerate(got)])
        counts = torch.bincount(torch.tensor(hist[0].outputs), minlength=V).to(torch.int32)
        assert torch.equal(sampler.tables.counts[0].cpu(), counts)


def _host_outcome(logits, row):
    """The host's draw of one row, or the RowFailure of its SamplingError."""
    try:
        return _host(logits[None], [row])[0]
    except SamplingError as e:
        return e.failure


@pytest.mark.parametrize("kernels", KERNELS)
def test_errors_are_the_hosts_and_per_row(kernels):
    """An undrawable row gets the host's RowFailure, detected on the device (NaN/+inf after the adjustments, nothing
    left) or on the host before the draw (ids outside the vocabulary, malformed masks); the other rows of the same
    step are drawn exactly as the host draws them."""
    V = 97
    sampler = _sampler(V, kernels)
    P = SamplingParams
    F = RowFailure
    nothing = torch.zeros(V, dtype=torch.bool)
    only_eos = torch.arange(V) == EOS[0]
    nan_masked = torch.ones(V, dtype=torch.bool)
    nan_masked[10] = False
    fine = (P(temperature=0.9), 21, History(), None)
    cases = [
        ((P(temperature=0.0), 0, History(), None), (3, float("nan")), F.NON_FINITE_LOGITS),
        ((P(temperature=0.9), 1, History(), None), (50, float("inf")), F.NON_FINITE_LOGITS),
        ((P(temperature=0.9), 1, History(), nothing), None, F.NOTHING_ALLOWED),
        ((P(temperature=0.0, min_tokens=2), 0, History(), only_eos), None, F.NOTHING_ALLOWED),
        ((P.create(logit_bias={V + 3: 1.0}), 2, History(), None), None, F.INVALID_SAMPLING_INPUT),
        ((P(), 3, History(), torch.ones(V + 1, dtype=torch.bool)), None, F.INVALID_SAMPLING_INPUT),
        ((P(repetition_penalty=1.2), 4, History((V + 5,)), None), None, F.INVALID_SAMPLING_INPUT),
        ((P(temperature=0.0), 0, History(), nan_masked), (10, float("nan")), None),  # its NaN is masked out
    ]
    for k, (case, poison, failure) in enumerate(cases):
        # the failing row sits between two good ones
        logits = torch.randn(3, V)
        if poison is not None:
            logits[1, poison[0]] = poison[1]
        rows = _rows([fine, case, fine], 0, owners={i: ("err", k, i) for i in range(3)})
        want = [_host_outcome(logits[i], r) for i, r in enumerate(rows)]
        assert (want[1] if failure is not None else None) == failure
        got = sampler.sample(logits.to(DEVICE), rows)
        assert [g if isinstance(g, RowFailure) else g[0] for g in got] == \
               [w if isinstance(w, RowFailure) else w[0] for w in want]


def test_variant_is_the_cheapest_that_serves_every_row():
    P = SamplingParams

    def rows(*params):
        return [SampleRow(p, 0, 0, 0, i, 0, History()) for i, p in enumerate(params)]
    assert variant_of(rows(P(temperature=0.0), P(temperature=0.0, repetition_penalty=2.0))) == "greedy"
    assert variant_of(rows(P(temperature=0.0, logprobs=1))) == "sample"
    assert variant_of(rows(P(temperature=0.0), P(min_p=0.1))) == "sample"
    assert variant_of(rows(P(temperature=0.0, top_k=5), P())) == "sample"  # greedy rows never truncate
    assert variant_of(rows(P(), P(top_p=0.9))) == "sort"
    # Qwen3.5's defaults: the cutoff from the top TOP_K_BOUND values, no sort of the vocabulary
    assert variant_of(rows(P(top_k=20, top_p=0.95), P())) == "top_k"
    assert variant_of(rows(P(top_k=128))) == "top_k" and variant_of(rows(P(top_k=129))) == "sort"
    assert variant_of(rows(P(top_k=20), P(top_p=0.9))) == "sort"  # a nucleus alone may reach past any bound
    assert variant_of(rows(P(top_k=-1))) == "sample"
