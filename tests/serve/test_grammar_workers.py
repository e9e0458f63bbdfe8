"""A grammar compiler process the host refuses to start is a 503 for that request, in OpenAI's envelope, with a
typed reason; the server keeps serving requests without structured output, and grammars again once it can."""

from __future__ import annotations

import dataclasses
import errno

import pytest

import ninfer.frontend.grammar.workers as workers
from ninfer.frontend import Frontend
from ninfer.frontend.grammar.compiler import GrammarCompiler
from ninfer.frontend.grammar.workers import CompilerWorkers, CompileTimeout, WorkerStartFailed

HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
JSON = {**HI, "response_format": {"type": "json_object"}}
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def worker_runtime(gen_runtime):
    """The generation Runtime with a compile timeout (so compiles run in worker processes), one worker at most."""
    tokenizer = gen_runtime.frontend.tokenizer
    compiler = GrammarCompiler(tokenizer, max_threads=1, compile_timeout=60.0)
    frontend = Frontend(tokenizer, max_context=gen_runtime.max_context, grammar=compiler)
    yield dataclasses.replace(gen_runtime, frontend=frontend)
    compiler.close()


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


def test_a_worker_that_cannot_start_is_a_typed_503(worker_runtime, make_client, monkeypatch):
    c = make_client(worker_runtime)
    monkeypatch.setattr(workers.subprocess, "Popen", _refuse(OSError(errno.EAGAIN, "Resource temporarily "
                                                                     "unavailable")))
    for _ in range(2):  # the one worker slot is not leaked by the failed start
        _refused(c, "grammar_overloaded")
    assert c.post(CHAT, json=HI).status_code == 200
    monkeypatch.setattr(workers.subprocess, "Popen", _refuse(OSError(errno.ENOENT, "No such file or directory",
                                                                     "/opt/secret/bin/python3")))
    _refused(c, "grammar_unavailable")
    monkeypatch.undo()
    assert c.post(CHAT, json=JSON).status_code == 200


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
