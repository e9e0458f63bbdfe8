"""Issue 19, request-level: out-of-range, coerced, badly encoded or too deeply nested input is a 400 naming the
parameter, a request whose token cannot be drawn ends alone, and the Engine stays ready through all of it."""

from __future__ import annotations

import json

import pytest

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def assert_400(resp, param: str | None = None, code: str | None = None) -> dict:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def assert_serving(client):
    assert client.get("/health/ready").status_code == 200
    ok = client.post(CHAT, json={"messages": HI, "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def raw(client, path: str, text: str):
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("fields, param", [
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),  # killed the Engine: x / 0 in float32
    ({"top_k": 10 ** 9}, "top_k"),  # above the vocabulary
    ({"top_k": 2 ** 63}, "top_k"),  # killed the Engine: int64 overflow
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"top_k": -2}, "top_k"),
    ({"seed": 2 ** 63}, "seed"),
    ({"seed": -(2 ** 63) - 1}, "seed"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 3}, "min_tokens"),
    ({"logit_bias": {"5": 100.5}}, "logit_bias"),
    ({"logit_bias": {"248320": 1}}, "logit_bias"),
    ({"stop_token_ids": [248320]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"n": 0}, "n"),
    ({"stop": ["x"] * 17}, "stop"),
])
def test_out_of_range_is_400_naming_the_parameter(client, fields, param):
    assert_400(client.post(CHAT, json={"messages": HI, "max_tokens": 3, **fields}), param)
    assert_serving(client)


@pytest.mark.parametrize("text, param", [
    ('"temperature": NaN', "temperature"),
    ('"temperature": Infinity', "temperature"),
    ('"top_p": -Infinity', "top_p"),
    ('"logit_bias": {"5": NaN}', "logit_bias.5"),
    ('"presence_penalty": NaN', "presence_penalty"),
])
def test_non_finite_numbers_are_400(client, text, param):
    assert_400(raw(client, CHAT, '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, ' + text + "}"),
               param)


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": "3"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 1e3}, "max_tokens"),
    ({"max_tokens": 3.0}, "max_tokens"),
    ({"n": "2"}, "n"),
    ({"seed": "1"}, "seed"),
    ({"top_k": 2.0}, "top_k"),
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"logit_bias": {"5": "2"}}, "logit_bias.5"),
    ({"stream": "true"}, "stream"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"stop_token_ids": ["5"]}, "stop_token_ids[0]"),
    ({"logprobs": 1}, "logprobs"),
])
def test_no_type_coercion(client, fields, param):
    assert_400(client.post(CHAT, json={"messages": HI, "max_tokens": 2, **fields}), param)


@pytest.mark.parametrize("key", ["1_000", "05", "+5", " 5", "5 ", "-1", "0x5", "5.0", "", "١٢"])
def test_logit_bias_keys_are_canonical_ids(client, key):
    assert_400(client.post(CHAT, json={"messages": HI, "max_tokens": 2, "logit_bias": {key: 1}}), "logit_bias")


def test_canonical_logit_bias_keys_are_accepted(client):
    resp = client.post(CHAT, json={"messages": HI, "max_tokens": 2, "logit_bias": {"0": -1, "42": 2}})
    assert resp.status_code == 200, resp.text


LONE = "\\ud800"  # JSON spelling of a lone UTF-16 surrogate


@pytest.mark.parametrize("path, body, param", [
    (CHAT, f'{{"messages": [{{"role": "user", "content": "a{LONE}"}}]}}', "messages[0].content"),
    (CHAT, f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "{LONE}"}}]}}]}}',
     "messages[0].content[0].text"),
    (CHAT, f'{{"model": "{LONE}", "messages": [{{"role": "user", "content": "hi"}}]}}', "model"),
    (CHAT, f'{{"messages": [{{"role": "user", "content": "hi"}}], "stop": ["{LONE}"]}}', "stop[0]"),
    (CHAT, f'{{"messages": [{{"role": "user", "content": "hi"}}], "tools": [{{"type": "function", "function": '
           f'{{"name": "f", "description": "{LONE}", "parameters": {{"type": "object"}}}}}}]}}',
     "tools[0].function.description"),
    (CHAT, f'{{"messages": [{{"role": "user", "content": "hi"}}], "{LONE}": 1}}', None),
    ("/v1/completions", f'{{"prompt": "{LONE}", "max_tokens": 2}}', "prompt"),
    ("/v1/completions", f'{{"prompt": ["ok", "{LONE}"], "max_tokens": 2}}', "prompt[1]"),
    ("/tokenize", f'{{"prompt": "{LONE}"}}', "prompt"),
    ("/tokenize", f'{{"messages": [{{"role": "user", "content": "{LONE}"}}]}}', "messages[0].content"),
    ("/detokenize", f'{{"model": "{LONE}", "tokens": [1]}}', "model"),
])
def test_text_utf8_cannot_encode_is_400_everywhere(client, path, body, param):
    err = assert_400(raw(client, path, body), code="invalid_encoding")
    if param is not None:
        assert err["param"] == param
    assert "\ud800" not in err["message"]
    assert_serving(client)


def _nested(depth: int):
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("body", ["5", '"text"', "null", "[]"])
def test_a_body_that_is_not_an_object_is_400(client, body):
    assert_400(raw(client, CHAT, body))


def test_a_body_without_content_type_is_checked_too(client):
    resp = client.post(CHAT, content=f'{{"messages": [{{"role": "user", "content": "{LONE}"}}]}}'.encode())
    assert_400(resp, "messages[0].content", "invalid_encoding")


def test_body_nesting_is_bounded(client):
    deep = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                       "default": _nested(70)}}}
    err = assert_400(client.post(CHAT, json={"messages": HI, "tools": [deep]}), code="too_deep")
    assert err["param"].startswith("tools[0].function.parameters.default")
    # nested beyond what the JSON parser recurses into: still a 400, not a 500
    assert_400(raw(client, CHAT, '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"))
    assert_serving(client)


def _assistant_call(arguments):
    return [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "content": "ok"}, {"role": "user", "content": "go on"}]


@pytest.mark.parametrize("arguments", [
    "[" * 5000 + "]" * 5000,  # was an uncaught RecursionError: 500
    '{"a": ' * 80 + "1" + "}" * 80,  # parses, but nests past the Frontend's bound
])
def test_deep_tool_call_arguments_are_400(client, arguments):
    err = assert_400(client.post(CHAT, json={"messages": _assistant_call(arguments), "max_tokens": 2}))
    assert "messages[1].tool_calls[0].arguments" in err["message"] and "deeper than 64" in err["message"]
    assert_serving(client)


@pytest.mark.parametrize("schema, needle", [
    ({"type": "object", "properties": {"a": {"$ref": "http://example.com/s.json"}}}, "$ref"),
    ({"$ref": "other.json#/x"}, "$ref"),
    ({"type": "bogus"}, "'bogus' is not a JSON schema type"),
])
def test_schemas_xgrammar_cannot_enforce_are_400(client, schema, needle):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    err = assert_400(client.post(CHAT, json={"messages": HI, "max_tokens": 2, "response_format": fmt}))
    assert needle in err["message"] and ".cc" not in err["message"]


@pytest.mark.parametrize("kind", ["bogus", "string", ["object", "null"]])
def test_a_bogus_top_level_tool_parameter_type_is_400(client, kind):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": kind}}}
    err = assert_400(client.post(CHAT, json={"messages": HI, "max_tokens": 2, "tools": [tool]}))
    assert "tool 'f' parameters.type" in err["message"]


def _json_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


NO_THINK = {"enable_thinking": False}


def test_min_tokens_is_honoured_under_a_grammar(client):
    """Stop and EOS tokens (<|im_end|> included) stay masked until min_tokens while the grammar can go on."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    # The plain distribution, not the model's generation_config defaults: under top_k 20 the random model closes
    # the string within a few tokens, after which the grammar can only end. Seeded: about half the seeds close the
    # string before 25 tokens even so (then the request ends with nothing_allowed, as the next test checks).
    body = {"messages": HI, "max_tokens": 60, "min_tokens": 25, "response_format": _json_format(schema),
            "chat_template_kwargs": NO_THINK, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    resp = client.post(CHAT, json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 25


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra", [
    {"response_format": _json_format({"type": "boolean"}), "min_tokens": 40},  # the grammar can only end
    {"response_format": _json_format({"enum": ["x"]}), "min_tokens": 8, "stop_token_ids": [248046]},
])
def test_a_request_left_with_no_token_ends_alone(client, stream, extra):
    body = {"messages": HI, "max_tokens": 60, "chat_template_kwargs": NO_THINK, "stream": stream, **extra}
    resp = client.post(CHAT, json=body)
    if not stream:
        assert_400(resp, code="nothing_allowed")
    else:
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.text.splitlines()
                  if line.startswith("data: {")]
        assert events[-1]["error"]["code"] == "nothing_allowed"
    assert_serving(client)
