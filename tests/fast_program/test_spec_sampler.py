"""SpecSampler (the fast round's draws on the device) against the host definition ``ninfer.sampling``: each draft
equals ``draw_draft`` along the row's own chain (greedy, temperature, top-k/top-p, min-p, penalties that see the
earlier drafts, bias, min_tokens), and each block's acceptance (tokens, failures, logprobs) equals ``accept`` with
grammar rows per draft prefix, for drafts from the device and from a host drafter (point-mass q). Rows of one call
have different parameters and room; logits past a row's block are NaN, so a read past it shows. CPU: naive ops, and
the draws also with the Triton kernels (the random rows' race, ``ops/gumbel_race``), interpreted; with
NINFER_TEST_DEVICE=cuda the Triton draws run on the GPU."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import pytest
import torch

from ninfer.contracts import RowFailure
from ninfer.fast.ops.sample import layout as L
from ninfer.fast.ops.sample.layout import pack_bits
from ninfer.fast.sampling import DeviceSampler
from ninfer.fast.sampling.draft_block import DraftBlock
from ninfer.fast.sampling.spec import SpecSampler
from ninfer.fast.sampling.static_draws import StaticDraws
from ninfer.sampling import RowContext, SamplingError, SamplingParams, accept, draw_draft

V, K, EOS = 61, 3, 5
ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()


def _device(kernels: str) -> torch.device:
    """Where the draws under test run: the Triton kernels on the GPU when there is one (interpreted on a CPU)."""
    return torch.device("cuda" if kernels == "triton" and ON_GPU else "cpu")
PARAMS = [SamplingParams(temperature=0.0),
          SamplingParams(temperature=0.9, top_k=12, top_p=0.8, logprobs=3),
          SamplingParams(temperature=1.1, min_p=0.05, presence_penalty=0.7, frequency_penalty=0.2),
          SamplingParams(temperature=0.0, repetition_penalty=1.3, logit_bias=((7, 3.0), (9, -2.0)), min_tokens=6,
                         logprobs=0),
          SamplingParams(temperature=0.7)]
# the cutoff's two ways (ninfer.fast.ops.sample.cutoff): row 1's top-k 12 reads the top values, a nucleus alone sorts
CUTOFFS = {"top_k": PARAMS, "sort": [PARAMS[0], SamplingParams(temperature=0.9, top_p=0.8, logprobs=3), *PARAMS[2:]]}


@dataclass
class Seq:
    row: int
    frontier: int
    prompt: list[int]
    outputs: list[int]
    handle: object = field(default_factory=object)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    @property
    def pending(self) -> int:
        return self.outputs[-1]


def _rows(gen: torch.Generator, params=PARAMS):
    seqs, ctxs = [], []
    for b, p in enumerate(params):
        prompt = torch.randint(0, V, (4 + b,), generator=gen).tolist()
        outputs = torch.randint(0, V, (1 + b % 3,), generator=gen).tolist()
        seqs.append(Seq(row=(b * 3) % len(PARAMS), frontier=len(prompt) + len(outputs) - 1, prompt=prompt,
                        outputs=outputs))
        ctxs.append(RowContext(p, 1000 + 17 * b, prompt, outputs, (EOS,)))
    return seqs, ctxs


def _spec(kernels: str = "naive"):
    sampler = DeviceSampler(V, len(PARAMS), len(PARAMS), _device(kernels), kernels=kernels, eos_token_ids=(EOS,))
    return SpecSampler(sampler, K, block_v=16)  # several vocabulary blocks, a ragged last one


@pytest.mark.parametrize("cutoff", CUTOFFS)
@pytest.mark.parametrize("kernels", ["naive", "triton"])
def test_device_drafts_equal_draw_draft(kernels, cutoff):
    gen = torch.Generator().manual_seed(3)
    seqs, ctxs = _rows(gen, CUTOFFS[cutoff])
    rooms = [3, 2, 3, 1, 0]
    spec, dev = _spec(kernels), _device(kernels)
    block = DraftBlock.empty(rooms, K, V, dev, [c.params.is_greedy for c in ctxs])
    rows = spec.draft_rows(seqs, ctxs, K)
    assert rows.steps.sort and rows.steps.bounded == (cutoff == "top_k")  # the cutoff under test runs
    live = torch.tensor([b for b, k in enumerate(rooms) if k])
    logits = 3 * torch.randn(K, len(live), V, generator=gen)
    logits[1, 0, :] = float("nan")  # row 0's second draft cannot be drawn: its drafts end after one
    for j in range(K):
        spec.draw(rows, block, j, live.to(dev), logits[j].to(dev))
    for n, b in enumerate(live.tolist()):
        drafts, qs = [], []
        for j in range(rooms[b]):
            try:
                x, q = draw_draft(logits[j, n], ctxs[b], seqs[b].frontier + 1 + j, drafts)
            except SamplingError:
                break
            drafts.append(x)
            qs.append(q)
        assert int(block.num[b]) == len(drafts), b
        assert block.tokens[b, :len(drafts)].tolist() == drafts, b
        for j, q in enumerate(qs):
            if q is not None:
                assert torch.allclose(torch.softmax(block.z[b, j].double(), -1).cpu(), q, atol=1e-6), (b, j)


@pytest.mark.parametrize("kernels", ["naive", "triton"])
def test_min_tokens_ends_inside_a_block(kernels):
    # a row two outputs short of min_tokens drafts three, EOS the argmax everywhere: each draft position counts its
    # own outputs (the drafts before it), so EOS is blocked for the first two and drawn third, as draw_draft says
    prompt, outputs = [1, 2, 3, 4], [7, 8]
    seq = Seq(row=0, frontier=len(prompt) + len(outputs) - 1, prompt=prompt, outputs=outputs)
    ctx = RowContext(SamplingParams(temperature=0.0, min_tokens=4), 99, prompt, outputs, (EOS,))
    spec, dev = _spec(kernels), _device(kernels)
    rows = spec.draft_rows([seq], [ctx], K)
    block = DraftBlock.empty([K], K, V, dev, [True])
    logits = torch.randn(K, 1, V, generator=torch.Generator().manual_seed(11))
    logits[:, :, EOS] = 50.0
    for j in range(K):
        spec.draw(rows, block, j, torch.tensor([0], device=dev), logits[j].to(dev))
    want: list[int] = []
    for j in range(K):
        want.append(draw_draft(logits[j, 0], ctx, seq.frontier + 1 + j, want)[0])
    assert block.tokens[0].tolist() == want and want[2] == EOS and EOS not in want[:2]


@pytest.mark.parametrize("cutoff", CUTOFFS)
@pytest.mark.parametrize("kernels", ["naive", "triton"])
def test_static_draws_equal_the_eager_draws(kernels, cutoff):
    """The draft graphs' draws (`SpecSampler.draw_static` on `StaticDraws`: the draft index a device scalar, the
    drafting rows compact) equal `draw` on the round's block, drafts, counts and q, for every parameter mix above
    and a row that cannot be drawn from, with buffers left dirty by an earlier round of more steps."""
    gen = torch.Generator().manual_seed(5)
    seqs, ctxs = _rows(gen, CUTOFFS[cutoff])
    spec, dev = _spec(kernels), _device(kernels)
    rows = spec.draft_rows(seqs, ctxs, K)
    greedy = [c.params.is_greedy for c in ctxs]
    draws = StaticDraws(len(PARAMS), K, V, dev)
    # first K steps over logits every draft of which is drawable, then two steps (no row has more room)
    for rooms in ([3, 2, 3, 1, 0], [2, 2, 1, 1, 0]):
        live = torch.tensor([b for b, k in enumerate(rooms) if k], device=dev)
        B, steps = len(live), max(rooms)
        logits = (3 * torch.randn(steps, B, V, generator=gen)).to(dev)
        if steps < K:
            logits[1, 0, :] = float("nan")  # row 0's second draft cannot be drawn
        draws.load(rows, rows.steps, live.tolist(), len(PARAMS))
        draws.room[:B] = torch.tensor([rooms[b] for b in live.tolist()], dtype=torch.int32)
        draws.reset(B)
        for j in range(steps):
            spec.draw_static(draws, B, rows.steps, logits[j])
    eager = DraftBlock.empty(rooms, K, V, dev, greedy)
    for j in range(steps):
        spec.draw(rows, eager, j, live, logits[j])
    static = DraftBlock.empty(rooms, K, V, dev, greedy)
    draws.store(static, live, B)
    assert static.num.tolist() == eager.num.tolist() == [1, 2, 1, 1, 0]
    assert torch.equal(static.tokens, eager.tokens)
    torch.testing.assert_close(static.z, eager.z, rtol=0, atol=0, equal_nan=True)  # the NaN row's q is NaN


def test_a_lean_greedy_round_never_builds_its_draft_rows():
    """`draft_rows` decides the steps at once and builds the parameter rows on their first read (`RowParams`);
    `StaticDraws.load` reads them only for a variant whose steps do, so a lean greedy round (the draft graphs'
    common case) neither fills nor copies them, while a round with a bias loads exactly its live rows."""
    from ninfer.fast.sampling.draw_variants import draw_steps, draw_variant

    gen = torch.Generator().manual_seed(3)
    spec, dev = _spec("naive"), _device("naive")
    lean = spec.draft_rows(*_rows(gen, [SamplingParams(temperature=0.0)] * 2), K)
    draws = StaticDraws(2, K, V, dev)
    # every row of the round drafts and nothing reads the rows: not even their index tensor is made
    assert draws.load(lean, draw_steps(draw_variant(lean.steps)), [0, 1], 2) is None
    assert not lean.steps.reads_params and not lean.staged
    biased = spec.draft_rows(*_rows(gen, [SamplingParams(temperature=0.0, logit_bias=((7, 3.0),))] * 3), K)
    assert not biased.staged
    at = draws.load(biased, draw_steps(draw_variant(biased.steps)), [2, 0], 3)
    assert biased.staged and at.tolist() == [2, 0]
    ip = biased.ip.reshape(3, K, -1)
    assert torch.equal(draws.ip[:2], ip[[2, 0]]) and draws.ip[0, 1, L.POSITION] == ip[2, 0, L.POSITION] + 1


# the rows of a round without penalties (a DFlash block's draws are then independent): greedy, top-k/top-p, min-p,
# greedy with a bias and min_tokens, temperature alone
NO_PENALTIES = [PARAMS[0], PARAMS[1], SamplingParams(temperature=1.1, min_p=0.05),
                SamplingParams(temperature=0.0, logit_bias=((7, 3.0), (9, -2.0)), min_tokens=6, logprobs=0), PARAMS[4]]


@pytest.mark.parametrize("kernels", ["naive", "triton"])
def test_block_draws_equal_the_slot_draws(kernels):
    """`draw_block_static` (every slot of a DFlash block in one pass, a round without penalties) leaves in
    `StaticDraws` what k `draw_static` calls leave: drafts, q, the count of drawable drafts (a row's second slot
    that cannot be drawn from ends its drafts there; rooms below k cut the count) and the draft index."""
    gen = torch.Generator().manual_seed(9)
    seqs, ctxs = _rows(gen, NO_PENALTIES)
    spec, dev = _spec(kernels), _device(kernels)
    rows = spec.draft_rows(seqs, ctxs, K)
    assert not rows.penalized and rows.steps.random and spec.draft_rows(*_rows(gen, PARAMS), K).penalized
    live, rooms = torch.arange(len(NO_PENALTIES), device=dev), [3, 2, 3, 1, 3]
    B = len(live)
    logits = 3 * torch.randn(B, K, V, generator=gen)
    logits[2, 1, :] = float("nan")
    logits = logits.to(dev)
    out = []
    for block in (False, True):
        draws = StaticDraws(B, K, V, dev)
        draws.load(rows, rows.steps, live.tolist(), B)
        draws.room[:B] = torch.tensor(rooms, dtype=torch.int32)
        draws.reset(B)
        if block:
            # the block graph's steps: the variant's without the penalty step (an identity for these rows)
            spec.draw_block_static(draws, B, dataclasses.replace(rows.steps, penalties=False), logits)
        else:
            for j in range(K):
                spec.draw_static(draws, B, rows.steps, logits[:, j].contiguous())
        out.append(draws)
    slots, block = out
    assert block.num.tolist() == slots.num.tolist() == [3, 2, 1, 1, 3] and int(block.j) == int(slots.j) == K
    assert torch.equal(block.drafts, slots.drafts)
    torch.testing.assert_close(block.z, slots.z, rtol=0, atol=0, equal_nan=True)


def _masks(gen, lens, empty: int):
    """Row 4 under a grammar: one random bitmask per verified position, the one at position `empty` (when the row
    verifies that many) forbidding everything: acceptance reaching it fails the row."""
    out = []
    for b, n in enumerate(lens):
        if b != 4:
            out.append([None] * (n + 1))
            continue
        rows = [pack_bits(torch.rand(V, generator=gen) < 0.6) for _ in range(n + 1)]
        if empty <= n:
            rows[empty] = pack_bits(torch.zeros(V, dtype=torch.bool))
        out.append(rows)
    return out


@pytest.mark.parametrize("host_drafts", [False, True], ids=["device-drafts", "host-drafts"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("cutoff", CUTOFFS)
def test_device_acceptance_equals_accept(host_drafts, seed, cutoff):
    gen = torch.Generator().manual_seed(40 + seed)
    seqs, ctxs = _rows(gen, CUTOFFS[cutoff])
    rooms = [3, 3, 2, 3, 3] if seed % 2 else [0, 3, 3, 1, 0]  # a random row without drafts still samples
    spec = _spec()
    # drafts near the target (so acceptance runs long) or a point mass on a random id
    target = [2.0 * torch.randn(n + 1, V, generator=gen) for n in rooms]
    draft_logits = [t[:-1] + 0.5 * torch.randn(t.shape[0] - 1, V, generator=gen) for t in target]
    if host_drafts:
        pairs = []
        for b, n in enumerate(rooms):
            drafts = [int(torch.argmax(target[b][j])) if j % 2 == 0 else int(torch.randint(0, V, (1,),
                                                                                             generator=gen))
                      for j in range(n)]
            q = [None] * n if ctxs[b].params.is_greedy else \
                [torch.nn.functional.one_hot(torch.tensor(d), V).double() for d in drafts]
            pairs.append((tuple(drafts), q))
        block = DraftBlock.from_host(pairs, [c.params.is_greedy for c in ctxs], K, V, torch.device("cpu"))
    else:
        block = DraftBlock.empty(rooms, K, V, torch.device("cpu"), [c.params.is_greedy for c in ctxs])
        rows = spec.draft_rows(seqs, ctxs, K)
        live = torch.tensor([b for b, k in enumerate(rooms) if k])
        for j in range(K):
            spec.draw(rows, block, j, live, torch.stack([draft_logits[b][min(j, rooms[b] - 1)] for b in
                                                         live.tolist()]))
        pairs = [block[b] for b in range(len(rooms))]
    # row 4's grammar leaves nothing at its first position (seeds 0, 2: it has no drafts, so it fails there) or at
    # its second (seeds 1, 3: it fails when its first draft is accepted)
    masks = _masks(gen, rooms, seed % 2)
    poisoned = [torch.cat([t, torch.full((K + 1 - t.shape[0], V), float("nan"))]) for t in target]
    got = spec.accept(seqs, ctxs, block, [t[:n + 1] for t, n in zip(poisoned, rooms)], masks)
    failed = []
    for b, (drafts, q) in enumerate(pairs):
        n = int(block.num[b])
        try:
            want = accept(target[b][:len(drafts) + 1], drafts[:n], q[:n], ctxs[b], seqs[b].frontier + 1,
                          masks[b][:n + 1])
        except SamplingError as e:
            assert got[b] == e.failure, b
            failed.append(b)
            continue
        assert not isinstance(got[b], RowFailure), (b, got[b])
        assert got[b].tokens == want.tokens, (b, got[b].tokens, want.tokens)
        if want.logprobs is None:
            assert got[b].logprobs is None
            continue
        for (lp, top), (wlp, wtop) in zip(got[b].logprobs, want.logprobs):
            assert abs(lp - wlp) < 1e-5 and [t for t, _ in top] == [t for t, _ in wtop], b
    assert failed == [4] or (seed % 2 and not failed), failed


def test_rounds_without_steps_1_to_4_draw_lean():
    # the draft graphs' lean variants skip the bias, min_tokens and penalty steps only where no row of the round
    # has them; one row with a penalty puts the whole round on the full steps
    from ninfer.fast.sampling.draw_variants import LEAN, draw_steps, draw_variant

    gen = torch.Generator().manual_seed(2)
    plain = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=12, top_p=0.8)]
    seqs, ctxs = _rows(gen, plain)
    rows = _spec().draft_rows(seqs, ctxs, K)
    assert draw_variant(rows.steps) == "top_k" + LEAN and rows.steps == draw_steps("top_k" + LEAN)
    assert not (rows.steps.bias or rows.steps.min_tokens or rows.steps.penalties)
    seqs, ctxs = _rows(gen, plain + [SamplingParams(temperature=0.0, presence_penalty=0.5)])
    rows = _spec().draft_rows(seqs, ctxs, K)
    assert draw_variant(rows.steps) == "top_k" and rows.steps.penalties and rows.penalized


@pytest.mark.parametrize("kernels", ["naive", "triton"])
def test_drawable_is_the_hosts_status_check(kernels):
    """`drawable` (a row's finite maximum) against the sample op's status definition on rows with a NaN, a +inf,
    both, every entry -inf, one finite entry among -inf, and plain ones."""
    from ninfer.fast.ops.sample.layout import OK
    from ninfer.fast.ops.sample.naive import status_naive
    from ninfer.fast.sampling.spec_steps import drawable

    inf, nan = float("inf"), float("nan")
    x = torch.randn(7, V, generator=torch.Generator().manual_seed(5))
    x[0, 3] = nan
    x[1, 60] = inf
    x[2, 0], x[2, 1] = inf, nan
    x[3] = -inf
    x[4] = -inf
    x[4, 17] = -1e30
    x[5, 9] = -inf
    x = x.to(_device(kernels))
    want = status_naive(x) == OK
    assert want.tolist() == [False, False, False, False, True, True, True]
    assert torch.equal(drawable(x), want)
