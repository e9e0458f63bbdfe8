"""The fast model against the reference model on the same weights: prefill (one call, continued, in pieces) and
B=3 decode steps of sequences of different lengths at scrambled slots, rows and pages of the shared pools.

On CPU the Triton kernels run through the interpreter in fp32 (tolerance 1e-4); bf16 runs the ops' naive kernels,
because the interpreter's bf16 ``tl.dot`` is wrong. On the GPU both dtypes run the Triton kernels; fp32 there is
looser (1e-2, the chunked-GDN op's own GPU bound is 5e-3) because the attention and chunked-GDN kernels run fp32
``tl.dot`` as TF32. Dropping one layer moves the logits by 20-40% (see ``tiny_weights``).
"""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import F, L, build_pair, place_sequences, tiny_config
from ninfer.testing.numerics import assert_close

FP32_TOL = 1e-2 if ON_GPU else 1e-4
BF16_TOL = 2e-2
MODES = [pytest.param(torch.float32, "triton", FP32_TOL, id="fp32-triton"),
         pytest.param(torch.float32, "triton-fused", FP32_TOL, id="fp32-triton-fused"),
         pytest.param(torch.bfloat16, "triton" if ON_GPU else "naive", BF16_TOL, id="bf16")]
I32 = dict(dtype=torch.int32, device=DEVICE)


def _prefill_pair(pair, slot, row, tokens, splits, states):
    """Prefill one sequence in the fast model (in ``splits`` consecutive calls) and in the reference; compare the
    last token's logits after every call."""
    st = pair.ref.new_state()
    start = 0
    for n in splits:
        chunk = tokens[start:start + n]
        out = pair.fast.prefill(chunk.to(DEVICE), slot, row, start)
        ref = pair.ref.prefill(chunk, st)[-1]
        yield out, ref, f"prefill[{start}:{start + n}]"
        start += n
    states.append(st)


def _decode_steps(pair, slots, rows, states, steps, gen):
    """``steps`` decode rounds over all sequences; yields (fast logits [B, V], reference [B, V], name)."""
    V = pair.cfg.vocab_size
    for t in range(steps):
        toks = torch.randint(0, V, (len(states),), generator=gen)
        pos = torch.tensor([s.next_position for s in states], dtype=torch.int32)
        out = pair.fast.decode(toks.to(DEVICE), torch.tensor(slots, **I32), torch.tensor(rows, **I32),
                               (pos + 1).to(DEVICE), pos.to(DEVICE))
        ref = torch.stack([pair.ref.decode_step(int(toks[b]), states[b]) for b in range(len(states))])
        yield out, ref, f"decode step {t}"


def _run_scenario(pair, prompt_splits, steps, tol):
    gen = torch.Generator().manual_seed(11)
    slots, rows = place_sequences(pair.fast, len(prompt_splits))
    states = []
    for b, splits in enumerate(prompt_splits):
        tokens = torch.randint(0, pair.cfg.vocab_size, (sum(splits),), generator=gen)
        for out, ref, name in _prefill_pair(pair, slots[b], rows[b], tokens, splits, states):
            assert_close(f"seq {b} {name}", ref, out, tol)
    for out, ref, name in _decode_steps(pair, slots, rows, states, steps, gen):
        assert_close(name, ref, out, tol)


@pytest.mark.parametrize("dtype,kernels,tol", MODES)
def test_dense_prefill_and_decode_match_reference(dtype, kernels, tol):
    pair = build_pair(tiny_config(), dtype, kernels)
    # three lengths; the third is prefilled in two calls (a continuation at start_pos 4)
    splits = [(2,), (5,), (4, 3)] if kernels.startswith("triton") and not ON_GPU else [(9,), (70,), (40, 30)]
    _run_scenario(pair, splits, steps=2 if not ON_GPU else 4, tol=tol)


@pytest.mark.parametrize("dtype,kernels,tol", MODES)
def test_moe_prefill_and_decode_match_reference(dtype, kernels, tol):
    # top-k is discontinuous: a near-tie between the k-th and (k+1)-th expert that rounding resolves differently
    # from the fp32 oracle is not an error, yet cost up to 9% relative RMS in bf16 decode steps. So only the tight
    # comparison (fp32 on CPU) routes top-2 of 8; the others route to all 8 (the block is then continuous) and
    # leave top-k selection to this test and tests/ops/test_moe.py.
    top_k = 2 if tol <= 1e-4 else 8
    pair = build_pair(tiny_config(moe=True, layers=(L, F), top_k=top_k), dtype, kernels)
    # a one-token piece last: one row, where the default table's MoE block is moe_decode adding itself to the
    # stream in place (its decode steps run three rows)
    splits = [(3,), (6,), (2, 1)] if kernels.startswith("triton") and not ON_GPU else [(9,), (70,), (40, 29, 1)]
    _run_scenario(pair, splits, steps=2 if not ON_GPU else 4, tol=tol)


def test_prefill_in_pieces_with_all_logits_matches_reference():
    """A 150-token prompt in 64-token pieces (max_prefill_tokens 100 rounds down to one GDN chunk), every token's
    logits; naive kernels on CPU keep it quick, the GPU runs Triton."""
    kernels = "triton" if ON_GPU else "naive"
    pair = build_pair(tiny_config(), torch.float32, kernels, max_context=160, max_prefill_tokens=100)
    slots, rows = place_sequences(pair.fast, 1)
    tokens = torch.randint(0, pair.cfg.vocab_size, (150,))
    out = pair.fast.prefill(tokens.to(DEVICE), slots[0], rows[0], 0, all_logits=True)
    ref = pair.ref.prefill(tokens, pair.ref.new_state())
    assert out.shape == ref.shape
    assert_close("prefill all logits", ref, out, FP32_TOL)


def test_decode_leaves_other_slots_and_pages_alone():
    """Decoding two of three placed sequences changes neither the third one's GDN slot nor its pages."""
    pair = build_pair(tiny_config(), torch.float32, "naive")
    slots, rows = place_sequences(pair.fast, 3)
    for b in range(3):
        pair.fast.prefill(torch.arange(1, 6, device=DEVICE), slots[b], rows[b], 0)
    pools = pair.fast.pools
    conv, ssm, k = pools.conv[:, slots[2]].clone(), pools.ssm[:, slots[2]].clone(), pools.k.clone()
    pair.fast.decode(torch.tensor([1, 2], device=DEVICE), torch.tensor(slots[:2], **I32),
                     torch.tensor(rows[:2], **I32), torch.tensor([6, 6], **I32), torch.tensor([5, 5], **I32))
    assert torch.equal(pools.conv[:, slots[2]], conv) and torch.equal(pools.ssm[:, slots[2]], ssm)
    assert not torch.equal(pools.ssm[:, slots[0]], ssm)
    # exactly the two new tokens' K rows (one per sequence, in the one attention layer) changed
    changed = (pools.k != k).any(-1).any(-1).sum().item()
    assert changed == 2


def test_prefill_rejects_positions_past_the_planned_context():
    pair = build_pair(tiny_config(), torch.float32, "naive", max_context=16)
    with pytest.raises(ValueError, match="planned context"):
        pair.fast.prefill(torch.zeros(10, dtype=torch.long, device=DEVICE), 0, 0, 8)
