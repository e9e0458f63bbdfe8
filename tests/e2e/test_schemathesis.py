"""Schemathesis drives every operation of the server's own OpenAPI schema against a live uvicorn server, one
operation at a time and as stateful sequences along the schema's links (/v1/models -> chat with the model it
names, /tokenize -> /detokenize of the tokens it returned): no request, however odd, may get a 5xx, every error
keeps OpenAI's envelope, and afterwards the server is ready with its capacity at baseline.

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
from ninfer.runtime_options import RuntimeOptions
from ninfer.wiring import build_runtime

from .robustness import assert_baseline, check_answer

@pytest.fixture(scope="module")
def tiny_runtime(_default_model_built):
    rt = build_runtime(RuntimeOptions(max_model_len=48, max_num_seqs=2), progress=False)
    yield rt
    rt.close()


@pytest.mark.parametrize("examples, time_box_s", [(12, 90.0), pytest.param(150, 900.0, marks=pytest.mark.slow)])
def test_no_server_errors(tiny_runtime, thread_server, examples, time_box_s):
    state = ServerState(tiny_runtime, tiny_runtime.name)
    with thread_server(create_app(state)) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        operations = [op.ok() for op in schema.get_all_operations()]
        assert len(operations) == 9  # chat, completions, models, health x2, metrics, tokenize, detokenize, info
        deadline = time.monotonic() + time_box_s
        seen: list[tuple[str, int]] = []
        for op in operations:
            _fuzz(op, server.url, deadline, seen, examples)
        assert_baseline(server.url, state)
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
        check_answer(resp.status_code, resp.content, f"{op.method.upper()} {op.path}")

    run()


@pytest.mark.parametrize("scenarios", [6, pytest.param(60, marks=pytest.mark.slow)])
def test_linked_sequences_keep_the_server_whole(tiny_runtime, thread_server, scenarios):
    state = ServerState(tiny_runtime, tiny_runtime.name)
    with thread_server(create_app(state)) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        steps: list[tuple[str, int]] = []

        class Machine(schema.as_state_machine()):
            def get_call_kwargs(self, case):
                return {"base_url": server.url, "timeout": 120}

            def validate_response(self, response, case, additional_checks=None, **kwargs):
                steps.append((case.operation.path, response.status_code))
                check_answer(response.status_code, response.content, f"{case.method} {case.path}")

        Machine.run(settings=settings(max_examples=scenarios, stateful_step_count=4, deadline=None,
                                      database=None, derandomize=True, suppress_health_check=list(HealthCheck)))
        assert_baseline(server.url, state)
    # A link was followed: a chat request drawn from the models list that preceded it.
    assert any(a == ("/v1/models", 200) and b[0] == "/v1/chat/completions" for a, b in zip(steps, steps[1:])), steps
