"""Sampling defaults from the model's generation_config.json (vLLM's `--generation-config auto`): they fill what a
request leaves unset, a request's own value wins, `none` restores the plain defaults, and a bad file is a start-up
error naming it."""

from __future__ import annotations

import json

import pytest

from ninfer.errors import ExitCode, NinferError
from ninfer.model_facts import sampling_defaults
from ninfer.sampling.defaults import SamplingDefaults
from ninfer.serve.requests import sampling_params
from ninfer.serve.schemas import ChatCompletionRequest, CompletionRequest

QWEN = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [248046, 248044]}
VOCAB = 248077


def _params(defaults, **body):
    return sampling_params(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **body), VOCAB,
                           max_tokens=None, logprobs=None, defaults=defaults)


def test_unset_fields_take_the_models_defaults_and_the_request_wins():
    qwen = SamplingDefaults.from_generation_config(QWEN, "g.json")
    p = _params(qwen)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.6, 0.95, 20, 0.0)
    p = _params(qwen, temperature=0.0, top_k=5)
    assert (p.temperature, p.top_p, p.top_k) == (0.0, 0.95, 5)
    plain = _params(SamplingDefaults())
    assert (plain.temperature, plain.top_p, plain.top_k) == (1.0, 1.0, 0)  # OpenAI's
    completion = sampling_params(CompletionRequest(prompt="x"), VOCAB, max_tokens=16, logprobs=None, defaults=qwen)
    assert completion.top_k == 20


def test_do_sample_false_means_greedy_and_bad_values_name_the_file():
    greedy = SamplingDefaults.from_generation_config({**QWEN, "do_sample": False}, "g.json")
    assert _params(greedy).temperature == 0.0 and _params(greedy).top_k == 0
    with pytest.raises(ValueError, match=r"g.json: sampling field 'top_p'"):
        SamplingDefaults.from_generation_config({"top_p": 2}, "g.json")
    assert "temperature 0.6, top_p 0.95, top_k 20" in SamplingDefaults.from_generation_config(QWEN, "g").describe()
    assert SamplingDefaults().describe() == "plain sampling defaults"


def test_the_generation_config_option(tmp_path):
    raw = json.dumps(QWEN).encode()
    assert dict(sampling_defaults("auto", raw).values) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert sampling_defaults("auto", None).values == () and sampling_defaults("none", raw).values == ()
    assert sampling_defaults("vllm", raw).values == ()
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3}))
    assert dict(sampling_defaults(str(tmp_path), raw).values) == {"temperature": 0.3}
    with pytest.raises(NinferError) as e:
        sampling_defaults(str(tmp_path / "nope"), raw)
    assert e.value.exit_code is ExitCode.NOT_FOUND and e.value.where == "--generation-config"
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(NinferError, match="bad.json is not valid JSON") as e:
        sampling_defaults(str(tmp_path / "bad.json"), raw)
    assert e.value.exit_code is ExitCode.USAGE


def test_the_ready_line_says_where_the_defaults_came_from(gen_runtime):
    assert "| sampling defaults from the artifact's generation_config.json (temperature 0.6, top_p 0.95, top_k 20) |" \
        in gen_runtime.summary()
