"""`ninfer bench serve` against the live server over loopback: every request completes, token counts are exact
(ignore_eos + max_tokens), and the TTFT/TPOT/ITL/E2EL percentiles are reported and ordered. Sampled, not greedy:
the random model's greedy output can repeat one partial-UTF-8 token whose text arrives in a single chunk."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ninfer.cli import main


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_bench_serve(live_server, tmp_path, endpoint):
    out = tmp_path / "result.json"
    result = CliRunner().invoke(main, ["bench", "serve", "--base-url", live_server.url, "--endpoint", endpoint,
                                       "--num-prompts", "4", "--max-concurrency", "2", "--random-input-len", "16",
                                       "--random-output-len", "8", "--temperature", "1",
                                       "--save-result", str(out)])
    assert result.exit_code == 0, result.output
    assert "Serving Benchmark Result" in result.output and "P99 TTFT (ms)" in result.output
    s = json.loads(out.read_text())
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (4, 0, 32)
    if endpoint == "/v1/completions":
        assert s["total_input_tokens"] == 4 * 16  # token-id prompts: exact input length
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < s[f"p50_{name}_ms"] <= s[f"p99_{name}_ms"]
    assert s["mean_ttft_ms"] < s["mean_e2el_ms"]


def test_bench_agent_with_the_reuse_check(live_server, tmp_path):
    """`ninfer bench agent` over loopback: the per-turn table, the reuse after unrelated requests and the targets'
    verdicts, printed and saved."""
    out = tmp_path / "agent.json"
    result = CliRunner().invoke(main, ["bench", "agent", "--base-url", live_server.url, "--turns", "2",
                                       "--concurrency", "1", "--tool-result-len", "4", "--max-tokens", "1",
                                       "--unrelated", "3", "--seed", "5", "--save-result", str(out)])
    assert result.exit_code == 0, result.output
    assert "Agent Benchmark (1 conversation(s))" in result.output and "Agent Benchmark targets" in result.output
    s = json.loads(out.read_text())
    assert [r["turn"] for r in s["runs"]["1"]["turns"]] == [1, 2] and s["reuse"]["failed_unrelated"] == 0
    assert s["reuse"]["reuse"] > 0.9 and len(s["targets"]) == 3
    assert all(("PASS  " if t["pass"] else "FAIL  ") + t["target"] in result.output for t in s["targets"])


def test_bench_reports_failures(live_server):
    result = CliRunner().invoke(main, ["bench", "serve", "--base-url", live_server.url, "--model", "nope",
                                       "--num-prompts", "2"])
    assert result.exit_code == 1
    assert "HTTP 404" in result.output and "no request completed" in result.output


@pytest.fixture
def keyed_server(thread_server):
    """A real ninfer app that wants an API key (the scoring purpose: no warmup, quick to start)."""
    from ninfer.serve.app import create_app
    from ninfer.serve.state import ServerState
    from ninfer.runtime_options import RuntimeOptions
    from ninfer.wiring import build_runtime

    rt = build_runtime(RuntimeOptions(purpose="scoring", max_model_len=128), progress=False)
    try:
        with thread_server(create_app(ServerState(rt, rt.name, api_key="s3cret"))) as server:
            yield server
    finally:
        rt.close()


def _bench(*args: str):
    return CliRunner().invoke(main, ["bench", "serve", "--num-prompts", "1", *args], prog_name="ninfer")


def test_bench_against_a_server_that_wants_a_key_is_one_line(keyed_server):
    result = _bench("--base-url", keyed_server.url)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [
        f"error: the server refused the request (401): invalid or missing API key ({keyed_server.url}/v1/models)",
        "hint: pass the server's key with --api-key (or NINFER_API_KEY)"]
    with_key = _bench("--base-url", keyed_server.url, "--api-key", "s3cret")
    assert "refused" not in with_key.output and "HTTP 400" in with_key.output  # past the key: a scoring server


def test_bench_with_nothing_listening_is_one_line():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago, with nothing listening on it now
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    result = _bench("--base-url", url)
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"error: nothing answers at {url}: ")
    assert lines[0].endswith(f"({url}/v1/models)") and lines[1].startswith("hint: start `ninfer serve`")
