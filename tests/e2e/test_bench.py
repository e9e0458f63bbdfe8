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


def test_bench_reports_failures(live_server):
    result = CliRunner().invoke(main, ["bench", "serve", "--base-url", live_server.url, "--model", "nope",
                                       "--num-prompts", "2"])
    assert result.exit_code == 1
    assert "HTTP 404" in result.output and "no request completed" in result.output
