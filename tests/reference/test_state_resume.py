"""Explicit state: chunked vs step forms, resume from clones, arbitrary prefill splits, chunk-boundary checkpoints."""

from __future__ import annotations

import pytest
import torch

from ninfer.reference.state import SequenceState

EXACT = 1e-11  # fp64: the forms differ only by summation order


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def _assert_states_equal(a: SequenceState, b: SequenceState, tol: float = EXACT) -> None:
    assert a.next_position == b.next_position
    assert a.gdn.keys() == b.gdn.keys() and a.kv.keys() == b.kv.keys()
    for i in a.gdn:
        assert _max_diff(a.gdn[i].conv, b.gdn[i].conv) < tol, f"GDN layer {i} conv window"
        assert _max_diff(a.gdn[i].recurrent, b.gdn[i].recurrent) < tol, f"GDN layer {i} recurrent state"
    for i in a.kv:
        assert a.kv[i].length == b.kv[i].length
        assert _max_diff(a.kv[i].k, b.kv[i].k) < tol and _max_diff(a.kv[i].v, b.kv[i].v) < tol, f"KV layer {i}"


def test_chunked_and_step_prefill_agree(model64, make_tokens):
    toks = make_tokens(150)
    sc, ss = model64.new_state(), model64.new_state()
    lc = model64.prefill(toks, sc, chunked=True)
    ls = model64.prefill(toks, ss, chunked=False)
    assert _max_diff(lc, ls) < EXACT
    _assert_states_equal(sc, ss)


def test_decode_steps_equal_prefill_positions(model64, make_tokens):
    toks = make_tokens(20, seed=1)
    full = model64.prefill(toks, model64.new_state())
    state = model64.new_state()
    model64.prefill(toks[:12], state)
    steps = torch.stack([model64.decode_step(t, state) for t in toks[12:]])
    assert _max_diff(steps, full[12:]) < EXACT
    assert state.next_position == 20


@pytest.mark.parametrize("t", [1, 3, 64, 70, 129])
def test_resume_from_clone_equals_straight_run(dense64, t, make_tokens):
    toks = make_tokens(140, seed=2)
    straight = dense64.prefill(toks, dense64.new_state())
    state = dense64.new_state()
    dense64.prefill(toks[:t], state)
    checkpoint = state.clone()
    # Advancing the original must not disturb the checkpoint.
    dense64.prefill(make_tokens(9, seed=99), state)
    resumed = dense64.prefill(toks[t:], checkpoint)
    assert _max_diff(resumed, straight[t:]) < EXACT
    assert checkpoint.next_position == 140


@pytest.mark.parametrize("sizes", [[37, 64, 5, 44], [1, 1, 148], [64, 64, 22], [100, 50]])
def test_split_prefill_equals_one_prefill(model64, sizes, make_tokens):
    toks = make_tokens(150, seed=3)
    one_state = model64.new_state()
    one = model64.prefill(toks, one_state)
    state, parts, s = model64.new_state(), [], 0
    for n in sizes:
        parts.append(model64.prefill(toks[s:s + n], state))
        s += n
    assert _max_diff(torch.cat(parts), one) < EXACT
    _assert_states_equal(state, one_state)


def test_chunk_boundary_checkpoints_equal_step_states(model64, make_tokens):
    toks = make_tokens(150, seed=4)
    state = model64.new_state()
    model64.prefill(toks[:10], state)  # a non-empty start: boundaries are relative to the prefill start
    checkpoints: list[SequenceState] = []
    logits = model64.prefill(toks[10:], state, checkpoints=checkpoints)
    assert [c.next_position for c in checkpoints] == [74, 138]
    for cp in checkpoints:
        step = model64.new_state()
        model64.prefill(toks[:cp.next_position], step, chunked=False)
        _assert_states_equal(cp, step)
        assert _max_diff(cp.last_hidden, step.last_hidden) < EXACT
        resumed = model64.prefill(toks[cp.next_position:], cp.clone())
        assert _max_diff(resumed, logits[cp.next_position - 10:]) < EXACT


def test_fp32_mode_keeps_fp32_state(dense64, make_tokens):
    from ninfer.reference.model import ReferenceModel

    m32 = ReferenceModel(dense64.cfg, dense64.weights, dtype=torch.float32)
    state = m32.new_state()
    logits = m32.prefill(make_tokens(70, seed=5), state)
    assert logits.dtype == torch.float32
    assert all(s.recurrent.dtype == torch.float32 for s in state.gdn.values())
    ref = dense64.prefill(make_tokens(70, seed=5), dense64.new_state())
    # Unit-scale random weights amplify fp32 rounding about a hundredfold over 4 layers (measured ~2e-5).
    assert float((logits.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()) < 1e-4


def test_bf16_activations_keep_an_fp32_recurrent_state(dense64, make_tokens):
    from ninfer.reference.model import ReferenceModel

    m16 = ReferenceModel(dense64.cfg, dense64.weights, dtype=torch.bfloat16)
    state = m16.new_state()
    logits = m16.prefill(make_tokens(70, seed=6), state)
    m16.decode_step(5, state)
    assert logits.dtype == torch.bfloat16 and bool(torch.isfinite(logits).all())
    assert all(s.recurrent.dtype == torch.float32 for s in state.gdn.values())
    assert all(c.k.dtype == torch.bfloat16 for c in state.kv.values())
