"""gdn_decode kernels vs the naive step: state slots addressed through slot_ids, GVA head grouping, odd head dims,
dv split over several programs (the last one to arrive finishing the gated norm), several consecutive steps (the
arrival counters must come back to zero), padding rows (slot -1) that must not touch any state, and the two
kernels run separately."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.gdn_decode import gdn_conv_update, gdn_decode, gdn_decode_naive, gdn_recurrent_update
from ninfer.testing.numerics import assert_close

# (B, HK, HV, dk, dv, slots): the GPU checks Qwen3.5-9B dims (HK=16, HV=32, dk=dv=128) and 27B's HV=48
SHAPES = ([(1, 16, 32, 128, 128, 4), (8, 16, 32, 128, 128, 12), (3, 16, 48, 128, 128, 5)] if ON_GPU
          else [(3, 2, 6, 24, 20, 5), (1, 1, 1, 16, 16, 2), (2, 2, 6, 24, 72, 4)])
K = 4


def _inputs(B, HK, HV, dk, dv, slots, dtype):
    C = 2 * HK * dk + HV * dv
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device=DEVICE)).to(dtype)  # noqa: E731
    weights = dict(conv_weight=mk(C, 1, K, scale=0.5), A_log=torch.randn(HV, device=DEVICE).clamp(-2, 1),
                   dt_bias=torch.randn(HV, device=DEVICE), norm_weight=mk(dv, scale=0.2) + 1)
    conv_state = mk(slots, C, K - 1)
    ssm_state = 0.1 * torch.randn(slots, HV, dk, dv, device=DEVICE)
    step = lambda: dict(mixed=mk(B, C), z=mk(B, HV * dv), a=mk(B, HV), b=mk(B, HV))  # noqa: E731
    return weights, conv_state, ssm_state, step


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("B,HK,HV,dk,dv,slots", SHAPES)
def test_gdn_decode_steps(B, HK, HV, dk, dv, slots, dtype):
    weights, conv_state, ssm_state, step = _inputs(B, HK, HV, dk, dv, slots, dtype)
    # distinct slots in a scrambled order; the unused slots must come back untouched
    slot_ids = torch.randperm(slots, device=DEVICE)[:B].to(torch.int32)
    conv_ref, ssm_ref = conv_state.clone(), ssm_state.clone()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for t in range(3):
        x = step()
        y_ref = gdn_decode_naive(**x, **weights, conv_state=conv_ref, ssm_state=ssm_ref, slot_ids=slot_ids,
                                 num_k_heads=HK, head_k_dim=dk, head_v_dim=dv)
        y = gdn_decode(**x, **weights, conv_state=conv_state, ssm_state=ssm_state, slot_ids=slot_ids,
                       num_k_heads=HK, head_k_dim=dk, head_v_dim=dv)
        assert_close(f"gdn_decode.y[step {t}]", y_ref, y, tol)
    assert_close("gdn_decode.ssm_state", ssm_ref, ssm_state, tol)
    assert_close("gdn_decode.conv_state", conv_ref, conv_state, tol)


def test_gdn_decode_padding_rows_write_no_state():
    B, HK, HV, dk, dv, slots = (4, 2, 4, 16, 12, 3)
    weights, conv_state, ssm_state, step = _inputs(B, HK, HV, dk, dv, slots, torch.float32)
    slot_ids = torch.tensor([2, -1, 0, -1], dtype=torch.int32, device=DEVICE)
    conv_ref, ssm_ref = conv_state.clone(), ssm_state.clone()
    x = step()
    y_ref = gdn_decode_naive(**x, **weights, conv_state=conv_ref, ssm_state=ssm_ref, slot_ids=slot_ids,
                             num_k_heads=HK, head_k_dim=dk, head_v_dim=dv)
    before = ssm_state[1].clone()
    y = gdn_decode(**x, **weights, conv_state=conv_state, ssm_state=ssm_state, slot_ids=slot_ids,
                   num_k_heads=HK, head_k_dim=dk, head_v_dim=dv)
    assert_close("gdn_decode.y", y_ref, y, 1e-5)
    assert torch.equal(ssm_state[1], before)
    assert_close("gdn_decode.ssm_state", ssm_ref, ssm_state, 1e-5)
    assert_close("gdn_decode.conv_state", conv_ref, conv_state, 1e-5)


def test_gdn_conv_update_then_recurrent_update():
    # the two halves exposed separately (conv kernel, then the recurrence on post-conv qkv) equal the fused step
    B, HK, HV, dk, dv, slots = (2, 2, 6, 24, 72, 4) if not ON_GPU else (8, 16, 32, 128, 128, 12)
    weights, conv_state, ssm_state, step = _inputs(B, HK, HV, dk, dv, slots, torch.float32)
    slot_ids = torch.tensor([3, 1] + list(range(4, B + 2)), dtype=torch.int32, device=DEVICE)[:B]
    conv_ref, ssm_ref = conv_state.clone(), ssm_state.clone()
    x = step()
    y_ref = gdn_decode_naive(**x, **weights, conv_state=conv_ref, ssm_state=ssm_ref, slot_ids=slot_ids,
                             num_k_heads=HK, head_k_dim=dk, head_v_dim=dv)
    qkv = gdn_conv_update(x["mixed"], conv_state, weights["conv_weight"], slot_ids)
    y = gdn_recurrent_update(qkv, x["z"], x["a"], x["b"], weights["A_log"], weights["dt_bias"],
                             weights["norm_weight"], ssm_state, slot_ids, HK, dk, dv)
    tol = 1e-5
    assert_close("gdn_recurrent_update.y", y_ref, y, tol)
    assert_close("gdn_recurrent_update.ssm_state", ssm_ref, ssm_state, tol)
    assert_close("gdn_conv_update.conv_state", conv_ref, conv_state, tol)


def _step_apart(x, weights, conv_state, ssm_state, ins, outs, HK, dk, dv):
    """The out-slot contract written out: each row steps a private copy of its read slot (zeros for a negative id)
    in place, and the result goes to its out slot (nowhere for a negative id)."""
    ys = []
    for i, (s, o) in enumerate(zip(ins.tolist(), outs.tolist())):
        conv = conv_state[s:s + 1].clone() if s >= 0 else torch.zeros_like(conv_state[:1])
        ssm = ssm_state[s:s + 1].clone() if s >= 0 else torch.zeros_like(ssm_state[:1])
        row = {k: v[i:i + 1] for k, v in x.items()}
        ys.append(gdn_decode_naive(**row, **weights, conv_state=conv, ssm_state=ssm,
                                   slot_ids=torch.zeros(1, dtype=torch.int32, device=DEVICE), num_k_heads=HK,
                                   head_k_dim=dk, head_v_dim=dv))
        if o >= 0:
            conv_state[o], ssm_state[o] = conv[0], ssm[0]
    return torch.cat(ys)


@pytest.mark.parametrize("impl", ["naive", "triton"])
@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
def test_gdn_decode_into_out_slots(impl, dtype):
    """The verify pass's form: step t of a row reads the slot step t - 1 wrote and writes its own, so every block
    position's state is kept. Three chained steps of four rows (one reading a zero state, one writing nowhere, one
    padding row) equal the contract written out with in-place steps; every other slot stays as it was."""
    B, HK, HV, dk, dv = (4, 16, 32, 128, 128) if ON_GPU else (4, 2, 6, 24, 20)
    slots = 4 * B
    weights, conv_state, ssm_state, step = _inputs(B, HK, HV, dk, dv, slots, dtype)
    conv_ref, ssm_ref = conv_state.clone(), ssm_state.clone()
    run = gdn_decode_naive if impl == "naive" else gdn_decode
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    i32 = dict(dtype=torch.int32, device=DEVICE)
    ins = torch.tensor([0, -1, 2, -1], **i32)  # row 1 starts from zeros, row 3 pads
    for t in range(3):
        outs = torch.tensor([B + t * B, B + t * B + 1, -1, -1], **i32)  # row 2 keeps nothing
        x = step()
        y_ref = _step_apart(x, weights, conv_ref, ssm_ref, ins, outs, HK, dk, dv)
        y = run(**x, **weights, conv_state=conv_state, ssm_state=ssm_state, slot_ids=ins, num_k_heads=HK,
                head_k_dim=dk, head_v_dim=dv, out_slot_ids=outs)
        assert_close(f"gdn_decode.y[step {t}]", y_ref, y, tol)
        ins = torch.where(outs >= 0, outs, ins)
    assert_close("gdn_decode.ssm_state", ssm_ref, ssm_state, tol)
    assert_close("gdn_decode.conv_state", conv_ref, conv_state, tol)


@pytest.mark.parametrize("impl", ["naive", "triton"])
@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
def test_gdn_decode_at_packed_rows(impl, dtype):
    """``rows``: sequence i reads row rows[i] of the packed inputs and writes its y into that row of ``out`` (the
    verify pass's token rows, no gather or scatter); equal to the step over the gathered rows, every other row of
    ``out`` untouched (a sentinel), the states as in place."""
    N, B, HK, HV, dk, dv = (13, 4, 16, 32, 128, 128) if ON_GPU else (7, 3, 2, 6, 24, 20)
    slots = B + 2
    weights, conv_state, ssm_state, step = _inputs(N, HK, HV, dk, dv, slots, dtype)
    conv_ref, ssm_ref = conv_state.clone(), ssm_state.clone()
    rows = torch.tensor([N - 1, 2, 0, 5][:B], dtype=torch.int32, device=DEVICE)
    slot_ids = torch.tensor([1, -1, 3, 0][:B], dtype=torch.int32, device=DEVICE)  # one padding row
    x = step()
    at = rows.long()
    y_ref = gdn_decode_naive(**{n: t[at] for n, t in x.items()}, **weights, conv_state=conv_ref, ssm_state=ssm_ref,
                             slot_ids=slot_ids, num_k_heads=HK, head_k_dim=dk, head_v_dim=dv)
    run = gdn_decode_naive if impl == "naive" else gdn_decode
    out = torch.full((N, HV * dv), 7.0, device=DEVICE, dtype=dtype)
    got = run(**x, **weights, conv_state=conv_state, ssm_state=ssm_state, slot_ids=slot_ids, num_k_heads=HK,
              head_k_dim=dk, head_v_dim=dv, rows=rows, out=out)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert got is out
    assert_close("gdn_decode.y[rows]", y_ref, out[at], tol)
    others = torch.ones(N, dtype=torch.bool, device=DEVICE)
    others[at] = False
    assert bool((out[others] == 7.0).all())
    assert_close("gdn_decode.ssm_state", ssm_ref, ssm_state, tol)
    assert_close("gdn_decode.conv_state", conv_ref, conv_state, tol)
