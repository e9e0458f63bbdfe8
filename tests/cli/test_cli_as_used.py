"""The CLI as a newcomer meets it: sampling defaults from the model, the default output budget shrinking to the
context, honest weight labels, refused contradictions, no escape codes or glued lines when stderr is a file, and a
NINFER_* variable behind every option."""

from __future__ import annotations

import re

import click
import pytest
from cli_helpers import SMALL

from ninfer.cli import main
from ninfer.errors import ExitCode

STATS = re.compile(r"\[\d+ prompt tokens(, \d+ cached)?, \d+ generated, finish=\w+, TTFT \d+ ms, [\d.]+ tok/s\]")


def _stats(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "prompt tokens" in line]


def test_first_command_samples_with_the_models_defaults_and_prints_no_blank_answer(run):
    result = run("generate", "Hello, who are you?", "-n", "24", *SMALL)
    assert result.exit_code == 0, result.output
    assert "sampling defaults from the artifact's generation_config.json (temperature 0.6, top_p 0.95, top_k 20)" \
        in result.stderr
    text = result.stderr.split("[thinking] ", 1)[1].split("\n[")[0] + result.stdout
    assert len(text.strip()) > 10 and text.count("\n") < 6  # noise, but not a screen of blank lines


def test_generation_config_none_restores_plain_greedy_defaults(run):
    plain = [run("generate", "Hello", "-n", "6", "--generation-config", "none", *SMALL) for _ in range(2)]
    assert all(r.exit_code == 0 and "plain sampling defaults" in r.stderr for r in plain)
    assert plain[0].stderr.split("ready:")[1].split("\n", 1)[1] .split("[")[1] == \
        plain[1].stderr.split("ready:")[1].split("\n", 1)[1].split("[")[1]  # greedy: the same reasoning twice
    bad = run("generate", "x", "--generation-config", "/nope", *SMALL)
    assert bad.exit_code == ExitCode.NOT_FOUND and "no generation_config.json at /nope" in bad.stderr


def test_the_default_output_budget_shrinks_to_the_context(run):
    for command, extra in (("generate", ["hi"]), ("chat", [])):
        result = run(command, *extra, "--max-model-len", "40", "--no-progress", "--max-num-seqs", "1",
                     input="hi\n/exit\n")
        assert result.exit_code == 0, result.output
        prompt, generated = map(int, re.search(r"\[(\d+) prompt tokens, (\d+) generated", result.stderr).groups())
        assert prompt + generated == 40 and "finish=length" in result.stderr
    explicit = run("generate", "hi", "-n", "256", "--max-model-len", "40", "--no-progress")
    assert explicit.exit_code == 1 and "exceeds the context of 40 tokens" in explicit.stderr


@pytest.mark.parametrize("args", [("generate", "hi", "--purpose", "scoring"), ("chat", "--purpose", "scoring"),
                                  ("score", "--purpose", "generation")])
def test_a_purpose_the_command_cannot_run_is_refused(run, args):
    result = run(*args, *SMALL, input="/exit\n")
    assert result.exit_code == ExitCode.USAGE and "ready:" not in result.stderr
    assert re.search(r"error: `ninfer \w+` runs the \w+ purpose, not \w+ \(--purpose\)", result.stderr)
    env = run(*[a for a in args if a not in ("--purpose", "scoring", "generation")], *SMALL, input="/exit\n",
              env={"NINFER_PURPOSE": args[-1]})
    assert env.exit_code == ExitCode.USAGE


def test_stderr_to_a_file_gets_no_escape_codes_the_stats_own_line_and_honest_weights(run, qwen_checkpoint, tmp_path):
    import shutil

    fresh = shutil.copytree(qwen_checkpoint, tmp_path / "fresh")  # converted here, so its bars would show
    for args in (("generate", str(fresh), "hi", "-n", "5", "--max-num-seqs", "1"),
                 ("generate", "hi", "-n", "5", "--max-model-len", "256")):
        result = run(*args)  # no --no-progress: stderr is not a terminal, so nothing may draw
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.stderr and "\r" not in result.stderr
        assert [STATS.fullmatch(line) is not None for line in _stats(result.stderr)] == [True]
        if str(fresh) in args:  # a checkpoint of fresh random weights is named by its source, never "trained"
            assert "(weights from checkpoint fresh;" in result.stderr and "trained" not in result.stderr
    convert = run("convert", str(qwen_checkpoint), str(tmp_path / "out.ninfer"))
    assert convert.exit_code == 0 and "\r" not in convert.stderr and "\x1b" not in convert.stderr


def test_every_option_of_the_model_commands_has_its_ninfer_variable():
    for name in ("serve", "generate", "chat", "score"):
        command = main.commands[name]
        with click.Context(command) as ctx:
            help_option = command.get_help_option(ctx)
            options = [p for p in command.get_params(ctx) if isinstance(p, click.Option) and p is not help_option]
        missing = [p.opts[0] for p in options if not (isinstance(p.envvar, str) and p.envvar.startswith("NINFER_"))]
        assert not missing, f"{name}: {missing}"


NO_TRITON = """
import sys
sys.modules["triton"] = None  # as on a machine where `pip uninstall triton` removed it
from ninfer.cli import main
from ninfer.frontend import ChatRequest
from ninfer.sampling import SamplingParams
from ninfer.serve.submit import submit
from ninfer.runtime_options import RuntimeOptions
from ninfer.wiring import build_runtime

rt = build_runtime(RuntimeOptions(max_model_len=256, max_num_seqs=1), progress=False)
chat = rt.frontend.prepare_chat(ChatRequest([{"role": "user", "content": "hi"}],
                                            response_format={"type": "json_object"},
                                            chat_template_kwargs={"enable_thinking": False}))
out = submit(rt, chat.prompt, SamplingParams.create(max_tokens=4, seed=1), structured=chat.structured).result(600)
assert out.output.content.startswith("{"), out.output.content
rt.close()
main(["generate", "hi", "-n", "2", "--no-progress", "--max-num-seqs", "1", "--max-model-len", "256"])
"""


def test_the_cpu_path_runs_without_triton():
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NO_TRITON], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 generated" in done.stderr
