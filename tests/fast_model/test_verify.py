"""FastModel.verify (multi-query decode, the speculative target pass) against the reference model: B blocks of
different lengths at different frontiers, packed along T, at scrambled slots, rows and pages; the logits of every
block position equal the reference's step recurrence over the same tokens, and a decode step afterwards shows the
advanced GDN state and K/V. Tolerances as in test_model.py (CPU fp32: the Triton interpreter). The Triton table
runs the GDN recurrence per block position (``gdn_decode``) or over whole blocks (``gdn_verify``, the default,
``kernels.GDN_BLOCK_VERIFY``)."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import F, L, build_pair, place_sequences, tiny_config
from ninfer.fast.model import kernels as kernel_table
from ninfer.testing.numerics import assert_close

FP32_TOL = 1e-2 if ON_GPU else 1e-4
BF16 = "triton" if ON_GPU else "naive"  # the interpreter's bf16 tl.dot is wrong
# (moe, dtype, kernels, tol); MoE routes to all 8 experts (a top-k near-tie is a discontinuity, not an error)
CASES = [pytest.param(False, torch.float32, "triton", FP32_TOL, id="dense-fp32-triton"),
         pytest.param(False, torch.bfloat16, BF16, 2e-2, id="dense-bf16"),
         pytest.param(True, torch.bfloat16, BF16, 2e-2, id="moe-bf16"),
         pytest.param(False, torch.float32, "triton-blocks", FP32_TOL, id="dense-fp32-triton-blocks")]
I32 = dict(dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("moe,dtype,kernels,tol", CASES)
def test_verify_blocks_match_the_reference_step_recurrence(moe, dtype, kernels, tol, monkeypatch):
    monkeypatch.setattr(kernel_table, "GDN_BLOCK_VERIFY", kernels == "triton-blocks")
    pair = build_pair(tiny_config(moe=moe, top_k=8), dtype, kernels.removesuffix("-blocks"))
    gen = torch.Generator().manual_seed(5)
    prompts, lens = (7, 13, 4), (3, 1, 5)  # the middle block is a plain one-token step
    slots, rows = place_sequences(pair.fast, len(prompts))
    states = []
    for slot, row, n in zip(slots, rows, prompts):
        tokens = torch.randint(0, pair.cfg.vocab_size, (n,), generator=gen)
        pair.fast.prefill(tokens.to(DEVICE), slot, row, 0)
        st = pair.ref.new_state()
        pair.ref.prefill(tokens, st)
        states.append(st)
    blocks = [torch.randint(0, pair.cfg.vocab_size, (n,), generator=gen) for n in lens]
    logits, hidden = pair.fast.verify(torch.cat(blocks).to(DEVICE), slots, rows, list(prompts), list(lens))
    assert logits.shape == (sum(lens), pair.cfg.vocab_size) and hidden.shape == (sum(lens), pair.cfg.hidden_size)
    ref = torch.cat([pair.ref.prefill(b, st, chunked=False) for b, st in zip(blocks, states)])
    assert_close("verify logits", ref, logits, tol)
    # one more decode step of every sequence reads the state and K/V the blocks left
    toks = torch.randint(0, pair.cfg.vocab_size, (len(prompts),), generator=gen)
    pos = torch.tensor([p + n for p, n in zip(prompts, lens)], dtype=torch.int32)
    out = pair.fast.decode(toks.to(DEVICE), torch.tensor(slots, **I32), torch.tensor(rows, **I32),
                           (pos + 1).to(DEVICE), pos.to(DEVICE))
    ref = torch.stack([pair.ref.decode_step(int(t), st) for t, st in zip(toks, states)])
    assert_close("decode after verify", ref, out, tol)


@pytest.mark.parametrize("blocks", [False, True], ids=["per-position", "whole-blocks"])
def test_verify_keeps_every_block_positions_state(blocks, monkeypatch):
    """With ``keep_steps`` (a speculative round's verify) the state after block position j < len - 1 (every GDN
    layer's conv window and S) lands in the row's step slot j and the state after the last in the row's slot, each
    equal to the reference's after the block's first j + 1 tokens; no other slot changes (the slots keep nothing of
    a one-token block). The MTP head plans the step slots; an attention layer sits between the GDN layers, so
    their later states read the block's attention too. On CPU the Triton kernels run in the interpreter."""
    monkeypatch.setattr(kernel_table, "GDN_BLOCK_VERIFY", blocks)
    pair = build_pair(tiny_config(layers=(L, F, L, L), mtp=1), torch.float32, "triton", verify_width=5)
    fast, gen = pair.fast, torch.Generator().manual_seed(6)
    prompts, lens = (7, 13, 4), (3, 1, 5)
    slots, rows = place_sequences(fast, len(prompts))
    states = []
    for slot, row, n in zip(slots, rows, prompts):
        tokens = torch.randint(0, pair.cfg.vocab_size, (n,), generator=gen)
        fast.prefill(tokens.to(DEVICE), slot, row, 0)
        states.append(pair.ref.new_state())
        pair.ref.prefill(tokens, states[-1])
    before = [t.clone() for t in (fast.pools.conv, fast.pools.ssm)]
    blocks = [torch.randint(0, pair.cfg.vocab_size, (n,), generator=gen) for n in lens]
    fast.verify(torch.cat(blocks).to(DEVICE), slots, rows, list(prompts), list(lens), keep_steps=True)
    written = set()
    for slot, row, block, st in zip(slots, rows, blocks, states):
        for j, token in enumerate(block):
            pair.ref.prefill(token[None], st, chunked=False)
            at = slot if j == len(block) - 1 else fast.plan.step_slot(row, j)
            written.add(at)
            for layer in pair.cfg.linear_layers:
                li = fast._pool_index[layer][1]
                assert_close(f"slot {at} conv {layer}", st.gdn[layer].conv, fast.pools.conv[li, at], FP32_TOL)
                assert_close(f"slot {at} S {layer}", st.gdn[layer].recurrent, fast.pools.ssm[li, at], FP32_TOL)
    others = [s for s in range(fast.plan.state_slots) if s not in written]
    assert len(written) == sum(lens) and all(torch.equal(b[:, others], a[:, others])
                                              for b, a in zip(before, (fast.pools.conv, fast.pools.ssm)))


def test_verify_rejects_bad_blocks():
    pair = build_pair(tiny_config(), torch.float32, "naive")
    with pytest.raises(ValueError, match="blocks"):
        pair.fast.verify(torch.zeros(3, dtype=torch.long, device=DEVICE), [0], [0], [4], [2])
    with pytest.raises(ValueError, match="planned context"):
        pair.fast.verify(torch.zeros(2, dtype=torch.long, device=DEVICE), [0], [0], [pair.fast.plan.max_context - 1],
                         [2])
