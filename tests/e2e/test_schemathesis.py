"""Schemathesis drives every operation of the server's own OpenAPI schema against a live uvicorn server: no
request, however odd, may get a 5xx, and every error keeps OpenAI's envelope.

Bounded: a tiny context (48 tokens) keeps accepted generations short, each operation gets a fixed number of
examples, and the whole run stops drawing new requests once its time box is spent.
"""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.serve.app import create_app
from ninfer.serve.state import ServerState
from ninfer.wiring import RuntimeOptions, build_runtime



@pytest.fixture(scope="module")
def tiny_runtime(_default_model_built):
    rt = build_runtime(RuntimeOptions(max_model_len=48, max_num_seqs=2), progress=False)
    yield rt
    rt.close()


@pytest.mark.parametrize("examples, time_box_s", [(12, 90.0), pytest.param(150, 900.0, marks=pytest.mark.slow)])
def test_no_server_errors(tiny_runtime, thread_server, examples, time_box_s):
    with thread_server(create_app(ServerState(tiny_runtime, tiny_runtime.name))) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        operations = [op.ok() for op in schema.get_all_operations()]
        assert len(operations) == 9  # chat, completions, models, health x2, metrics, tokenize, detokenize, info
        deadline = time.monotonic() + time_box_s
        seen: list[tuple[str, int]] = []
        for op in operations:
            _fuzz(op, server.url, deadline, seen, examples)
    assert seen, "no request was made"
    assert {path for path, _ in seen} >= {"/v1/chat/completions", "/v1/completions", "/tokenize"}


def _fuzz(op, url: str, deadline: float, seen: list, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(), _=st.just(None))
    def run(case, _) -> None:
        if time.monotonic() > deadline:
            return
        resp = case.call(base_url=url, timeout=120)
        seen.append((op.path, resp.status_code))
        assert resp.status_code < 500, f"{op.method.upper()} {op.path} -> {resp.status_code}: {resp.text[:300]}"
        if resp.status_code >= 400:
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}

    run()
