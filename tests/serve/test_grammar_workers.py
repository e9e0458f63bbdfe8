"""A grammar compiler process the host refuses to start is a 503 for that request, in OpenAI's envelope, with a
typed reason; the server keeps serving requests without structured output, and grammars again once it can."""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

import ninfer.frontend.grammar.workers as workers
from ninfer.frontend import Frontend
from ninfer.frontend.grammar.compiler import GrammarCompiler
from ninfer.frontend.grammar.workers import CompilerWorkers, CompileTimeout, WorkerStartFailed

HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
JSON = {**HI, "response_format": {"type": "json_object"}}
CHAT = "/v1/chat/completions"


@pytest.fixture
def compiler(gen_runtime):
    """A compiler with a compile timeout (so compiles run in worker processes), one worker at most; a fresh one
    per test: no idle worker and no cached grammar from an earlier test."""
    compiler = GrammarCompiler(gen_runtime.frontend.tokenizer, max_threads=1, compile_timeout=60.0)
    yield compiler
    compiler.close()


@pytest.fixture
def worker_runtime(gen_runtime, compiler):
    """The generation Runtime over that compiler."""
    frontend = Frontend(gen_runtime.frontend.tokenizer, max_context=gen_runtime.max_context, grammar=compiler)
    return dataclasses.replace(gen_runtime, frontend=frontend)


def _refuse(error: OSError):
    def popen(*args, **kwargs):
        raise error
    return popen


def _refused(c, code: str) -> None:
    resp = c.post(CHAT, json=JSON)
    assert resp.status_code == 503, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["type"] == "service_unavailable_error"
    assert "/opt/secret" not in err["message"] and "Errno" not in err["message"]
    assert resp.headers["Retry-After"] == "1"


def _no_descriptors():
    raise OSError(errno.EMFILE, "Too many open files")


def _spawns(code: str):
    """A Popen that starts `python -c code` in place of the worker, with the worker's descriptors and env."""
    real = subprocess.Popen

    def popen(args, **kwargs):
        return real([sys.executable, "-c", code], **kwargs)
    return popen


class _RefusedThread(threading.Thread):
    def start(self):
        raise RuntimeError("can't start new thread")


def test_every_way_a_worker_fails_to_start_is_a_503(worker_runtime, compiler, make_client, monkeypatch):
    """A spawn the host refuses (EAGAIN: retry, a typed grammar_overloaded; ENOENT: grammar_unavailable, the path
    not shown), no descriptors for its socket pair (EMFILE shows there first, before any spawn), no thread to send
    its setup (the host's thread limit), a process that exits or stalls before it is ready (it never saw the
    grammar): the host's problem (503), never the schema's (400, simplify it) nor a 500. Requests without
    structured output are served meanwhile, and once workers start again the next structured request starts a
    working one (no successor was started under the failing host). One real worker boot, at the end."""
    c = make_client(worker_runtime)
    with monkeypatch.context() as m:
        m.setattr(workers.subprocess, "Popen", _refuse(OSError(errno.EAGAIN, "Resource temporarily unavailable")))
        for _ in range(2):  # the one worker slot is not leaked by the failed start
            _refused(c, "grammar_overloaded")
        assert c.post(CHAT, json=HI).status_code == 200
        m.setattr(workers.subprocess, "Popen", _refuse(OSError(errno.ENOENT, "No such file or directory",
                                                               "/opt/secret/bin/python3")))
        _refused(c, "grammar_unavailable")
    monkeypatch.setattr(workers, "BOOT_TIMEOUT_S", 0.5)
    # only the workers module's view of socket: the test client's event loop needs real socket pairs
    with monkeypatch.context() as m:
        m.setattr(workers, "socket", types.SimpleNamespace(socketpair=_no_descriptors))
        for _ in range(2):  # the one worker slot is not leaked by the failed start
            _refused(c, "grammar_overloaded")
    with monkeypatch.context() as m:  # the worker starts but the thread that sends its setup is refused
        m.setattr(workers, "threading", types.SimpleNamespace(**{**vars(threading), "Thread": _RefusedThread}))
        _refused(c, "grammar_overloaded")
    for code in ("import sys; sys.exit(3)", "import time; time.sleep(60)"):
        with monkeypatch.context() as m:
            m.setattr(workers.subprocess, "Popen", _spawns(code))
            start = time.monotonic()
            _refused(c, "grammar_overloaded")
            # the boot timeout bounds a stalled child that never reads its setup (sleep 60: the send would block)
            assert time.monotonic() - start < 30
    assert c.post(CHAT, json=HI).status_code == 200
    assert compiler.workers.pids() == {"idle": [], "busy": []}
    monkeypatch.undo()
    assert c.post(CHAT, json=JSON).status_code == 200


def test_a_worker_that_ended_while_idle_is_not_handed_out(worker_runtime, compiler, make_client):
    """An idle worker the OOM killer or an operator ended is reaped and replaced, not failed on a request."""
    c = make_client(worker_runtime)
    assert c.post(CHAT, json=JSON).status_code == 200
    pool = compiler.workers
    (pid,) = pool.pids()["idle"]
    os.kill(pid, signal.SIGKILL)
    # dead and waitable, not reaped (WNOWAIT): what the pool finds when the next compile comes
    assert os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT) is not None
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    resp = c.post(CHAT, json={**HI, "response_format": schema})  # not the cached grammar: it needs a worker
    assert resp.status_code == 200, resp.text
    assert pool.pids()["idle"] != [pid]


class _TimesOut:
    """A worker double whose compile times out; the second one the pool builds is refused by the host."""
    built = 0

    def __init__(self, info_json: str, threads: int):
        _TimesOut.built += 1
        if _TimesOut.built > 1:
            raise WorkerStartFailed(OSError(errno.EAGAIN, "Resource temporarily unavailable"))
        self.pid = 1

    def compile(self, tag_json: str, timeout: float | None) -> str:
        raise CompileTimeout()

    def kill(self) -> None:
        pass


def test_a_refused_replacement_keeps_the_callers_outcome(monkeypatch):
    """The worker that timed out is replaced at once; a host that refuses the replacement does not turn the
    caller's timeout into another error, and the next compile gets the typed refusal."""
    monkeypatch.setattr(workers, "_Worker", _TimesOut)
    pool = CompilerWorkers("{}", workers=1)
    with pytest.raises(CompileTimeout):
        pool.compile("{}", 1.0)
    with pytest.raises(WorkerStartFailed) as e:
        pool.compile("{}", 1.0)
    assert e.value.transient
    assert pool.pids() == {"idle": [], "busy": []}
