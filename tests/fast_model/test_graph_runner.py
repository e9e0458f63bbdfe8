"""The decode graph runner: static buffers filled per call, graphs keyed by exact B only (request identity and page
ids are data), capture that touches no live state. Two twin models on the same weights: one driven through the
runner, one by direct eager ``decode``; their logits must agree step after step while the batch composition and the
rows/slots change. On CPU the runner's eager path exercises the same buffers; on the GPU it replays CUDA graphs."""

from dataclasses import dataclass, field

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import build_pair, place_sequences, tiny_config
from ninfer.fast.graph_runner import DecodeGraphRunner, StaticInputs
from ninfer.fast.sampling import VARIANTS, DeviceSampler, SampleRow
from ninfer.sampling import SamplingParams, draw
from ninfer.testing.numerics import assert_close

I32 = dict(dtype=torch.int32, device=DEVICE)
KERNELS = "triton" if ON_GPU else "naive"


def _twins(dtype):
    cfg = tiny_config()
    return build_pair(cfg, dtype, KERNELS).fast, build_pair(cfg, dtype, KERNELS).fast


def _prefill_both(a, b, lengths):
    slots, rows = place_sequences(a, len(lengths))
    place_sequences(b, len(lengths))
    for i, n in enumerate(lengths):
        tokens = torch.arange(n, device=DEVICE) % a.cfg.vocab_size
        a.prefill(tokens, slots[i], rows[i], 0)
        b.prefill(tokens, slots[i], rows[i], 0)
    return slots, rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_runner_matches_eager_decode_as_batches_change(dtype):
    runner_model, eager = _twins(dtype)
    lengths = [3, 9, 6]
    slots, rows = _prefill_both(runner_model, eager, lengths)
    runner = DecodeGraphRunner(runner_model, max_batch=3, greedy=True)
    runner.capture()
    expected = [(B, None) for B in (1, 2, 3)] if ON_GPU else []  # no sampler: one graph per B
    assert runner.use_graphs == ON_GPU and sorted(runner.graphs) == expected
    pos = list(lengths)
    # batches of 3, then 2 (members 2 and 0, in that order), then 1, then 3 again: same graphs, new data
    for members in ([0, 1, 2], [2, 0], [1], [0, 1, 2]):
        toks = torch.tensor([(7 * m + pos[m]) % 64 for m in members], device=DEVICE)
        args = (toks, torch.tensor([slots[m] for m in members], **I32), torch.tensor([rows[m] for m in members], **I32),
                torch.tensor([pos[m] + 1 for m in members], **I32), torch.tensor([pos[m] for m in members], **I32))
        logits, greedy = runner.run(*args)
        ref = eager.decode(*args)
        # replay runs the eager step's kernels; the bf16 slack only allows for a different cuBLAS choice in capture
        assert_close(f"runner decode {members}", ref, logits, 1e-5 if dtype == torch.float32 else 1e-3)
        assert torch.equal(greedy, logits.argmax(-1))
        for m in members:
            pos[m] += 1


def test_capture_uses_only_the_dummy_slot_and_page():
    model, _ = _twins(torch.float32)
    slots, rows = place_sequences(model, 2)
    for i in range(2):
        model.prefill(torch.arange(4, device=DEVICE), slots[i], rows[i], 0)
    pools = model.pools
    live = [t.clone() for t in (pools.ssm[:, :-1], pools.conv[:, :-1], pools.k[:, :-1], pools.v[:, :-1])]
    runner = DecodeGraphRunner(model, max_batch=2, use_graphs=True)
    runner.capture()
    if not runner.use_graphs:
        # without CUDA capture is a no-op, so drive the dummy batch eagerly, as warm-up would
        runner.inputs.fill_dummy(2, model.plan.dummy_slot, model.plan.dummy_row)
        runner.body(2)
    after = (pools.ssm[:, :-1], pools.conv[:, :-1], pools.k[:, :-1], pools.v[:, :-1])
    assert all(torch.equal(x, y) for x, y in zip(live, after))
    assert not torch.equal(pools.ssm[:, -1], torch.zeros_like(pools.ssm[:, -1]))


def test_runner_rejects_bad_batches():
    model, _ = _twins(torch.float32)
    runner = DecodeGraphRunner(model, max_batch=2)
    z = torch.zeros(3, **I32)
    with pytest.raises(ValueError, match="max_batch"):
        runner.run(z.long(), z, z, z + 1, z)
    with pytest.raises(ValueError, match=r"\[B=2\]"):
        runner.run(z[:2].long(), z[:1], z[:2], z[:2] + 1, z[:2])
    with pytest.raises(ValueError, match="max_seqs"):
        DecodeGraphRunner(model, max_batch=model.plan.max_seqs + 1)


def test_static_inputs_fill_only_the_first_rows():
    s = StaticInputs.allocate(4, torch.device(DEVICE))
    s.context_lens.fill_(-5)
    B = s.fill(torch.tensor([3, 4]), torch.tensor([1, 0]), torch.tensor([2, 3]), torch.tensor([9, 8]),
               torch.tensor([8, 7]))
    assert B == 2
    assert s.context_lens.tolist() == [9, 8, -5, -5] and s.tokens[:2].tolist() == [3, 4]
    assert s.rope_positions[:2].tolist() == [8, 7]  # rotary positions default to the positions
    s.fill_lists(([1], [0], [0], [4], [3], [1]))
    assert s.positions[0] == 3 and s.rope_positions[0] == 1


def test_rotary_positions_are_a_row_of_the_inputs():
    """After a prompt with images a row rotates at position + rope_delta: the runner's sixth row (a text row's
    delta 0 is the five-row call), equal to eager decode with those rotary positions and to verify's single-token
    blocks with the same deltas; the delta changes the logits."""
    runner_model, eager = _twins(torch.float32)
    lengths = [5, 8]
    slots, rows = _prefill_both(runner_model, eager, lengths)
    runner = DecodeGraphRunner(runner_model, max_batch=2, greedy=True)
    runner.capture()
    deltas = [-3, 0]
    cols = ([4, 9], slots, rows, [n + 1 for n in lengths], lengths)
    logits, _ = runner.run_lists((*cols, [n + d for n, d in zip(lengths, deltas)]))
    args = [torch.tensor(c, **I32) for c in cols]
    want = eager.decode(*args, rope_positions=torch.tensor([n + d for n, d in zip(lengths, deltas)], **I32))
    assert_close("runner decode with rope deltas", want, logits, 1e-5)
    verify_model, plain = _twins(torch.float32)
    _prefill_both(verify_model, plain, lengths)
    got, _ = verify_model.verify(args[0].long(), slots, rows, lengths, [1, 1], rope_deltas=deltas)
    assert_close("verify with rope deltas", want, got, 1e-5)
    without = plain.decode(*args)
    assert_close("a text row is the five-row call", without[1:], want[1:], 1e-5)
    assert (without[0] - want[0]).abs().max() > 1e-3  # the delta is read


@dataclass
class History:
    prompt: tuple
    outputs: list = field(default_factory=list)


def test_runner_with_sampler_draws_inside_the_step():
    """With a DeviceSampler every (B, variant) graph ends in sampled tokens, and no graph keeps its logits. The
    tokens, fed back as the next inputs, equal the host sampler's draws from the twin's eager logits while the batch
    composition, the variant and the penalties' counts change."""
    runner_model, eager = _twins(torch.float32)
    lengths = [3, 9, 6]
    slots, rows = _prefill_both(runner_model, eager, lengths)
    V = runner_model.cfg.vocab_size
    sampler = DeviceSampler(V, 3, runner_model.plan.max_seqs, DEVICE, kernels=KERNELS, eos_token_ids=(0,))
    runner = DecodeGraphRunner(runner_model, max_batch=3, sampler=sampler)
    runner.capture()
    assert sorted(runner.graphs) == (sorted((B, v) for B in (1, 2, 3) for v in VARIANTS) if ON_GPU else [])
    assert len(runner.outputs) == (3 * len(VARIANTS) if ON_GPU else 0)
    assert all(out == () for out in runner.outputs.values())  # the graphs keep no logits alive
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5),
              SamplingParams(temperature=0.9, top_p=0.8, logprobs=2), SamplingParams(temperature=1.1, min_p=0.05)]
    hist = [History(tuple(t % V for t in range(n)), [n % V]) for n in lengths]
    pos = list(lengths)
    for members in ([0, 1, 2], [2, 0], [0], [1, 2], [0, 1, 2]):
        args = (torch.tensor([hist[m].outputs[-1] for m in members], device=DEVICE),
                torch.tensor([slots[m] for m in members], **I32), torch.tensor([rows[m] for m in members], **I32),
                torch.tensor([pos[m] + 1 for m in members], **I32), torch.tensor([pos[m] for m in members], **I32))
        draws = [SampleRow(params[m], 7 + m, pos[m] + 1, rows[m], ("seq", m), len(hist[m].outputs), hist[m])
                 for m in members]
        assert runner.run(*args, variant=sampler.prepare(draws)) is None
        got = sampler.collect()
        logits = eager.decode(*args).cpu()
        want = [draw(logits[i], r.params, r.seed, r.position, prompt=r.history.prompt, outputs=r.history.outputs,
                     eos_token_ids=(0,), mask=None) for i, r in enumerate(draws)]
        assert [g[0] for g in got] == [w[0] for w in want], members
        for g, w in zip(got, want):
            assert (g[1] is None) == (w[1] is None)
            if w[1] is not None:
                assert g[1][0] == pytest.approx(w[1][0], abs=1e-4)
                assert [t for t, _ in g[1][1]] == [t for t, _ in w[1][1]]
                assert [v for _, v in g[1][1]] == pytest.approx([v for _, v in w[1][1]], abs=1e-4)
        sampler.record([(rows[m], ("seq", m), [g[0]]) for m, g in zip(members, got)])
        for m, g in zip(members, got):
            hist[m].outputs.append(g[0])
            pos[m] += 1


@pytest.mark.skipif(not ON_GPU, reason="PDL is a CUDA launch attribute: the CPU launches nothing with it")
def test_pdl_changes_no_result(monkeypatch):
    """The decode graphs captured with programmatic dependent launch (`ninfer.fast.ops.pdl`, on by default) and
    without it give the same logits bit for bit, step after step: PDL only lets a kernel be placed early, every
    kernel still waits for the one before."""
    from ninfer.fast.ops import pdl

    on, off = _twins(torch.bfloat16)
    lengths = [5, 2]
    slots, rows = _prefill_both(on, off, lengths)
    runners = {}
    for flag, model in ((True, on), (False, off)):
        monkeypatch.setattr(pdl, "ENABLED", flag)
        runners[flag] = DecodeGraphRunner(model, max_batch=2, greedy=True)
        runners[flag].capture()
    pos = list(lengths)
    for step in range(4):
        args = (torch.tensor([(3 * step + p) % 64 for p in pos], device=DEVICE), torch.tensor(slots, **I32),
                torch.tensor(rows, **I32), torch.tensor([p + 1 for p in pos], **I32), torch.tensor(pos, **I32))
        got = {flag: runners[flag].run(*args)[0].clone() for flag in (True, False)}
        assert torch.equal(got[True], got[False]), f"step {step}: PDL changed the logits"
        pos = [p + 1 for p in pos]
