"""Request validation and error envelopes: every refusal is OpenAI's {"error": {...}} with the right status."""

from __future__ import annotations

import pytest

from ninfer.serve.limits import ServeLimits

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def assert_error(resp, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": HI, "temperature": 2.5}, "temperature"),
    ({"messages": HI, "top_p": 0}, "top_p"),
    ({"messages": HI, "n": 9}, "n"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens"),
    ({"messages": HI, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"messages": HI, "presence_penalty": -3}, "presence_penalty"),
    ({"messages": "hi"}, "messages"),
    ({"messages": HI, "stream": "maybe"}, "stream"),
])
def test_schema_violations_are_400_not_422(client, body, param):
    err = assert_error(client.post(CHAT, json=body), 400, param)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    ({"messages": HI, "logit_bias": {"999999999": 5}}, "logit_bias"),
    ({"messages": HI, "logit_bias": {"abc": 5}}, "logit_bias"),
    ({"messages": HI, "logit_bias": {"5": 500}}, "logit_bias"),
    ({"messages": HI, "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"messages": HI, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": HI, "stop": [""]}, "stop"),
    ({"messages": HI, "seed": 2 ** 70}, "seed"),
])
def test_value_checks_before_the_engine(client, body, param):
    assert_error(client.post(CHAT, json=body), 400, param)


def test_conversation_and_context_refusals(client):
    assert_error(client.post(CHAT, json={"messages": [{"role": "wizard", "content": "x"}]}), 400)
    long = [{"role": "user", "content": "word " * 700}]
    err = assert_error(client.post(CHAT, json={"messages": long}), 400)
    assert err["code"] == "context_too_long"
    assert_error(client.post(CHAT, json={"messages": HI, "max_tokens": 10_000}), 400)
    assert_error(client.post(CHAT, json={"messages": HI, "response_format": {"type": "xml"}}), 400)
    assert_error(client.post(CHAT, json={"messages": HI, "tool_choice": "required"}), 400)


def test_malformed_json_body_is_400(client):
    resp = client.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert_error(resp, 400)


def test_unknown_model_is_404_and_absent_model_is_the_served_one(client, gen_runtime):
    err = assert_error(client.post(CHAT, json={"model": "gpt-9", "messages": HI, "max_tokens": 1}), 404, "model")
    assert err["code"] == "model_not_found"
    ok = client.post(CHAT, json={"model": gen_runtime.name, "messages": HI, "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["model"] == gen_runtime.name


def test_unknown_route_and_method_keep_the_envelope(client):
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get(CHAT), 405)


def test_api_key(make_client):
    c = make_client(api_key="s3cret")
    assert_error(c.get("/v1/models"), 401)
    assert_error(c.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/health").status_code == 200  # probes need no key


def test_body_limit(make_client):
    c = make_client(limits=ServeLimits(max_body_bytes=1000))
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    assert_error(c.post(CHAT, json=big), 413)

    def chunked(n: int):
        yield b'{"messages": [{"role": "user", "content": "'
        yield b"x" * n
        yield b'"}], "max_tokens": 1}'

    headers = {"content-type": "application/json"}
    assert_error(c.post(CHAT, content=chunked(2000), headers=headers), 413)
    assert c.post(CHAT, content=chunked(10), headers=headers).status_code == 200


def test_scoring_purpose_refuses_generation(score_client):
    err = assert_error(score_client.post(CHAT, json={"messages": HI}), 400)
    assert err["code"] == "wrong_purpose"
    resp = score_client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 5})
    assert assert_error(resp, 400)["code"] == "wrong_purpose"


def test_generation_purpose_refuses_prompt_logprobs(client):
    resp = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 1, "echo": True, "logprobs": 1})
    assert assert_error(resp, 400, "echo")["code"] == "wrong_purpose"


@pytest.mark.parametrize("prompt", [[], [[1, 2], []], [248320], "", [[-1]]])
def test_bad_completion_prompts(client, prompt):
    assert_error(client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}), 400)
