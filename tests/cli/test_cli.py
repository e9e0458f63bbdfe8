"""The `ninfer` commands that run a model, in-process through click's runner with the embedded random model."""

from __future__ import annotations

import json

import pytest

from cli_helpers import SMALL


def test_help_lists_commands_and_env_vars(run):
    out = run("--help").output
    for cmd in ("generate", "chat", "serve", "score", "bench", "convert", "inspect", "oracle"):
        assert cmd in out
    serve_help = run("serve", "--help").output
    for flag in ("--host", "--port", "--served-model-name", "--max-model-len", "--context-length", "--max-num-seqs",
                 "--gpu-memory-utilization", "--api-key", "--no-enable-prefix-caching", "--speculative-config",
                 "--default-chat-template-kwargs", "--seed", "--purpose", "--program", "--model-id",
                 "--concurrent-prefill", "--cache-device-share", "--kv-offloading-size", "NINFER_CONCURRENT_PREFILL",
                 "--async-scheduling", "--no-async-scheduling", "NINFER_ASYNC_SCHEDULING",
                 "NINFER_CACHE_DEVICE_SHARE", "NINFER_KV_OFFLOADING_SIZE", "NINFER_PORT", "NINFER_MAX_NUM_SEQS",
                 "--enforce-eager", "NINFER_ENFORCE_EAGER"):
        assert flag in serve_help, flag


def test_generate_streams_and_says_the_weights_are_random(run):
    result = run("generate", "Hello", "-n", "3", "--no-think", *SMALL)
    assert result.exit_code == 0, result.output
    assert "RANDOM weights" in result.stderr and "ready:" in result.stderr
    assert "3 generated" in result.stderr and "finish=length" in result.stderr


def test_enforce_eager_says_the_fast_program_runs_without_graphs(run):
    result = run("generate", "Hello", "-n", "2", "--no-think", "--program", "fast", "--devices", "cpu",
                 "--enforce-eager", *SMALL)
    assert result.exit_code == 0, result.output
    assert "generation on the fast Program" in result.stderr and "| eager (no CUDA graphs) |" in result.stderr


def test_generate_shows_reasoning_apart(run):
    result = run("generate", "Hello", "-n", "2", "--think", *SMALL)
    assert result.exit_code == 0
    assert "[thinking]" in result.stderr  # thinking on: the tokens are reasoning, dimmed on stderr
    assert result.stdout.strip() == ""  # and never mixed into the answer on stdout


def test_chat_keeps_history_and_switches_thinking(run):
    result = run("chat", "-n", "2", *SMALL, input="hi\n/no_think\nagain\n/exit\n")
    assert result.exit_code == 0, result.output
    stats = [line for line in result.stderr.splitlines() if "prompt tokens" in line]
    assert len(stats) == 2
    first, second = (int(s.split("[")[1].split()[0]) for s in stats)
    assert second > first  # the second turn's prompt carries the first turn
    assert "thinking off" in result.stderr


def test_bad_options_fail_cleanly(run):
    fast = run("generate", "x", "--program", "fast", *SMALL)
    assert fast.exit_code == 6 and "error: --program fast is not available" in fast.stderr
    assert "hint: use --program reference" in fast.stderr
    bad_env = run("generate", "x", env={"NINFER_MAX_NUM_SEQS": "9"})
    assert bad_env.exit_code == 2 and "NINFER_MAX_NUM_SEQS" in bad_env.stderr
    spec = run("generate", "x", "--speculative-config", "{nope", *SMALL)
    assert spec.exit_code == 2 and "error: --speculative-config is not valid JSON" in spec.stderr
    mtp = run("generate", "x", "--speculative-config", '{"method": "mtp"}', *SMALL)
    assert mtp.exit_code == 2 and "num_speculative_tokens: required" in mtp.stderr
    far = run("generate", "x", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 9}', *SMALL)
    assert far.exit_code == 2 and "num_speculative_tokens: must be an int in 1..7" in far.stderr
    eagle = run("generate", "x", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}', *SMALL)
    assert eagle.exit_code == 2 and "method: unknown method 'eagle'" in eagle.stderr


def test_generate_with_mtp_says_so_and_equals_the_plain_run(run):
    plain = run("generate", "Hello", "-n", "6", "--no-think", "--temperature", "0", *SMALL)
    spec = run("generate", "Hello", "-n", "6", "--no-think", "--temperature", "0", "--speculative-config",
               '{"method": "mtp", "num_speculative_tokens": 3}', *SMALL)
    assert spec.exit_code == 0, spec.output
    assert "speculative mtp (k=3)" in spec.stderr and "speculative" not in plain.stderr
    assert spec.stdout == plain.stdout


def test_generate_with_dflash_says_so_and_equals_the_plain_run(run, default_model, tmp_path):
    """The embedded model plus a random DFlash drafter (what `convert --drafter` stores): the ready line names the
    backend and greedy output is the plain run's; without the drafter the start-up error names the method."""
    from ninfer.testing.drafters import with_drafter

    model = str(with_drafter(default_model, tmp_path / "d.ninfer", "dflash", block_size=8))
    args = ("generate", "Hello", "-n", "6", "--no-think", "--temperature", "0", "--model", model, *SMALL)
    plain = run(*args)
    spec = run(*args, "--speculative-config", '{"method": "dflash", "num_speculative_tokens": 7}')
    assert spec.exit_code == 0, spec.output
    assert "speculative dflash (k=7)" in spec.stderr and spec.stdout == plain.stdout
    bare = run("generate", "x", "--speculative-config", '{"method": "dflash2", "num_speculative_tokens": 7}', *SMALL)
    assert bare.exit_code == 2 and "method: 'dflash2' needs a dflash2 drafter" in bare.stderr


def test_env_vars_mirror_flags(run):
    result = run("generate", "x", "-n", "1", "--no-progress", env={"NINFER_MAX_MODEL_LEN": "128",
                                                                   "NINFER_SERVED_MODEL_NAME": "my-model"})
    assert result.exit_code == 0
    assert "ready: my-model" in result.stderr and "context 128" in result.stderr


def test_score_jsonl(run, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "hello world again"}) + "\n\n" + json.dumps({"tokens": [5]}) + "\n"
                   + "not json\n")
    result = run("score", str(src), "--no-progress", "--score-window", "8")
    assert result.exit_code == 1 and "1 line(s) could not be scored" in result.stderr
    # The failed line is named on stderr with its reason, not only counted.
    assert "line 4: not valid JSON (Expecting value at column 1)" in result.stderr.splitlines()
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows[0]["id"] == "a" and rows[0]["logprobs"][0] is None
    assert rows[0]["total_logprob"] == pytest.approx(sum(rows[0]["logprobs"][1:]))
    assert rows[0]["scored_tokens"] == len(rows[0]["tokens"]) - 1 == 2
    assert rows[1]["scored_tokens"] == 0 and rows[1]["total_logprob"] == 0
    assert rows[2] == {"line": 4, "error": rows[2]["error"]}


def test_score_names_deep_and_badly_encoded_lines(run, tmp_path):
    """Lines nested past the JSON bound (even past the parser's own limit) or holding a lone surrogate fail alone,
    with their reason; the good line is still scored."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n' + '{"text": "x", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
                   + '{"text": "x", "meta": ' + "[" * 70 + "]" * 70 + "}\n"
                   + '{"text": "bad \\ud800"}\n' + '{"text": "x", "\\udfff": 1}\n')
    result = run("score", str(src), "--no-progress", "--score-window", "8")
    assert result.exit_code == 1 and "4 line(s) could not be scored" in result.stderr
    for n in (2, 3):
        assert f"line {n}: nested deeper than 64 levels" in result.stderr
    for n in (4, 5):
        assert f"line {n}: " in result.stderr and "lone surrogate" in result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout.splitlines()[0])["scored_tokens"] >= 0
