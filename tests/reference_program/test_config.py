"""ReferenceProgramConfig resolution and the constructor from a .ninfer artifact."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.build import write_artifact
from ninfer.contracts import ResourceChoice, RowDecision, TransitionKind
from ninfer.models.qwen3_5.capacity import gdn_state_bytes_per_sequence, kv_bytes_per_token_all_layers
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig


def test_resolution_fills_defaults_and_checks_ranges(model32):
    cfg = model32.cfg
    c = ReferenceProgramConfig(max_concurrency=3, max_context=100, page_size=8).resolved(cfg)
    assert c.kv_pages == 2 * 3 * 13 and c.eos_token_ids == cfg.eos_token_ids
    assert c.page_bytes(cfg) == 8 * kv_bytes_per_token_all_layers(cfg, "float32")
    assert c.state_bytes(cfg) == gdn_state_bytes_per_sequence(cfg, "float32")
    assert c.resolved(cfg) == c
    for bad in (dict(max_concurrency=9), dict(max_context=0), dict(page_size=0), dict(kv_pages=0),
                dict(eos_token_ids=(cfg.vocab_size,)), dict(dtype=torch.int32)):
        with pytest.raises(ValueError):
            ReferenceProgramConfig(**bad).resolved(cfg)
    with pytest.raises(ValueError, match="dtype"):
        ReferenceProgram(model32, ReferenceProgramConfig(dtype=torch.float64))


def test_from_artifact_runs_the_artifact_weights(tmp_path, model32, prompt_of):
    cfg = model32.cfg
    path = write_artifact(tmp_path / "tiny.ninfer", cfg, model32.weights.items(), metadata={"random_weights": True})
    prog = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(max_concurrency=1, max_context=64,
                                                                       page_size=4))
    prompt = prompt_of(9)
    choice = ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt, max_new_tokens=3)
    handle = prog.advance(prog.start(prog.plan(choice))).handle
    batch = prog.prefill(handle, 64)
    prog.commit(batch.take(), [RowDecision(1, False)])
    state = model32.new_state()
    assert batch.rows[0].tokens[0] == int(torch.argmax(model32.prefill(torch.tensor(prompt), state)[-1]))
    prog.check_invariants()
