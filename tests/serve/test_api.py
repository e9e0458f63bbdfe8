"""Route behaviour through FastAPI's TestClient over the embedded random-weight model (outputs are noise; the
tests check shapes, counts, determinism and the Gateway's bookkeeping, never the text's meaning)."""

from __future__ import annotations

import json

import pytest

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
NO_THINK = {"enable_thinking": False}


def sse_events(resp) -> list:
    """Parse an SSE body strictly: only `data:` lines, each followed by a blank line, [DONE] last."""
    blocks = resp.text.split("\n\n")
    assert blocks[-1] == "", "the stream must end with a blank line"
    payloads = [b.removeprefix("data: ") for b in blocks[:-1]]
    assert all(b.startswith("data: ") for b in blocks[:-1])
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def _bias_toward(rt, text: str) -> dict[str, int]:
    """Favour the text's non-blank tokens, and the end of turn above them wherever the grammar allows it."""
    tok = rt.frontend.tokenizer
    ids = {t for t in tok.encode(text) if tok.decode([t]).strip()}
    return {**{str(t): 30 for t in ids}, str(tok.IM_END): 100}


def test_chat_whole_response_shape(client, gen_runtime):
    body = client.post(CHAT, json={"messages": HI, "max_tokens": 4, "seed": 3}).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    usage = body["usage"]
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4
    # Thinking is on by default: everything before </think> is reasoning, mirrored under vLLM's newer name.
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 4
    assert choice["message"]["reasoning_content"] == choice["message"]["reasoning"]


def test_seeded_sampling_replays_and_choices_differ(client):
    req = {"messages": HI, "max_tokens": 6, "seed": 11, "temperature": 1.0, "n": 2,
           "chat_template_kwargs": NO_THINK}
    a, b = client.post(CHAT, json=req).json(), client.post(CHAT, json=req).json()
    texts = [c["message"]["content"] for c in a["choices"]]
    assert texts == [c["message"]["content"] for c in b["choices"]]
    assert [c["index"] for c in a["choices"]] == [0, 1]
    assert texts[0] != texts[1]  # choice j samples with seed + j
    assert a["usage"]["completion_tokens"] == 12


def test_stream_matches_whole_response(client):
    # seeded sampling, not greedy: the random model's greedy text is a run of newlines, on which a stream that
    # garbles or reorders each delta's text still equals the whole response
    req = {"messages": HI, "max_tokens": 5, "temperature": 1.0, "seed": 5, "chat_template_kwargs": NO_THINK}
    client.post(CHAT, json={**req, "max_tokens": 1})  # both requests below then reuse the same cached prefix
    whole = client.post(CHAT, json=req).json()
    resp = client.post(CHAT, json={**req, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]
    assert all(e["usage"] is None for e in events[:-1])


def test_tool_call_with_required_choice(client, gen_runtime):
    """tool_choice=required makes the grammar force a call; a logit bias toward the call's own non-blank tokens
    lets the random model (which loves whitespace, and the grammar allows it) finish the call in budget."""
    call = "<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"
    bias = _bias_toward(gen_runtime, call)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"]}}}]
    req = {"messages": HI, "tools": tools, "tool_choice": "required", "max_tokens": 60, "logit_bias": bias,
           "temperature": 0, "chat_template_kwargs": NO_THINK}
    choice = client.post(CHAT, json=req).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (tc,) = choice["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"unit": "c"}
    events = sse_events(client.post(CHAT, json={**req, "stream": True}))
    frags = [t for e in events if e["choices"] for t in e["choices"][0]["delta"].get("tool_calls", [])]
    assert frags[0]["id"].startswith("call_") and frags[0]["function"]["name"] == "get_weather"
    assert "".join(f["function"]["arguments"] for f in frags) == tc["function"]["arguments"]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_response_format_json_schema(client, gen_runtime):
    bias = _bias_toward(gen_runtime, '{"a": true}')
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    req = {"messages": HI, "max_tokens": 40, "logit_bias": bias, "chat_template_kwargs": NO_THINK, "temperature": 0,
           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    choice = client.post(CHAT, json=req).json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"]) == {"a": True}


def test_prefix_cache_hits_are_reported(client):
    system = {"role": "system", "content": "You are a terse assistant. " * 12}
    first = client.post(CHAT, json={"messages": [system, {"role": "user", "content": "a"}], "max_tokens": 1})
    second = client.post(CHAT, json={"messages": [system, {"role": "user", "content": "b"}], "max_tokens": 1})
    assert first.status_code == second.status_code == 200
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second.json()["usage"]["prompt_tokens"]
    metrics = client.get("/metrics").text
    hits = next(line for line in metrics.splitlines() if line.startswith("ninfer:prefix_cache_hit_tokens_total"))
    assert int(hits.split()[-1]) >= cached


def test_completions_batch_echo_and_token_prompts(client, gen_runtime):
    tok = gen_runtime.frontend.tokenizer
    body = client.post("/v1/completions", json={"prompt": ["one", "two"], "max_tokens": 2, "echo": True,
                                                "temperature": 0}).json()
    assert body["object"] == "text_completion" and len(body["choices"]) == 2
    assert body["choices"][0]["text"].startswith("one") and body["choices"][1]["text"].startswith("two")
    assert body["usage"]["completion_tokens"] == 4
    by_ids = client.post("/v1/completions", json={"prompt": tok.encode("two"), "max_tokens": 2, "echo": True,
                                                  "temperature": 0}).json()
    assert by_ids["choices"][0]["text"] == body["choices"][1]["text"]  # greedy: same prompt, same text
    mixed = client.post("/v1/completions", json={"prompt": ["one", [1, 2]], "max_tokens": 1})
    assert mixed.status_code == 400
    ids = client.post("/v1/completions", json={"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 0, "echo": True}).json()
    assert [c["text"] for c in ids["choices"]] == [tok.decode([1, 2, 3]), tok.decode([4, 5])]
    events = sse_events(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True}))
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_tokenize_renders_exactly_as_chat(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    req = {"messages": HI, "tools": tools, "chat_template_kwargs": NO_THINK}
    tokens = client.post("/tokenize", json=req).json()
    usage = client.post(CHAT, json={**req, "max_tokens": 1}).json()["usage"]
    assert tokens["count"] == len(tokens["tokens"]) == usage["prompt_tokens"]
    text = client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>system") and "<|im_start|>user\nhi<|im_end|>" in text
    assert client.post("/tokenize", json={"prompt": "hello world"}).json()["tokens"] == [14556, 1814]
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]


def test_models_health_metrics(client, gen_runtime):
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == gen_runtime.name and card["max_model_len"] == 512 and card["random_weights"] is True
    assert client.get("/health/ready").json()["status"] == "ready"
    client.post(CHAT, json={"messages": HI, "max_tokens": 2})
    lines = client.get("/metrics").text.splitlines()
    for line in ("ninfer:num_requests_waiting 0", "ninfer:num_requests_running 0",
                 "ninfer:time_to_first_token_seconds_count 1", "ninfer:generation_tokens_total 2"):
        assert line in lines, line  # whole lines: "count 1" must not pass as the start of "count 12"


WEATHER_CALL = "<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"
WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"]}}}]


def _spec_and_plain(spec_client, client, req):
    """The same greedy request with the MTP backend (forced multi-token blocks) and without."""
    spec, plain = spec_client.post(CHAT, json=req).json(), client.post(CHAT, json=req).json()
    assert spec["usage"]["speculative_decoding"]["accepted_draft_tokens"] > 0  # blocks of several tokens ran
    assert "speculative_decoding" not in plain["usage"]
    return spec["choices"][0], plain["choices"][0]


def test_speculative_json_schema_validates_and_equals_the_plain_run(spec_client, client, spec_runtime):
    """MTP k = 3: the grammar rows of every draft prefix constrain p, so the output is the plain run's, whole or
    streamed; the backend is named in /v1/models."""
    assert spec_client.get("/v1/models").json()["data"][0]["speculative"] == "mtp (k=3, fixed width)"
    assert client.get("/v1/models").json()["data"][0]["speculative"] is None
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    req = {"messages": HI, "max_tokens": 40, "logit_bias": _bias_toward(spec_runtime, '{"a": true}'),
           "chat_template_kwargs": NO_THINK, "temperature": 0,
           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    spec, plain = _spec_and_plain(spec_client, client, req)
    assert spec["message"] == plain["message"] and json.loads(spec["message"]["content"]) == {"a": True}
    events = sse_events(spec_client.post(CHAT, json={**req, "stream": True}))
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == \
        spec["message"]["content"]


def test_dflash_json_schema_validates_and_equals_the_plain_run(dflash_client, client, dflash_runtime, dflash_teacher):
    """DFlash2 k = 7 over the server: greedy with the drafter's own drafts and with forced multi-token blocks
    equals the plain run and validates; sampled responses that finish validate too."""
    assert dflash_client.get("/v1/models").json()["data"][0]["speculative"] == "dflash2 (k=7, fixed width)"
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    req = {"messages": HI, "max_tokens": 40, "logit_bias": _bias_toward(dflash_runtime, '{"a": true}'),
           "chat_template_kwargs": NO_THINK, "temperature": 0,
           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    plain = client.post(CHAT, json=req).json()["choices"][0]
    real = dflash_client.post(CHAT, json=req).json()
    assert real["usage"]["speculative_decoding"]["draft_tokens"] > 0
    assert real["choices"][0]["message"] == plain["message"]
    from ninfer.testing.speculation import ForcedDrafts
    program = dflash_runtime.engine.core.program
    drafter = program.executor.draft
    ForcedDrafts(dflash_teacher).install(program)
    try:
        spec, plain_again = _spec_and_plain(dflash_client, client, req)
        for n in (3, 4):
            body = dflash_client.post(CHAT, json={**req, "temperature": 1.0, "seed": n}).json()["choices"][0]
            if body["finish_reason"] == "stop":
                assert set(json.loads(body["message"]["content"])) == {"a"}
    finally:
        program.executor.draft = drafter
    assert spec["message"] == plain_again["message"] and json.loads(spec["message"]["content"]) == {"a": True}


@pytest.mark.slow
def test_speculative_tool_call_parses_and_equals_the_plain_run(spec_client, client, spec_runtime):
    """About 40 s on CPU (60 tokens of a 248k-vocabulary model, ForcedDrafts re-running it on every miss): opt-in."""
    req = {"messages": HI, "tools": WEATHER_TOOLS, "tool_choice": "required", "max_tokens": 60,
           "logit_bias": _bias_toward(spec_runtime, WEATHER_CALL), "temperature": 0, "chat_template_kwargs": NO_THINK}
    spec, plain = _spec_and_plain(spec_client, client, req)
    assert spec["finish_reason"] == plain["finish_reason"] == "tool_calls"
    (call,), (want,) = spec["message"]["tool_calls"], plain["message"]["tool_calls"]
    assert call["function"] == want["function"] and json.loads(call["function"]["arguments"]) == {"unit": "c"}


def test_speculative_metrics(spec_client):
    req = {"messages": HI, "max_tokens": 12, "temperature": 0}
    body = spec_client.post(CHAT, json=req).json()
    ext = body["usage"]["speculative_decoding"]
    assert 0 < ext["accepted_draft_tokens"] <= ext["draft_tokens"]
    # rounds by emitted tokens: a round emitting i + 1 tokens accepted i drafts, and the first token is prefill's
    hist = ext["acceptance_lengths"]
    assert sum(i * n for i, n in enumerate(hist)) == ext["accepted_draft_tokens"]
    assert sum((i + 1) * n for i, n in enumerate(hist)) == body["usage"]["completion_tokens"] - 1
    events = sse_events(spec_client.post(CHAT, json={**req, "stream": True, "stream_options": {"include_usage": True}}))
    assert events[-1]["usage"]["speculative_decoding"] == ext  # what `ninfer bench serve` reads, streamed
    lines = spec_client.get("/metrics").text.splitlines()

    def value(name: str) -> float:
        return float(next(line for line in lines if line.startswith(name + " ")).split()[-1])
    assert value("ninfer:spec_decode_num_draft_tokens_total") >= ext["draft_tokens"]
    assert value("ninfer:spec_decode_num_accepted_tokens_total") >= ext["accepted_draft_tokens"]
    assert value("ninfer:spec_decode_acceptance_length_count") >= sum(hist)
    assert value('ninfer:spec_decode_acceptance_length_bucket{le="8"}') == \
        value("ninfer:spec_decode_acceptance_length_count")
