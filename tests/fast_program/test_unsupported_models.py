"""The fast Program's kernels compute unscaled RoPE over an even rotary dimension and SiLU: any other RoPE or
activation the config layer accepts (scaled types, odd dims that transformers rounds up, gelu) is refused at start,
naming the field and the way out, instead of running with the wrong frequencies or activation."""

from __future__ import annotations

import dataclasses

import pytest

from ninfer.errors import ExitCode, NinferError
from ninfer.fast.program import FastProgram, FastProgramConfig


@pytest.mark.parametrize("change,field", [
    (dict(rope_type="yarn", rope_scaling=(("factor", 4.0), ("original_max_position_embeddings", 64))),
     "rope_parameters"),
    (dict(rope_type="linear", rope_scaling=(("factor", 2.0),)), "rope_parameters"),
    (dict(head_dim=36, partial_rotary_factor=0.25), "rope_parameters"),  # int(36 * 0.25) = 9: 10 dims rotate
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(attention_bias=True), "attention_bias"),
])
def test_fast_program_refuses_what_its_kernels_do_not_compute(tiny, change, field):
    cfg, weights = tiny
    odd = dataclasses.replace(cfg, **change)
    assert (odd.plain_rope, odd.silu, odd.attention_bias) != (True, True, False)
    with pytest.raises(NinferError) as e:
        FastProgram.build(odd, weights.__getitem__, FastProgramConfig(max_concurrency=1, max_context=64),
                          budget_bytes=1 << 20, device="cpu", kernels="naive")
    assert e.value.exit_code == ExitCode.UNAVAILABLE and e.value.where == field
    assert "--program reference" in e.value.hint
