"""A table of hostile inputs, one row per class that issue 19 found (and a few neighbours), against a real uvicorn
server on 127.0.0.1: each gets the status it deserves in OpenAI's error envelope, never a 5xx, and after the whole
table the server is ready with its capacity at baseline. Then a load burst beyond the queue: every answer is 200
or 429 in the envelope, and capacity returns to baseline.

Bodies go out as raw bytes (`json.dumps` escapes lone surrogates as `\\ud800`, as a hostile client would send
them); the big ones stay under the 8 MiB body limit so that the size checks behind it are what answers.
"""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from ninfer.serve.app import create_app
from ninfer.serve.state import ServerState

from .conftest import ThreadServer
from .robustness import assert_baseline, check_answer

CHAT, COMPLETE, TOKENIZE, DETOKENIZE = "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"
HI = [{"role": "user", "content": "hi"}]
ONE_TOKEN_GRAMMAR = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"const": 1}}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                     "properties": {"x": {"type": "integer"}}}}}


def chat(**kw) -> dict:
    return {"messages": HI, "max_tokens": 2, **kw}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_call(depth: int) -> list:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": ' + nested(depth) + "}"}}
    return [*HI, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "ok"},
            {"role": "user", "content": "again"}]


# (id, path, body: dict -> JSON bytes, or bytes as they are, expected status)
ROWS = [
    # sampling parameters out of range (each once killed the Engine or was coerced)
    ("repetition_penalty_1e-300", CHAT, chat(repetition_penalty=1e-300), 400),
    ("top_k_1e9", CHAT, chat(top_k=10**9), 400),
    ("top_k_2^63", CHAT, chat(top_k=2**63), 400),
    ("seed_2^64", CHAT, chat(seed=2**64), 400),
    ("temperature_negative", CHAT, chat(temperature=-1), 400),
    ("temperature_nan", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400),
    ("temperature_inf", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', 400),
    ("temperature_string", CHAT, chat(temperature="0.5"), 400),
    ("max_tokens_bool", CHAT, chat(max_tokens=True), 400),
    ("max_tokens_float", COMPLETE, {"prompt": "hi", "max_tokens": 1e3}, 400),
    ("max_tokens_1e12", CHAT, chat(max_tokens=10**12), 400),
    ("max_tokens_negative", COMPLETE, {"prompt": "hi", "max_tokens": -1}, 400),
    ("presence_penalty_3", CHAT, chat(presence_penalty=3), 400),
    ("frequency_penalty_-3", CHAT, chat(frequency_penalty=-3), 400),
    ("min_p_2", CHAT, chat(min_p=2), 400),
    ("n_0", CHAT, chat(n=0), 400),
    ("n_100", CHAT, chat(n=100), 400),
    ("top_logprobs_100", CHAT, chat(logprobs=True, top_logprobs=100), 400),
    ("stop_100_strings", CHAT, chat(stop=[f"s{i}" for i in range(100)]), 400),
    ("stop_empty_string", CHAT, chat(stop=[""]), 400),
    ("stop_token_ids_outside", CHAT, chat(stop_token_ids=[10**9]), 400),
    # logit_bias keys must be canonical in-vocabulary ids
    ("logit_bias_outside_vocab", CHAT, chat(logit_bias={"999999999": 1}), 400),
    ("logit_bias_underscore", CHAT, chat(logit_bias={"1_000": 1}), 400),
    ("logit_bias_leading_zero", CHAT, chat(logit_bias={"05": 1}), 400),
    ("logit_bias_word", CHAT, chat(logit_bias={"abc": 1}), 400),
    ("logit_bias_value_inf", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 1e999}}',
     400),
    # a grammar that allows one token, with min_tokens and stop ids that forbid it: ends alone or is refused
    ("grammar_min_tokens_stop_ids", CHAT, chat(response_format=ONE_TOKEN_GRAMMAR, min_tokens=3,
                                               stop_token_ids=[16]), {200, 400}),
    # lone surrogates everywhere text goes
    ("surrogate_message", CHAT, {"messages": [{"role": "user", "content": "a\ud800b"}]}, 400),
    ("surrogate_prompt", COMPLETE, {"prompt": "\udfff", "max_tokens": 1}, 400),
    ("surrogate_tokenize", TOKENIZE, {"prompt": "x\ud800"}, 400),
    ("surrogate_model", CHAT, chat(model="m\ud800"), 400),
    ("surrogate_stop", CHAT, chat(stop=["\ud800"]), 400),
    ("surrogate_tool_name", CHAT, chat(tools=[{"type": "function", "function": {"name": "f\ud800"}}]), 400),
    ("surrogate_schema_key", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "object", "properties": {"\ud800": {"type": "string"}}}}}), 400),
    # depth
    ("body_nested_100k", CHAT, nested(100_000).encode(), 400),
    ("content_nested_5000", CHAT, {"messages": [{"role": "user", "content": json.loads(nested(900))}]}, 400),
    ("tool_arguments_nested_100k", CHAT, {"messages": deep_call(100_000), "max_tokens": 2}, 400),
    ("tool_parameters_nested_500", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": json.loads('{"type": "object", "properties": {"x": ' * 1 + nested(400) + "}}")}}]),
     400),
    # sizes
    ("body_9MiB", CHAT, b'{"messages": [{"role": "user", "content": "' + b"x" * (9 << 20) + b'"}]}', 413),
    ("messages_210k", CHAT, {"messages": [{"role": "user", "content": ""}] * 210_000, "max_tokens": 1}, 400),
    ("prompt_7MiB", COMPLETE, {"prompt": "hello world " * ((7 << 20) // 12), "max_tokens": 1}, 400),
    ("chat_content_7MiB", CHAT, {"messages": [{"role": "user", "content": "ab " * ((7 << 20) // 3)}]}, 400),
    ("tokenize_7MiB", TOKENIZE, {"prompt": "z" * (7 << 20)}, 400),
    ("schema_const_1MB", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"const": "x" * (1 << 20)}}}), 400),
    ("tools_1MB", CHAT, chat(tools=[{"type": "function", "function": {"name": f"f{i}", "description": "d" * 4000}}
                                    for i in range(256)]), 400),
    ("batch_64_prompts_n8", COMPLETE, {"prompt": ["a"] * 64, "n": 8, "max_tokens": 1}, 429),
    ("prompt_list_65", COMPLETE, {"prompt": ["a"] * 65, "max_tokens": 1}, 400),
    ("detokenize_1M_ids", DETOKENIZE, {"tokens": [5] * 1_000_000}, {200, 400}),
    # schemas XGrammar cannot enforce exactly
    ("schema_external_ref", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "object", "properties": {"a": {"$ref": "http://x.test/s.json"}}}}}), 400),
    ("tool_parameters_bogus_type", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "bogus"}}}]), 400),
    ("schema_maxLength_5000", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "string", "maxLength": 5000}}}), 400),
    ("schema_pattern_repeat_20000", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "string", "pattern": "(ab|cd){20000}"}}}), 400),
    ("schema_bad_pattern", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "string", "pattern": "(("}}}), 400),
    ("tool_choice_unknown", CHAT, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
     400),
    # shapes
    ("malformed_json", CHAT, b'{"messages": [', 400),
    ("empty_body", CHAT, b"", 400),
    ("body_array", CHAT, b"[1, 2]", 400),
    ("messages_empty", CHAT, {"messages": []}, 400),
    ("role_unknown", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("content_int", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400),
    ("only_system", CHAT, {"messages": [{"role": "system", "content": "x"}]}, 400),
    ("prompt_ids_negative", COMPLETE, {"prompt": [-1], "max_tokens": 1}, 400),
    ("prompt_ids_huge", COMPLETE, {"prompt": [10**12], "max_tokens": 1}, 400),
    ("prompt_empty", COMPLETE, {"prompt": "", "max_tokens": 1}, 400),
    ("tokenize_both", TOKENIZE, {"prompt": "a", "messages": HI}, 400),
    ("detokenize_negative", DETOKENIZE, {"tokens": [-5]}, 400),
    ("unknown_model", CHAT, chat(model="gpt-9"), 404),
    ("unknown_route", "/v1/embeddings", {"input": "x"}, 404),
]


@pytest.fixture(scope="module")
def served(small_runtime):
    rt = small_runtime
    state = ServerState(rt, rt.name)
    with ThreadServer(create_app(state)) as server:
        yield server, state, rt.engine.core.program.resource_usage()


def _encode(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def test_hostile_inputs_get_their_status_in_the_envelope(served):
    server, state, program_baseline = served
    answers = {}
    with httpx.Client(base_url=server.url, timeout=120, headers={"content-type": "application/json"}) as client:
        for name, path, body, expected in ROWS:
            resp = client.post(path, content=_encode(body))
            check_answer(resp.status_code, resp.content, name)
            answers[name] = resp.status_code
    wrong = {name: answers[name] for name, _, _, expected in ROWS
             if answers[name] not in (expected if isinstance(expected, set) else {expected})}
    assert not wrong, wrong
    assert_baseline(server.url, state)
    assert state.runtime.engine.core.program.resource_usage() == program_baseline


def test_protocol_level_abuse_gets_the_envelope(served):
    """Headers too large for h11, a request line that is not HTTP, and a chunked body over the limit."""
    server, state, _ = served
    for raw in (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 10) + b"\r\n\r\n",
                b"\x16\x03\x01 not http\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(raw)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        check_answer(int(head.split()[1]), body, raw[:20].decode("latin-1"))
        assert int(head.split()[1]) == 400

    def chunks():
        for _ in range(10):
            yield b"x" * (1 << 20)

    resp = httpx.post(f"{server.url}{CHAT}", content=chunks(), headers={"content-type": "application/json"},
                      timeout=60)
    assert resp.status_code == 413
    check_answer(resp.status_code, resp.content, "chunked 10 MiB")
    assert_baseline(server.url, state)


async def _burst(url: str, clients: int) -> list[tuple[int, bytes]]:
    body = {"messages": [{"role": "user", "content": "burst"}], "max_tokens": 4, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def one(i: int):
            resp = await client.post(CHAT, json={**body, "n": 1 + i % 2})
            return resp.status_code, resp.content
        return await asyncio.gather(*(one(i) for i in range(clients)))


@pytest.mark.parametrize("clients", [32, pytest.param(200, marks=pytest.mark.slow)])
def test_load_burst_is_served_or_refused_and_settles(served, clients):
    """More clients at once than lanes plus queue: each is served or gets 429 at once (capacity a refusal never
    took), and afterwards every lane and queue slot is free again."""
    server, state, program_baseline = served
    answers = asyncio.run(_burst(server.url, clients))
    for i, (status, body) in enumerate(answers):
        check_answer(status, body, f"burst client {i}")
        assert status in (200, 429), (i, status, body[:200])
    statuses = [s for s, _ in answers]
    assert statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
    assert_baseline(server.url, state)
    assert state.runtime.engine.core.program.resource_usage() == program_baseline
