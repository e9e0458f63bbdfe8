"""Structured output and forced tool calls through the real `openai` client against `ninfer serve`, sampled from the
embedded random model (which, unconstrained, likes whitespace and never ends a call on its own): answers cannot be
whitespace-filled, forced calls follow the tool's schema, a call cut short is `length` and never raw XML in
`content`, whole or streamed, and with thinking on a forced call still fits in max_tokens."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
HI = [{"role": "user", "content": "hi"}]
UNIT = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1,
                                                                           "maximum": 14}},
    "required": ["unit", "days"]}}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def space_bias(live_server):
    """logit_bias that makes whitespace tokens the model's favourites (the failure the grammar must bound)."""
    import httpx

    ids = {t for text in (" ", "\n", "  ", "\n\n", "\t", "    ", "\n  ")
           for t in httpx.post(f"{live_server.url}/tokenize", json={"prompt": text}).json()["tokens"]}
    return {str(t): 12 for t in ids}


def _layout_runs(text: str) -> list[int]:
    """Lengths of the whitespace runs outside JSON strings (a string cut off at the end included)."""
    outside = re.sub(r'"(\\.|[^"\\])*("|$)', '""', text)
    return [len(m) for m in re.findall(r"\s+", outside)] or [0]


@pytest.mark.parametrize("fmt", [{"type": "json_object"},
                                 {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}])
def test_structured_answers_are_never_whitespace_filled(client, space_bias, fmt):
    # the schema's answer ends at its 39th token under this seed, so it is validated whole; the open json_object
    # one never ends, and 30 tokens reach its layout
    schema = fmt["type"] == "json_schema"
    kw = dict(model="ninfer-test", messages=HI, max_tokens=40 if schema else 30, temperature=1.0, seed=3,
              response_format=fmt, logit_bias=space_bias, extra_body=NO_THINK)
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                       if c.choices)
    assert streamed == content and max(_layout_runs(content)) <= 1, content[:300]
    if schema:  # its strings are short, so the walk reaches every layout position
        assert max(_layout_runs(content)) == 1
        assert whole.choices[0].finish_reason == "stop", content
        jsonschema.validate(json.loads(content), SCHEMA)
        pretty = client.chat.completions.create(**{**kw, "extra_body": {**NO_THINK, "json_whitespace": "pretty"}})
        assert 1 < max(_layout_runs(pretty.choices[0].message.content)) <= 20


def test_an_unknown_json_whitespace_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="json_whitespace must be one of compact, pretty"):
        client.chat.completions.create(model="ninfer-test", messages=HI, response_format={"type": "json_object"},
                                       extra_body={"json_whitespace": "airy"})


def test_a_forced_call_follows_the_tools_schema(client):
    r = client.chat.completions.create(model="ninfer-test", messages=HI, tools=[UNIT], tool_choice="required",
                                       parallel_tool_calls=False, temperature=1.0, seed=5, max_tokens=100,
                                       extra_body=NO_THINK)
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), UNIT["function"]["parameters"])


@pytest.mark.parametrize("choice, stream", [("required", False), ("required", True),
                                            ({"type": "function", "function": {"name": "get_weather"}}, True)])
def test_a_forced_call_cut_short_is_length_without_xml(client, choice, stream):
    kw = dict(model="ninfer-test", messages=HI, tools=[UNIT], tool_choice=choice, temperature=1.0, seed=5,
              max_tokens=6, extra_body=NO_THINK)
    if not stream:
        cut = client.chat.completions.create(**kw)
        assert cut.choices[0].finish_reason == "length"
        assert not cut.choices[0].message.content and not cut.choices[0].message.tool_calls
        return
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_thinking_on_still_leaves_room_for_the_forced_call(client):
    # The budget reserves the call's canonical tokens; the random model spells the forced tags in random, longer
    # tokenizations, so it gets more room than a trained model would need.
    r = client.chat.completions.create(model="ninfer-test", messages=HI, tools=[UNIT], tool_choice="required",
                                       parallel_tool_calls=False, temperature=1.0, seed=2, max_tokens=90)
    assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens <= 90
    assert r.choices[0].message.model_extra["reasoning_content"]
    jsonschema.validate(json.loads(r.choices[0].message.tool_calls[0].function.arguments),
                        UNIT["function"]["parameters"])


def test_thinking_token_budget_ends_reasoning_through_the_matcher(client):
    r = client.chat.completions.create(model="ninfer-test", messages=HI, temperature=1.0, seed=4, max_tokens=30,
                                       response_format={"type": "json_object"},
                                       extra_body={"thinking_token_budget": 4})
    details = r.usage.completion_tokens_details
    assert 4 <= details.reasoning_tokens <= 6  # the budget, then the forced "\n</think>" it ends with
    assert r.choices[0].message.content.startswith("{")


def test_the_ready_line_is_printed_once(live_server):
    assert sum("ready:" in line for line in live_server.log.read_text().splitlines()) == 1
