"""sample (Triton) vs sample_naive: random batches of mixed rows (greedy, temperature, top-k/top-p through the sort,
min-p, penalties, bias, grammar mask, min_tokens), heavy ties, and the NaN/+inf/all-masked statuses. Tokens and
statuses must agree exactly; workspaces come NaN-poisoned, so a block the reduction misses shows up. The random rows
seldom let a penalty, min-p or a cut decide a draw, so one row per setting is built so that it does."""

import pytest
import torch

from _device import DEVICE, ON_GPU
from ninfer.fast.ops.sample import SampleInputs, SampleWorkspace, sample, sample_naive
from ninfer.fast.ops.sample import layout as L

# (B, V, block): awkward vocabularies, several blocks and a ragged last one; the GPU adds the real vocabulary
SHAPES = [(3, 1000, 128), (3, 97, 32)] + ([(8, 248320, 2048), (5, 151936, 1024)] if ON_GPU else [])
TABLE_FLAGS = (L.MASK, L.BIAS, L.MIN_TOKENS, L.REPETITION_ON, L.FREQUENCY_ON, L.PRESENCE_ON)


def _inputs(B, V, gen, *, sort, flags=None, max_batch=None, device=DEVICE):
    """Random rows over random tables; row b reads table row R-1-b (table rows are data, not batch positions)."""
    R = B + 1
    params = torch.zeros(max_batch or B, L.INT_COLUMNS + L.FLOAT_COLUMNS, dtype=torch.int64)
    ip, fp = params[:, :L.INT_COLUMNS], params[:, L.INT_COLUMNS:].view(torch.float64)
    for b in range(B):
        f = flags[b] if flags is not None else sum(bit for bit in TABLE_FLAGS if torch.rand(1, generator=gen) < 0.5)
        if flags is None and b == 0:
            f |= L.GREEDY
        ip[b, L.ROW], ip[b, L.FLAGS] = R - 1 - b, f
        ip[b, L.SEED] = int(torch.randint(-2 ** 62, 2 ** 62, (1,), generator=gen)) * 2 + 1
        ip[b, L.POSITION] = int(torch.randint(0, 2 ** 40, (1,), generator=gen))
        ip[b, L.TOP_K] = int(torch.randint(1, V // 2, (1,), generator=gen)) if sort and b % 2 else 0
        fp[b, L.TOP_P] = 0.3 + 0.6 * float(torch.rand(1, generator=gen)) if sort and b != 1 else 1.0
        fp[b, L.MIN_P] = 0.02 if b == 2 else 0.0
        fp[b, L.TEMPERATURE] = 0.5 + float(torch.rand(1, generator=gen))
        fp[b, L.REPETITION], fp[b, L.FREQUENCY], fp[b, L.PRESENCE] = 1.3, 0.45, -0.7
    masks = L.pack_bits(torch.rand(max_batch or B, V, generator=gen) < 0.6)
    bias = torch.where(torch.rand(R, V, generator=gen) < 0.05, 4 * torch.randn(R, V, generator=gen), 0.0)
    blocked = L.pack_bits(torch.rand(R, V, generator=gen) < 0.02)
    seen = L.pack_bits(torch.rand(R, V, generator=gen) < 0.1)
    counts = torch.randint(0, 3, (R, V), generator=gen, dtype=torch.int32) * (torch.rand(R, V, generator=gen) < 0.1)
    return SampleInputs(*(t.to(device) for t in (ip, fp, masks, bias, blocked, seen, counts.to(torch.int32))))


def _compare(logits, inp, *, race=True, sort=False, block=128, max_batch=None, top_k_bound=None):
    B, V = logits.shape
    ws = SampleWorkspace.allocate(max_batch or B, V, DEVICE, block_v=block)
    out = torch.full((max_batch or B, 2), -7, dtype=torch.int32, device=DEVICE)
    ref = sample_naive(logits, inp.rows(B))
    tri = sample(logits, inp.rows(B), race=race, sort=sort, top_k_bound=top_k_bound, workspace=ws, out=out[:B])
    assert tri.data_ptr() == out.data_ptr()
    ok = ref[:, 1] == L.OK
    assert torch.equal(tri[:, 1], ref[:, 1]), f"status {tri[:, 1].tolist()} != {ref[:, 1].tolist()}"
    assert torch.equal(tri[ok, 0], ref[ok, 0]), f"tokens {tri[:, 0].tolist()} != {ref[:, 0].tolist()}"
    assert ((tri[:, 0] >= 0) & (tri[:, 0] < V)).all()
    assert (out[B:] == -7).all(), "rows past B were written"
    return ref


@pytest.mark.parametrize("sort", [False, True], ids=["race", "sort"])
@pytest.mark.parametrize("B,V,block", SHAPES)
def test_sample(B, V, block, sort):
    gen = torch.Generator().manual_seed(V + sort)
    for _ in range(2):
        logits = (3 * torch.randn(B, V, generator=gen)).to(DEVICE)
        _compare(logits, _inputs(B, V, gen, sort=sort), sort=sort, block=block)


def test_each_setting_decides_its_row():
    """One row per setting with only that setting on, built to turn away the token the row draws with nothing on
    (the naive op says which): a bias of -100, a mask or min_tokens block on it, a repetition penalty of 2 on it as
    a prompt id, a count with a frequency or presence penalty of 2, and on hot rows min-p, top-k and top-p cut to the
    argmax. The kernel must agree with the naive op and every row must draw another token, so a kernel that
    ignored a setting fails here; the random batches above seldom let a penalty, min-p or a cut decide a draw (the
    kernel without them passed every one)."""
    names = ["mask", "bias", "min_tokens", "repetition", "frequency", "presence", "min_p", "top_k", "top_p"]
    flags = {"mask": L.MASK, "bias": L.BIAS, "min_tokens": L.MIN_TOKENS, "repetition": L.REPETITION_ON,
             "frequency": L.FREQUENCY_ON, "presence": L.PRESENCE_ON}
    B, V = len(names), 97
    gen = torch.Generator().manual_seed(11)
    logits = 3 * torch.randn(B, V, generator=gen)
    # built and edited on the host, where the naive op finds each row's free token; compared on DEVICE
    inp = _inputs(B, V, gen, sort=True, flags=[flags.get(n, 0) for n in names], device="cpu")
    inp.iparams[:, L.TOP_K], inp.fparams[:, L.TOP_P], inp.fparams[:, L.MIN_P] = 0, 1.0, 0.0
    inp.fparams[6:, L.TEMPERATURE] = 5.0  # flat rows: the draw is seldom the argmax
    for table in (inp.masks, inp.bias, inp.blocked, inp.prompt_seen, inp.counts):
        table.fill_(-1 if table is inp.masks else 0)  # all allowed, nothing biased, blocked, seen or counted
    free = sample_naive(logits, inp)[:, 0].tolist()  # [B]: each row's token with nothing on
    for b, (name, token) in enumerate(zip(names, free)):
        row = int(inp.iparams[b, L.ROW])
        if name == "mask":
            inp.masks[b] = L.pack_bits(torch.arange(V) != token)
        elif name == "bias":
            inp.bias[row, token] = -100.0
        elif name in ("min_tokens", "repetition"):
            (inp.blocked if name == "min_tokens" else inp.prompt_seen)[row] = L.pack_bits(torch.arange(V) == token)
        elif name in ("frequency", "presence"):
            inp.counts[row, token] = 1
        inp.fparams[b, L.REPETITION], inp.fparams[b, L.FREQUENCY], inp.fparams[b, L.PRESENCE] = 2.0, 2.0, 2.0
    inp.fparams[6, L.MIN_P], inp.iparams[7, L.TOP_K], inp.fparams[8, L.TOP_P] = 1.0, 1, 1e-3
    fields = ("iparams", "fparams", "masks", "bias", "blocked", "prompt_seen", "counts")
    ref = _compare(logits.to(DEVICE), SampleInputs(*(getattr(inp, f).to(DEVICE) for f in fields)), sort=True,
                   block=32)
    assert (ref[:, 1] == L.OK).all()
    same = [name for name, token, got in zip(names, free, ref[:, 0].tolist()) if got == token]
    assert not same, f"settings that did not change their row's draw: {same}"


@pytest.mark.parametrize("B,V,block", SHAPES[:2])
def test_sample_ties_and_greedy_only(B, V, block):
    """Flat and integer logits tie everywhere: the top-k and top-p cuts keep the lowest ids of a tied value, the
    argmax takes the lowest id."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(-2, 3, (B, V), generator=gen).float()
    logits[:2] = 0.0
    inp = _inputs(B, V, gen, sort=True, flags=[0] * B)
    inp.iparams[:2, L.TOP_K] = torch.tensor([5, 0])
    # a flat row's nucleus: the ranks j with j / V < top_p, away from a float64 boundary
    inp.fparams[:2, L.TOP_P] = torch.tensor([1.0, 0.3049], dtype=torch.float64)
    for seed in range(3):
        inp.iparams[:, L.SEED] += seed
        ref = _compare(logits.to(DEVICE), inp, sort=True, block=block)
        assert ref[0, 0] < 5 and ref[1, 0] < int(0.3049 * V) + 1
    greedy = _inputs(B, V, gen, sort=False, flags=[L.GREEDY, L.GREEDY | L.BIAS | L.MASK, L.GREEDY][:B])
    ref = _compare(logits.to(DEVICE), greedy, race=False, block=block, max_batch=B + 2)
    assert ref[0, 0] == 0 and ref[2, 0] == int(torch.argmax(logits[2]))


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("B,V,block", SHAPES)
def test_sample_with_a_bounded_top_k(B, V, block, ties):
    """The sort variant's cutoff from the top `top_k_bound` values (every random row with top-k in 1..bound, or with
    neither filter) draws what the naive op draws, over random and heavily tied logits (a tie at the cutoff keeps its
    lowest ids), and equals the sorting cutoff's (tau, tid) row for row."""
    from ninfer.fast.ops.sample.cutoff import bounded_cutoff, truncation_cutoff

    bound = 16
    gen = torch.Generator().manual_seed(V + 3 * ties)
    for _ in range(2):
        logits = (torch.randint(-3, 3, (B, V), generator=gen).float() if ties else
                  3 * torch.randn(B, V, generator=gen)).to(DEVICE)
        inp = _inputs(B, V, gen, sort=True)
        inp.iparams[:, L.TOP_K] = torch.randint(1, bound + 1, (B,), generator=gen).to(DEVICE)
        inp.iparams[-1, L.TOP_K], inp.fparams[-1, L.TOP_P] = 0, 1.0  # a row with neither filter
        inp.fparams[0, L.TOP_P] = 1e-3  # a nucleus of one token: the first argmax alone
        _compare(logits, inp, sort=True, block=block, top_k_bound=bound)
        z = logits / 0.7
        want = torch.empty(B, device=DEVICE), torch.empty(B, dtype=torch.int64, device=DEVICE)
        got = torch.full((B,), float("nan"), device=DEVICE), torch.full((B,), -1, dtype=torch.int64, device=DEVICE)
        truncation_cutoff(z, inp.iparams[:, L.TOP_K], inp.fparams[:, L.TOP_P], *want)
        bounded_cutoff(z, inp.iparams[:, L.TOP_K], inp.fparams[:, L.TOP_P], *got, bound)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert (got[0][0], got[1][0]) == (z[0].max(), z[0].argmax())


def test_sample_statuses():
    """NaN/+inf count after steps 1-4, so a NaN the mask removes is fine; a row with nothing left is ALL_MASKED."""
    B, V = 4, 200
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(B, V, generator=gen)
    logits[0, 17] = float("nan")
    logits[1, 150] = float("inf")
    logits[2, 3] = float("nan")  # masked out below
    flags = [0, L.GREEDY, L.MASK, L.MASK | L.GREEDY]
    inp = _inputs(B, V, gen, sort=False, flags=flags)
    masks = torch.ones(B, V, dtype=torch.bool)
    masks[2, 3] = False
    masks[3] = False
    inp = SampleInputs(inp.iparams, inp.fparams, L.pack_bits(masks).to(DEVICE), *(
        getattr(inp, name) for name in ("bias", "blocked", "prompt_seen", "counts")))
    ref = _compare(logits.to(DEVICE), inp, block=64)
    assert ref[:, 1].tolist() == [L.BAD_LOGITS, L.BAD_LOGITS, L.OK, L.ALL_MASKED]
