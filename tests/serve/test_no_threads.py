"""A host out of threads (`RuntimeError: can't start new thread`, an EAGAIN) is the server's overload: the request
gets a 503 `server_overloaded` in OpenAI's envelope, nothing of it stays counted (the preparation pool's slot, the
Engine capacity of handles already submitted), and the server serves the next request as usual."""

from __future__ import annotations

import asyncio
import threading
import time
import types

import pytest

import ninfer.serve.events as events
import ninfer.serve.media as media
from ninfer.serve.errors import APIError
from ninfer.serve.media import MediaPolicy, fetch
from ninfer.serve.prepare import Preparer

CHAT = "/v1/chat/completions"
HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class _NoThreads(threading.Thread):
    """A Thread whose start fails as CPython's does when the host refuses a new thread."""

    def start(self):
        raise RuntimeError("can't start new thread")


def _overloaded(resp) -> None:
    assert resp.status_code == 503, resp.text
    err = resp.json()["error"]
    assert err["code"] == "server_overloaded" and err["type"] == "service_unavailable_error"
    assert "can't start" not in err["message"]  # the detail is the log's
    assert resp.headers["Retry-After"] == "1"


def test_a_preparation_thread_that_cannot_start_frees_its_slot(monkeypatch):
    prep = Preparer(workers=1, backlog=0)

    def refuse(fn):
        raise RuntimeError("can't start new thread")

    async def main():
        monkeypatch.setattr(prep._pool, "submit", refuse)
        for _ in range(2):  # the one slot is not leaked: a second try is not a 429
            with pytest.raises(APIError) as e:
                await prep.run(lambda: 5)
            assert e.value.status == 503 and e.value.code == "server_overloaded"
        assert prep.pending == 0
        monkeypatch.undo()
        assert await prep.run(lambda: 5) == 5

    asyncio.run(main())
    prep.close()



def test_a_refused_preparation_never_runs_on_a_thread_already_there(monkeypatch):
    """CPython's pool queues the job before it starts the thread the host refuses: a worker already running must
    not take it later (its Engine submission would outlive the request's 503, holding capacity for nobody)."""
    import concurrent.futures.thread as pool_threads

    prep, gate, ran = Preparer(workers=2, backlog=2), threading.Event(), []

    async def main():
        first = asyncio.ensure_future(prep.run(gate.wait))  # the pool's one thread, busy
        await asyncio.sleep(0.1)
        monkeypatch.setattr(pool_threads, "threading", types.SimpleNamespace(**{**vars(threading),
                                                                                "Thread": _NoThreads}))
        with pytest.raises(APIError) as e:
            await prep.run(lambda: ran.append("ran"))
        assert e.value.status == 503 and e.value.code == "server_overloaded"
        monkeypatch.undo()
        gate.set()
        assert await first is True
        await asyncio.sleep(0.2)  # the thread has taken whatever the pool's queue still held
        assert ran == [] and prep.pending == 0

    asyncio.run(main())
    prep.close()

@pytest.mark.parametrize("stream", [False, True])
def test_a_pump_thread_that_cannot_start_is_a_503_and_frees_the_engine(gen_runtime, make_client, monkeypatch,
                                                                        stream):
    c = make_client(gen_runtime)
    monkeypatch.setattr(events, "threading", types.SimpleNamespace(Thread=_NoThreads))
    _overloaded(c.post(CHAT, json={**HI, "n": 2, "stream": stream}))
    deadline = time.monotonic() + 10
    while gen_runtime.engine.outstanding:  # the submitted choices were closed: their capacity comes back
        assert time.monotonic() < deadline, gen_runtime.engine.outstanding
        time.sleep(0.02)
    monkeypatch.undo()
    assert c.post(CHAT, json=HI).status_code == 200


def test_a_fetch_thread_that_cannot_start_is_a_503(monkeypatch):
    monkeypatch.setattr(media, "threading", types.SimpleNamespace(Thread=_NoThreads, Event=threading.Event))
    with pytest.raises(APIError) as e:
        fetch("http://127.0.0.1:9/a.png", "messages[0].content[0]", MediaPolicy(allow_remote=True))
    assert e.value.status == 503 and e.value.code == "server_overloaded"
