"""A --quantize'd artifact with a quantized MTP head served with MTP k = 3 over the OpenAI API (issue 13: every
feature of the bf16 path, speculation included): a json_schema response validates and equals the plain run's
(ForcedDrafts in front of the drafter, so blocks of several tokens occur), on the reference
Program (the CPU's; tests/fast_program/test_quantized_speculative.py runs the fast Program)."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient

from ninfer.convert.convert import convert_checkpoint
from ninfer.runtime_options import RuntimeOptions
from ninfer.serve.app import create_app
from ninfer.serve.state import ServerState
from ninfer.testing.checkpoints import make_hf_checkpoint
from ninfer.testing.speculation import ForcedDrafts
from ninfer.wiring import build_runtime

CHAT = "/v1/chat/completions"
SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory):
    """{speculating: Runtime} over one q4 artifact of the real Qwen3.5 vocabulary (the built-in tokenizer)."""
    src = make_hf_checkpoint(tmp_path_factory.mktemp("bf16"), dtype=torch.bfloat16, mtp=True, vocab=248320, tie=True,
                             tokenizer=False)
    path = convert_checkpoint(src, tmp_path_factory.mktemp("q4") / "q4.ninfer", quantize="q4", group_size=32,
                              progress=False)
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    rts = {s: build_runtime(RuntimeOptions(model=str(path), program="reference", max_model_len=256, max_num_seqs=2,
                                           seed=7, speculative_config=spec if s else None), progress=False)
           for s in (True, False)}
    program = rts[True].engine.core.program
    ForcedDrafts(program.model).install(program)  # random-head drafts are rarely accepted: blocks of several tokens
    yield rts
    for rt in rts.values():
        rt.close()


def test_quantized_mtp_json_schema_validates_and_equals_the_plain_run(runtimes):
    tok = runtimes[True].frontend.tokenizer
    # favour the answer's tokens and the end of turn, so the random model finishes inside max_tokens
    bias = {**{str(t): 30 for t in tok.encode('{"a": true}') if tok.decode([t]).strip()}, str(tok.IM_END): 100}
    req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "logit_bias": bias, "temperature": 0,
           "chat_template_kwargs": {"enable_thinking": False},
           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    out = {}
    for s, rt in runtimes.items():
        client = TestClient(create_app(ServerState(rt, rt.name)), raise_server_exceptions=False)
        out[s] = client.post(CHAT, json=req).json()
    assert out[True]["usage"]["speculative_decoding"]["accepted_draft_tokens"] > 0
    assert out[True]["choices"][0]["message"] == out[False]["choices"][0]["message"]
    assert json.loads(out[True]["choices"][0]["message"]["content"]) == {"a": True}
