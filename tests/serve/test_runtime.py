"""Wiring facts the Gateway relies on: warmup leaves no state, overload and Engine failure map to 429/503."""

from __future__ import annotations

from types import SimpleNamespace

from ninfer.contracts import RejectReason, RequestRejected
from ninfer.serve.app import create_app
from ninfer.serve.state import ServerState
from ninfer.runtime_options import RuntimeOptions, WiringError
from ninfer.wiring import build_runtime

HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def test_warmup_leaves_no_checkpoint_or_sequence():
    """The warmup request ran through the public Engine path; with prefix caching on for real requests, a
    checkpoint left by it would be visible here before any request arrives."""
    fresh = build_runtime(RuntimeOptions(max_model_len=128, max_num_seqs=1, enable_prefix_caching=True),
                          progress=False)
    try:
        usage = fresh.engine.core.program.resource_usage()
        assert (usage.checkpoints, usage.active_sequences, usage.sequence_pages) == (0, 0, 0)
        assert usage.free_pages == usage.total_pages and usage.free_slots == usage.total_slots
    finally:
        fresh.close()


def test_async_scheduling_defaults_to_the_fast_program_only():
    """--async-scheduling unset: on for the fast Program, off for the reference one; either flag wins."""
    from ninfer.wiring import _engine_config

    assert _engine_config(RuntimeOptions(), async_default=True).async_scheduling is True
    assert _engine_config(RuntimeOptions(), async_default=False).async_scheduling is False
    assert _engine_config(RuntimeOptions(async_scheduling=False), async_default=True).async_scheduling is False
    assert _engine_config(RuntimeOptions(async_scheduling=True), async_default=False).async_scheduling is True
    fresh = build_runtime(RuntimeOptions(max_model_len=128, max_num_seqs=1, program="reference"), progress=False)
    try:
        assert fresh.engine.core.config.async_scheduling is False
    finally:
        fresh.close()


def test_enforce_eager_reaches_the_fast_program_and_the_ready_line():
    """--enforce-eager builds the fast Program (here on the CPU, --devices cpu) with cuda_graphs off, and the ready
    line says so; the reference Program, which captures nothing anyway, ignores it."""
    sizes = dict(max_model_len=128, max_num_seqs=1, enforce_eager=True, warmup=False)
    fast = build_runtime(RuntimeOptions(program="fast", devices=("cpu",), **sizes), progress=False)
    reference = build_runtime(RuntimeOptions(program="reference", **sizes), progress=False)
    try:
        program = fast.engine.core.program
        assert program.config.cuda_graphs is False and program.runner.use_graphs is False
        assert "| eager (no CUDA graphs) |" in fast.summary() and "eager" not in reference.summary()
    finally:
        fast.close()
        reference.close()


def test_bad_runtime_options_name_the_flag():
    for options, flag in ((RuntimeOptions(max_num_seqs=9), "--max-num-seqs"),
                          (RuntimeOptions(program="gpu"), "--program"),
                          (RuntimeOptions(max_model_len=10 ** 7), "--max-model-len"),
                          (RuntimeOptions(gpu_memory_utilization=0), "--gpu-memory-utilization")):
        try:
            build_runtime(options, progress=False)
        except WiringError as e:
            assert flag in str(e)
        else:
            raise AssertionError(f"{options} was accepted")


def test_overload_is_429_with_retry_after(make_client, gen_runtime, monkeypatch):
    def full(requests):
        raise RequestRejected(RejectReason.OVERLOADED, "68 requests outstanding (limit 68)")

    monkeypatch.setattr(gen_runtime.engine, "submit_all", full)
    resp = make_client().post("/v1/chat/completions", json=HI)
    assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "overloaded"


def test_engine_failure_maps_to_503_on_every_probe_without_its_text():
    broken = SimpleNamespace(available=False, failure="EngineFailure: stale handle", engine=None, scorer=None)
    from fastapi.testclient import TestClient

    c = TestClient(create_app(ServerState(broken, "m")), raise_server_exceptions=False)
    resp = c.get("/health/ready")
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
    assert c.post("/v1/chat/completions", json=HI).status_code == 503
    health = c.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "engine_failed"
    for r in (resp, health):
        assert "stale handle" not in r.text and "EngineFailure" not in r.text
