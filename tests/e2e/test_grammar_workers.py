"""Grammar compiles run in killable worker processes: one past --grammar-compile-timeout is answered 400 and its
process is killed (its CPU time ends there), a worker killed mid-compile fails only its own request, and the
server keeps answering, structured requests included, throughout and afterwards."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from ninfer.contracts import RequestRejected
from ninfer.frontend.grammar.compiler import GrammarCompiler
from ninfer.frontend.grammar.options import StructuredOutputOptions
from ninfer.serve.app import create_app
from ninfer.serve.state import ServerState

from .conftest import ThreadServer
from .robustness import assert_baseline, check_answer

CHAT = "/v1/chat/completions"
TIMEOUT_S = 1.0


def slow(branches: int) -> dict:
    """Objects of 20 optional patterned strings; XGrammar 0.2.9 compiles one (1.1 KB) for ~6 s on an idle core and
    40 (42 KB, still under the 64 KiB schema bound) for ~2 minutes. ({3,50} is the slow band: {3,200} takes 0.03 s.)"""
    return {"anyOf": [{"type": "object", "properties": {f"{chr(97 + j)}{i}": {"type": "string", "pattern": "[a-z]{3,50}"}
                                                        for j in range(20)}} for i in range(branches)]}


def schema(s: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": s}}


def small(field: str) -> dict:
    return schema({"type": "object", "properties": {field: {"type": "integer"}}, "required": [field]})


def chat(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def timed(_default_model_built):
    """A server with a compile timeout (so its grammars compile in worker processes, started as needed: one here,
    as requests come one at a time); its context holds the slow schema's format instruction (~500 tokens)."""
    from ninfer.runtime_options import RuntimeOptions
    from ninfer.wiring import build_runtime

    rt = build_runtime(RuntimeOptions(max_model_len=2048, max_num_seqs=1, enable_prefix_caching=False,
                                      program="reference", grammar_compile_timeout=TIMEOUT_S), progress=False)
    state = ServerState(rt, rt.name)
    try:
        with ThreadServer(create_app(state)) as server:
            yield server, state, rt.frontend.grammar
    finally:
        rt.close()


def _watch_health(url: str, stop: threading.Event, seen: list[tuple[float, float]]) -> None:
    """(start, end) of each 200 from /health until stop."""
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            t = time.monotonic()
            if client.get("/health").status_code == 200:
                seen.append((t, time.monotonic()))
            time.sleep(0.05)


def test_a_compile_past_the_timeout_is_killed_and_the_server_carries_on(timed):
    server, state, compiler = timed
    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.post(CHAT, json=chat(response_format=small("a"))).status_code == 200  # starts the worker
        [pid] = compiler.workers.pids()["idle"]
        stop, seen = threading.Event(), []
        watcher = threading.Thread(target=_watch_health, args=(server.url, stop, seen))
        watcher.start()
        t = time.monotonic()
        resp = client.post(CHAT, json=chat(response_format=schema(slow(1))))
        took = time.monotonic() - t
        stop.set()
        watcher.join()
        check_answer(resp.status_code, resp.content, "slow schema")
        error = resp.json()["error"]
        assert resp.status_code == 400 and error["code"] == "unrepresentable", error
        assert "--grammar-compile-timeout" in error["message"]
        assert TIMEOUT_S <= took < TIMEOUT_S + 10, took
        assert not alive(pid), "the timed-out compile's process still runs"
        assert compiler.workers.pids()["idle"] and pid not in compiler.workers.pids()["idle"]
        # /health answered while the compile ran (a generous bound: the CI box is loaded)
        assert any(t <= start and end <= t + took for start, end in seen), (t, took, seen)
        assert max(end - start for start, end in seen) < 5.0, seen
        assert client.post(CHAT, json=chat()).status_code == 200
        resp = client.post(CHAT, json=chat(response_format=small("b")))
        assert resp.status_code == 200, resp.text
    assert_baseline(server.url, state)


def test_a_worker_killed_mid_compile_fails_that_request_alone(small_runtime):
    """kill -9 of the worker compiling one request: that request gets a clean rejection naming what happened; a
    compile on the other worker at the same time succeeds, and so do compiles afterwards."""
    compiler = GrammarCompiler(small_runtime.frontend.tokenizer, compile_timeout=600.0, max_threads=2)
    try:
        compiler.compile(StructuredOutputOptions.create(response_format=small("w")), reasoning=False)
        [victim] = compiler.workers.pids()["idle"]  # started and ready: the next compile begins at once
        outcome: dict = {}

        def run(name: str, rf: dict) -> None:
            try:
                outcome[name] = compiler.compile(StructuredOutputOptions.create(response_format=rf), reasoning=False)
            except RequestRejected as e:
                outcome[name] = e

        doomed = threading.Thread(target=run, args=("slow", schema(slow(40))))
        doomed.start()
        while victim not in compiler.workers.pids()["busy"]:
            time.sleep(0.01)
        other = threading.Thread(target=run, args=("other", small("c")))  # on a second worker
        other.start()
        time.sleep(0.5)
        assert doomed.is_alive(), "the slow compile ended on its own"
        os.kill(victim, signal.SIGKILL)
        doomed.join(60)
        other.join(120)
        rejected = outcome["slow"]
        assert isinstance(rejected, RequestRejected), rejected
        assert rejected.message == ("structured output was not compiled: the grammar compiler process was killed "
                                    "by signal 9 before it answered; retry, or simplify the schema")
        assert not isinstance(outcome["other"], RequestRejected), outcome["other"]
        assert not alive(victim)
        after = compiler.new_state(StructuredOutputOptions.create(response_format=small("d")), reasoning=False)
        assert after is not None
        pids = compiler.workers.pids()
        assert len(pids["idle"]) == 2 and victim not in pids["idle"] and not pids["busy"], pids
        # XGrammar's own refusal comes back from the worker cleaned, and leaves the worker in service
        bad = StructuredOutputOptions.create(response_format=schema({"type": "string", "pattern": "(("}))
        with pytest.raises(RequestRejected, match="cannot be compiled") as e:
            compiler.compile(bad, reasoning=False)
        assert ".cc" not in e.value.message and compiler.workers.pids() == pids
        d = StructuredOutputOptions.create(response_format=small("d"))
        assert compiler.compile(d, reasoning=False) is compiler.compile(d, reasoning=False)  # the parent's cache
    finally:
        compiler.close()
    assert not any(alive(p) for p in pids["idle"]), "close() left worker processes"


def test_a_client_that_leaves_kills_its_compile(small_runtime):
    """The preparation pool cancels a running compile whose client went away: its worker process is killed within
    a poll, long before the compile timeout, and the pool and the compiler are free for the next request."""
    import asyncio

    from ninfer.serve.errors import APIError
    from ninfer.serve.prepare import Preparer

    compiler = GrammarCompiler(small_runtime.frontend.tokenizer, compile_timeout=600.0, max_threads=1)
    prep = Preparer(workers=1, backlog=0)
    try:
        compiler.compile(StructuredOutputOptions.create(response_format=small("w")), reasoning=False)
        [victim] = compiler.workers.pids()["idle"]
        leaves = time.monotonic() + 1.0

        async def disconnected() -> bool:
            return time.monotonic() > leaves

        def prepare():
            return compiler.compile(StructuredOutputOptions.create(response_format=schema(slow(40))),
                                    reasoning=False)

        async def request() -> None:
            with pytest.raises(APIError) as e:
                await prep.run(prepare, disconnected=disconnected)
            assert e.value.status == 499

        asyncio.run(request())
        deadline = time.monotonic() + 30
        while (alive(victim) or prep.pending) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(victim), "the compile of a request whose client left still runs"
        assert prep.pending == 0
        after = compiler.new_state(StructuredOutputOptions.create(response_format=small("e")), reasoning=False)
        assert after is not None and victim not in compiler.workers.pids()["idle"]
    finally:
        prep.close()
        compiler.close()
