"""Programmatic dependent launch (`ninfer.fast.ops.pdl`): every decode kernel that takes it waits for the kernel
before it before touching global memory, in its sm_90 build at 9B shapes (the GPU runs of the ops' tests launch
them with PDL, as the decode graphs do); the builds also show no spills."""

from pathlib import Path

import torch

from ninfer.fast.ops import pdl
from ninfer.testing.sm90 import run_build_script

KERNELS = ("rmsnorm", "swiglu", "gdn_conv", "gdn_recurrent", "attention", "attention_merge", "rope_kv_write", "gemv",
           "gemv_fma", "fp8_row", "fp8_rows", "gdn_verify", "moe_gate_up", "moe_down", "decode_slots", "greedy_draw",
           "draft_start")


def test_pdl_kernels_wait_before_any_global_access():
    # with PDL: one trigger (PREEXIT) and one wait (ACQBULK), and no global load, store or atomic ahead of the wait
    # (a read there could see the previous kernel's output half-written, a write could race its reads); without
    # PDL: neither instruction, and the same count sees every global access of the kernel (so it is not vacuous)
    rows = run_build_script(Path(__file__).with_name("_sm90_pdl.py"), list(KERNELS))
    by = {(r["kernel"], r["pdl"]): r for r in rows}
    assert sorted(by) == sorted((k, p) for k in KERNELS for p in (False, True))
    for k in KERNELS:
        on, off = by[k, True], by[k, False]
        assert on["trigger"] == on["wait"] == 1 and on["global_before_wait"] == 0, on
        assert off["trigger"] == off["wait"] == 0 and off["before"]["LDG"] > 0 and off["before"]["STG"] > 0, off
        assert on["spill"] == 0, on
    # the GEMV's dot-free one-row form keeps its tile in one layout inside the loop (nothing crosses threads)
    assert by["gemv_fma", True]["loop_conversions"] == 0, by["gemv_fma", True]


def test_pdl_is_off_the_gpu():
    # the interpreter and a CPU have no griddepcontrol: a launch there takes no PDL option
    x = torch.zeros(2, 8)
    assert not pdl.active(x)
    assert pdl.launch(False) == {} and pdl.launch(True) == {"launch_pdl": True}
