"""The Gateway's bounds: a rejected batch holds no capacity, bodies are bounded in bytes and time, schemas in size
and compile time, preparation is bounded and cancellable, and errors carry no internals."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading

import pytest

from ninfer.contracts import FinishReason, GenerationResult, Usage
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.frontend.grammar.compiler import GrammarCompiler, user_message
from ninfer.serve.errors import APIError
from ninfer.serve.guard import Guard
from ninfer.serve.limits import ServeLimits
from ninfer.serve.prepare import Preparer
from ninfer.serve.requests import check_result
from ninfer.serve.state import ServerState
from ninfer.testing.toy_program import ToyProgram

HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def envelope(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    return resp.json()["error"]


def test_a_rejected_batch_takes_no_capacity(gen_runtime, make_client):
    """64 prompts x 2 choices against room for 4: refused whole, and nothing stays outstanding even while the
    Engine's worker never runs (an unthreaded Engine): the room is free for the next client at once."""
    toy = ToyProgram(max_concurrency=2, max_context=512, vocab=gen_runtime.frontend.tokenizer.vocab_size)
    engine = Engine(toy, EngineConfig(max_concurrency=2, queue_bound=2), threaded=False)
    rt = dataclasses.replace(gen_runtime, engine=engine)
    c = make_client(rt)
    resp = c.post("/v1/completions", json={"prompt": ["a"] * 64, "n": 2, "max_tokens": 1})
    assert envelope(resp, 429)["code"] == "overloaded"
    assert engine.outstanding == 0 and not engine.core.inbox
    assert len(engine.submit_all([_req(rt)] * 4)) == 4  # the whole room is still there


def _req(rt):
    from ninfer.frontend import OutputOptions
    from ninfer.engine.records import GenerationRequest

    prompt = rt.frontend.prepare_text("x", max_tokens=1)
    return GenerationRequest(prompt.token_ids, rt.frontend.open_session(prompt, OutputOptions(max_tokens=1)),
                             max_tokens=1)


def test_docs_and_openapi_need_the_key_probes_do_not(make_client):
    c = make_client(api_key="sekret")
    for path in ("/docs", "/openapi.json", "/redoc", "/v1/models"):
        assert envelope(c.get(path), 401)["code"] == "invalid_api_key"
        assert c.get(path, headers={"Authorization": "Bearer sekret"}).status_code == 200
    for path in ("/health", "/health/ready", "/metrics"):
        assert c.get(path).status_code == 200


def test_a_slow_body_gets_408(gen_runtime):
    state = ServerState(gen_runtime, "m", limits=ServeLimits(body_read_timeout=0.05))
    sent: list[dict] = []

    async def never() -> dict:
        await asyncio.Event().wait()

    async def send(message: dict) -> None:
        sent.append(message)

    async def app(scope, receive, send):
        raise AssertionError("the app ran before the body arrived")

    scope = {"type": "http", "path": "/v1/chat/completions", "headers": [(b"content-length", b"100")]}
    asyncio.run(Guard(app, state)(scope, never, send))
    assert sent[0]["status"] == 408 and b"body_read_timeout" in sent[1]["body"]


def test_internal_errors_do_not_echo_their_text(make_client, monkeypatch, caplog):
    import ninfer.serve.chat as chat

    def broken(*a, **kw):
        raise KeyError("secret internal detail /src/ninfer/x.py")

    monkeypatch.setattr(chat, "_prepare", broken)
    with caplog.at_level(logging.ERROR, logger="ninfer.serve"):
        err = envelope(make_client().post("/v1/chat/completions", json=HI), 500)
    assert "secret" not in err["message"] and "KeyError" not in err["message"]
    error_id = err["message"].split("error id ")[1].rstrip(")")
    assert any(error_id in r.getMessage() for r in caplog.records)


def test_engine_failure_results_are_generic():
    failed = GenerationResult(3, FinishReason.ERROR, Usage(1, 0, 0), error="engine failed: SamplingError: NaN row")
    with pytest.raises(APIError) as e:
        check_result(failed)
    assert e.value.status == 503 and "SamplingError" not in e.value.message and "error id" in e.value.message
    odd = GenerationResult(4, FinishReason.STOP, Usage(1, 0, 0), error="frontend failed: ValueError: x")
    with pytest.raises(APIError) as e:
        check_result(odd)
    assert e.value.status == 500 and "ValueError" not in e.value.message


def test_xgrammar_messages_lose_their_source_paths(client):
    assert user_message(RuntimeError("[23:15:10] /project/cpp/json_schema_converter.cc:5082: Unsupported type "
                                     '"bogus"\n')) == 'Unsupported type "bogus"'
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "string", "pattern": "(("}}}
    err = envelope(client.post("/v1/chat/completions", json={**HI, "response_format": rf}), 400)
    assert "parenthesis" in err["message"] and ".cc" not in err["message"] and "/project" not in err["message"]


def test_schema_size_is_refused_before_compiling(make_client):
    c = make_client(limits=ServeLimits(max_schema_bytes=1000))
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"const": "x" * 2000}}}
    err = envelope(c.post("/v1/chat/completions", json={**HI, "response_format": rf}), 400)
    assert err["code"] == "schema_too_large" and err["param"] == "response_format"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"const": "y" * 2000}}}]
    err = envelope(c.post("/tokenize", json={"messages": HI["messages"], "tools": tools}), 400)
    assert err["param"] == "tools" and "--max-schema-bytes" in err["message"]


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 5000}, {"type": "string", "minLength": 1001},
                                    {"type": "string", "pattern": "(ab|cd){2000}"},
                                    {"type": "object", "properties": {"a": {"type": "string", "pattern": "x{3,9999}"}}}])
def test_schemas_that_compile_for_minutes_are_refused_first(client, schema):
    """Each of these is a few dozen bytes and would hold a core for seconds to minutes inside XGrammar."""
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    err = envelope(client.post("/v1/chat/completions", json={**HI, "response_format": rf}), 400)
    assert err["code"] == "schema_too_complex" and err["param"] == "response_format"


def test_compile_timeout_refuses_with_its_flag(tok_compiler_inputs):
    tokenizer, options = tok_compiler_inputs
    compiler = GrammarCompiler(tokenizer, compile_timeout=1e-4)
    from ninfer.contracts import RequestRejected

    with pytest.raises(RequestRejected) as e:
        compiler.compile(options, reasoning=False)
    assert "--grammar-compile-timeout" in e.value.message


@pytest.fixture
def tok_compiler_inputs(gen_runtime):
    from ninfer.frontend.grammar.options import StructuredOutputOptions

    # A const this long compiles for a good fraction of a second; the timeout is a ten-thousandth of one.
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"const": "z" * 30000}}}
    return gen_runtime.frontend.tokenizer, StructuredOutputOptions.create(response_format=rf)


def test_preparer_backlog_refuses_and_releases():
    prep = Preparer(workers=1, backlog=0)
    gate = threading.Event()

    async def main():
        first = asyncio.ensure_future(prep.run(gate.wait))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as e:
            await prep.run(lambda: None)
        assert e.value.status == 429
        gate.set()
        assert await first is True
        assert prep.pending == 0
        assert await prep.run(lambda: 5) == 5

    asyncio.run(main())


def test_a_client_that_leaves_drops_its_preparation():
    """Running when the client left: its result (handles) goes to discard; queued: it never runs."""
    prep = Preparer(workers=1, backlog=4)
    gate, ran, discarded = threading.Event(), [], []

    async def gone() -> bool:
        return True

    async def main():
        running = asyncio.ensure_future(prep.run(lambda: (gate.wait(), "handles")[1], disconnected=gone,
                                                 discard=discarded.append))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as e:
            await prep.run(lambda: ran.append(1), disconnected=gone)
        assert e.value.status == 499
        with pytest.raises(APIError):
            await running
        gate.set()
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert discarded == ["handles"] and ran == [] and prep.pending == 0


def test_preparation_past_its_deadline_never_starts():
    import time

    prep, ran = Preparer(workers=1, backlog=1), []
    with pytest.raises(APIError) as e:
        asyncio.run(prep.run(lambda: ran.append(1), deadline=time.monotonic() - 1))
    assert e.value.status == 503 and e.value.code == "queue_timeout" and ran == []


def test_limits_name_their_flags():
    from ninfer.serve.limits import LimitError

    with pytest.raises(LimitError, match="--body-read-timeout"):
        ServeLimits(body_read_timeout=0)
    with pytest.raises(LimitError, match="--request-timeout"):
        ServeLimits(request_timeout=-1)


def test_app_reports_draining(gen_runtime, make_client):
    c = make_client()
    c.app.state.ninfer.draining = True
    assert envelope(c.post("/v1/chat/completions", json=HI), 503)["code"] == "shutting_down"
    assert envelope(c.get("/health/ready"), 503)["code"] == "shutting_down"
    assert c.get("/health").json() == {"status": "draining", "ready": False}

