"""Request bodies are parsed and checked on the parser thread, never on the event loop, and the check's shortcut
(skip the encoding pass when the raw text cannot spell a surrogate) agrees with the full check."""

from __future__ import annotations

import json
import threading

import pytest
import starlette.requests

from ninfer.serve import json_body
from ninfer.serve.body_checks import check_json
from ninfer.serve.errors import APIError

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def test_bodies_are_parsed_on_the_parser_thread(client, monkeypatch):
    """Every JSON route's body goes through parse_body on the parser thread; Starlette's own Request.json (which
    FastAPI would await on the event loop) is never called."""
    threads, on_loop, validated = [], [], []
    parse = json_body.parse_body

    def recording(body: bytes, field):
        threads.append(threading.current_thread().name)
        assert field is not None  # every route here takes one body model: it is validated on the thread too
        value, error = parse(body, field)
        validated.append(type(value).__name__)
        return value, error

    async def loop_json(self):
        on_loop.append(self.url.path)
        raise AssertionError("a body was parsed on the event loop")

    monkeypatch.setattr(json_body, "parse_body", recording)
    monkeypatch.setattr(starlette.requests.Request, "json", loop_json)
    assert client.post(CHAT, json={"messages": HI, "max_tokens": 1}).status_code == 200
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).status_code == 200
    assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 200
    resp = client.post(CHAT, content=b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                       headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_encoding"
    assert len(threads) == 4 and all(t.startswith("ninfer-body") for t in threads), threads
    # the refused body stays a dict: the check's refusal comes before validation
    assert validated == ["ChatCompletionRequest", "CompletionRequest", "TokenizeRequest", "dict"], validated
    assert on_loop == []


def test_raw_surrogate_bytes_are_refused(client):
    """UTF-8-shaped bytes of a surrogate (ED A0 80): json.loads decodes them with surrogatepass into a lone one."""
    resp = client.post(CHAT, content=b'{"messages": [{"role": "user", "content": "a\xed\xa0\x80"}]}',
                       headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_encoding" and error["param"] == "messages[0].content"


def _outcome(value, raw=None):
    try:
        check_json(value, raw=raw)
    except APIError as e:
        return e.message
    return None


@pytest.mark.parametrize("raw", [
    b'{"a": "plain"}',
    '{"a": "caf\u00e9 \u4e2d"}'.encode(),
    b'{"a": "\\u00e9\\u4e2d"}',
    b'{"a": "\\ud83d\\ude00"}',  # an escaped pair: one character, fine
    b'{"a": "\\ud800"}',
    b'{"a": ["x", "\\uDFFF"]}',
    b'{"\\udbff": 1}',
    b'{"a": "\\\\ud800"}',  # a backslash, then text: fine, though it looks like an escape
    b'{"a": "\xed\xa0\x80"}',
    b'{"a": "\xed\xbf\xbf"}',
    json.dumps({"a": "\ud800"}, ensure_ascii=False).encode("utf-16", "surrogatepass"),
    json.dumps({"a": "ok"}).encode("utf-16"),
])
def test_the_surrogate_shortcut_agrees_with_the_full_check(raw):
    value = json.loads(raw)
    assert _outcome(value, raw) == _outcome(value)
