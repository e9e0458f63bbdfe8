"""gdn_verify (the verify pass's GDN recurrence over whole blocks, one launch) against the naive per-step path:
blocks of different lengths packed back to back, each step leaving its state in a slot of its own (kept steps) or
all in place, a padding block (slot -1) that touches no state, rows outside every block left as they were, and
the sm_90 build."""

from pathlib import Path

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.gdn_verify import gdn_verify, gdn_verify_naive
from ninfer.testing.numerics import assert_close
from ninfer.testing.sm90 import run_build_script

K = 4
# (HK, HV, dk, dv): the GPU checks Qwen3.5-9B's GDN heads; the CPU odd sizes (dv split over programs, GVA groups)
HEADS = [(16, 32, 128, 128)] if ON_GPU else [(2, 6, 24, 72), (1, 2, 16, 16)]


def _inputs(HK, HV, dk, dv, slots, N, dtype):
    C = 2 * HK * dk + HV * dv
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device=DEVICE)).to(dtype)  # noqa: E731
    weights = dict(conv_weight=mk(C, 1, K, scale=0.5), A_log=torch.randn(HV, device=DEVICE).clamp(-2, 1),
                   dt_bias=torch.randn(HV, device=DEVICE), norm_weight=mk(dv, scale=0.2) + 1)
    state = dict(conv_state=mk(slots, C, K - 1), ssm_state=0.1 * torch.randn(slots, HV, dk, dv, device=DEVICE))
    rows = dict(mixed=mk(N, C), z=mk(N, HV * dv), a=mk(N, HV), b=mk(N, HV))
    return weights, state, rows


def _blocks(lens, slots, keep, width):
    """cu, each block's slot and the [width, B] out slots: step slots 8.. (kept steps, the last step in the block's
    slot) or the block's slot throughout (in place); -1 past a block's length."""
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device=DEVICE)
    outs = torch.full((width, len(lens)), -1, dtype=torch.int32)
    for i, (s, n) in enumerate(zip(slots, lens)):
        for j in range(n):
            outs[j, i] = s if not keep or j == n - 1 or s < 0 else 8 + i * width + j
    if any(s < 0 for s in slots):  # a padding block leaves no state
        outs[:, [i for i, s in enumerate(slots) if s < 0]] = -1
    return cu, torch.tensor(slots, dtype=torch.int32, device=DEVICE), outs.to(DEVICE)


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("keep", [True, False], ids=["kept-steps", "in-place"])
def test_gdn_verify_equals_the_per_step_path(dtype, heads, keep):
    lens, slots, width = [4, 1, 3], [5, 2, 0], 4
    N = sum(lens) + 2  # two rows outside every block (a graph's padding rows) must keep their values
    weights, state, rows = _inputs(*heads, 8 + len(lens) * width, N, dtype)
    cu, slot_ids, outs = _blocks(lens, slots, keep, width)
    ref_state = {k: v.clone() for k, v in state.items()}
    HV, dv = heads[1], heads[3]
    ref = gdn_verify_naive(**rows, **weights, **ref_state, slot_ids=slot_ids, cu=cu, out_slots=outs,
                           num_k_heads=heads[0], head_k_dim=heads[2], head_v_dim=dv,
                           out=torch.full((N, HV * dv), 7.0, device=DEVICE, dtype=dtype))
    got = gdn_verify(**rows, **weights, **state, slot_ids=slot_ids, cu=cu, out_slots=outs, num_k_heads=heads[0],
                     head_k_dim=heads[2], head_v_dim=dv, out=torch.full((N, HV * dv), float("nan"), device=DEVICE,
                                                                        dtype=dtype))
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.isnan(got[-2:]).all()  # rows of no block untouched
    assert_close("gdn_verify.y", ref[:-2], got[:-2], tol)
    assert_close("gdn_verify.ssm_state", ref_state["ssm_state"], state["ssm_state"], tol)
    assert_close("gdn_verify.conv_state", ref_state["conv_state"], state["conv_state"], tol)


def test_a_padding_block_touches_no_state():
    heads, lens, width = HEADS[-1], [2, 3], 3
    weights, state, rows = _inputs(*heads, 8 + 2 * width, sum(lens), torch.float32)
    cu, slot_ids, outs = _blocks(lens, [1, -1], True, width)
    ref_state = {k: v.clone() for k, v in state.items()}
    before = {k: v.clone() for k, v in state.items()}
    ref = gdn_verify_naive(**rows, **weights, **ref_state, slot_ids=slot_ids, cu=cu, out_slots=outs,
                           num_k_heads=heads[0], head_k_dim=heads[2], head_v_dim=heads[3])
    got = gdn_verify(**rows, **weights, **state, slot_ids=slot_ids, cu=cu, out_slots=outs, num_k_heads=heads[0],
                     head_k_dim=heads[2], head_v_dim=heads[3])
    assert_close("gdn_verify.y", ref[:2], got[:2], 1e-5)  # the padding block's rows are unspecified
    for k in state:  # only block 0's slot and step slots moved
        moved = (state[k] != before[k]).flatten(1).any(1).nonzero().flatten().tolist()
        assert set(moved) <= {1, 8, 9}, (k, moved)
        assert_close(f"gdn_verify.{k}", ref_state[k], state[k], 1e-5)


def test_sm90_build():
    # Hopper's compile on the CPU (Triton's ptxas, a subprocess without the interpreter): the kernel builds at the
    # 9B GDN heads for an MTP block (4) and a DFlash block (16) without spills
    rows = run_build_script(Path(__file__).with_name("_sm90_gdn_verify.py"), ["bf16:4", "bf16:16", "fp32:4"])
    assert len(rows) == 3
    for r in rows:
        assert r["spill"] == 0 and r["per_sm"] >= 2, r
