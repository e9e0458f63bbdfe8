"""The real `openai` client against `ninfer serve` (the embedded RANDOM-weight model: texts are noise; the tests
check protocol, shapes, streaming reassembly, tool-call and structured-output plumbing, and errors)."""

from __future__ import annotations

import json

import openai
import pytest

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _bias(client_tok, text: str) -> dict:
    ids = {t for t in client_tok(text)}
    return {**{str(t): 30 for t in ids}, "248046": 100}


@pytest.fixture(scope="module")
def tok(live_server):
    import httpx

    def encode(text: str) -> list[int]:
        tokens = httpx.post(f"{live_server.url}/tokenize", json={"prompt": text}).json()["tokens"]
        return [t for t in tokens if httpx.post(f"{live_server.url}/detokenize",
                                                 json={"tokens": [t]}).json()["prompt"].strip()]
    return encode


def test_models_and_chat(client):
    assert [m.id for m in client.models.list().data] == ["ninfer-test"]
    r = client.chat.completions.create(model="ninfer-test", messages=HI, max_tokens=4, seed=1)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4 and r.usage.completion_tokens_details.reasoning_tokens == 4
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    extra = r.choices[0].message.model_extra
    assert extra["reasoning_content"] == extra["reasoning"]


def test_streaming_reassembles_to_the_whole_answer(client):
    # seeded sampling, not greedy: the random model's greedy text is a run of newlines, on which a stream that
    # garbles or reorders each delta's text still reassembles to the whole answer
    kw = dict(model="ninfer-test", messages=HI, max_tokens=6, temperature=1.0, seed=5, extra_body=NO_THINK)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_streamed_tool_call(client, tok):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"]}}}]
    call = "<tool_call>\n<function=get_weather>\n<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>"
    stream = client.chat.completions.create(
        model="ninfer-test", messages=HI, tools=tools, tool_choice="required", max_tokens=60, temperature=0,
        logit_bias=_bias(tok, call), stream=True, extra_body=NO_THINK)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or ():
            entry = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
            entry["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"unit": "f"}


def test_response_format_json_object_and_schema(client, tok):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.chat.completions.create(
        model="ninfer-test", messages=HI, max_tokens=40, temperature=0, logit_bias=_bias(tok, '{"ok": false}'),
        response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema, "strict": True}},
        extra_body=NO_THINK)
    assert json.loads(r.choices[0].message.content) == {"ok": False}
    r = client.chat.completions.create(model="ninfer-test", messages=HI, max_tokens=30, temperature=0,
                                       logit_bias=_bias(tok, "{}"), response_format={"type": "json_object"},
                                       extra_body=NO_THINK)
    assert json.loads(r.choices[0].message.content) == {}


def test_completions_client(client):
    r = client.completions.create(model="ninfer-test", prompt=["a", "b"], max_tokens=3, echo=True, temperature=0)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text.startswith("a")
    assert r.usage.completion_tokens == 6


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="ninfer-test", messages=HI, max_tokens=3, logprobs=True,
                                       top_logprobs=2, temperature=0)
    content = r.choices[0].logprobs.content
    assert len(content) == 3 and all(len(e.top_logprobs) == 2 for e in content)
    assert all(e.logprob <= max(t.logprob for t in e.top_logprobs) + 1e-6 for e in content)


def test_errors_map_to_client_exceptions(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="ninfer-test", messages=HI, temperature=3)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HI)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="ninfer-test", messages=[{"role": "user", "content": "w " * 600}])
    assert e.value.code == "context_too_long"


def test_agent_turn_resumes_at_the_deepest_exact_boundary(client, tok):
    """An agent loop through the real client: the next request (the tool result appended) resumes after the whole
    tool-call turn when history re-renders the model's tokens exactly, else at the end of the first prompt (its
    empty think block is rendered back too); never anywhere else. (The random model forced by logit_bias may pick a non-canonical
    tokenization of the call, which the renderer does not reproduce.)"""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"]}}}]
    call = "<tool_call>\n<function=get_weather>\n<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>"
    kw = dict(model="ninfer-test", tools=tools, temperature=0, extra_body=NO_THINK, prompt_cache_key="agent-e2e")
    first = client.chat.completions.create(messages=HI, tool_choice="required", max_tokens=60,
                                           logit_bias=_bias(tok, call), **kw)
    assert first.choices[0].finish_reason == "tool_calls"
    turn = first.choices[0].message.model_dump(exclude_none=True)
    messages = HI + [turn, {"role": "tool", "tool_call_id": turn["tool_calls"][0]["id"], "content": "18 C"}]
    second = client.chat.completions.create(messages=messages, max_tokens=2, **kw)
    done = first.usage.prompt_tokens + first.usage.completion_tokens - 1  # all but the unconsumed <|im_end|>
    assert second.usage.prompt_tokens_details.cached_tokens in (done, first.usage.prompt_tokens)
