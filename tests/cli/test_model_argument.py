"""vLLM's habit: the model as a positional MODEL (or --model) on serve, chat, score and generate, an HF checkpoint
directory or a .ninfer file alike, a checkpoint converted into the cache once and reported once."""

from __future__ import annotations

import json

import pytest
from cli_helpers import SMALL

from ninfer.errors import ExitCode


def test_help_shows_the_positional_model_and_vllm_groups(run):
    for command in ("serve", "chat"):
        assert f"Usage: ninfer {command} [OPTIONS] [MODEL]" in run(command, "--help").output
    assert "[MODEL] PROMPT" in run("generate", "--help").output
    assert "[MODEL] [INPUT]" in run("score", "--help").output
    out = run("serve", "--help").output
    sections = [line for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert sections == ["ModelConfig:", "CacheConfig:", "ParallelConfig:", "SchedulerConfig:", "SpeculativeConfig:",
                        "MultiModalConfig:", "Frontend:", "ninfer:", "Options:"]
    model_config = out.split("ModelConfig:")[1].split("CacheConfig:")[0]
    assert "--max-model-len" in model_config and "--served-model-name" in model_config
    assert "--max-num-seqs" in out.split("SchedulerConfig:")[1].split("SpeculativeConfig:")[0]
    assert "--port" in out.split("Frontend:")[1].split("ninfer:")[0]
    assert "--allowed-local-media-path" in out.split("MultiModalConfig:")[1].split("Frontend:")[0]


# The corrupted artifact fails at load with its own path, so each spelling below proves which model was taken.
@pytest.mark.parametrize("spelling", [
    ("serve", "{bad}"), ("serve", "--model", "{bad}"), ("chat", "{bad}"), ("generate", "{bad}", "hi"),
    ("score", "{bad}"), ("score", "{bad}", "{input}"), ("serve", "{bad}", "--model", "{bad}"),
])
def test_each_command_takes_the_model_positionally_or_as_flag(run, corrupt_model, tmp_path, spelling):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hi"}\n')
    args = [a.format(bad=corrupt_model, input=src) for a in spelling]
    result = run(*args, *SMALL, input="/exit\n")
    assert result.exit_code == ExitCode.CORRUPT, result.output
    assert f"({corrupt_model})" in result.stderr


def test_positional_wins_over_the_environment_but_two_flags_disagreeing_is_an_error(run, corrupt_model,
                                                                                     default_model):
    env = run("chat", str(corrupt_model), *SMALL, input="/exit\n", env={"NINFER_MODEL": str(default_model)})
    assert env.exit_code == ExitCode.CORRUPT
    both = run("serve", str(default_model), "--model", str(corrupt_model))
    assert both.exit_code == ExitCode.USAGE
    assert both.stderr.splitlines()[0] == (f"error: two models named: '{default_model}' and --model "
                                           f"'{corrupt_model}' (MODEL, --model)")
    assert run("generate", "a", "b", "c").exit_code == ExitCode.USAGE
    missing = run("score", str(default_model), "nope.jsonl")
    assert missing.exit_code == ExitCode.NOT_FOUND and "(nope.jsonl)" in missing.stderr


def test_score_reads_a_lone_word_as_input_unless_it_names_a_model(run, default_model, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "hello world again"}) + "\n")
    as_input = run("score", str(src), "--no-progress", "--score-window", "8")
    assert as_input.exit_code == 0 and json.loads(as_input.stdout)["scored_tokens"] == 2
    as_model = run("score", str(default_model), "--no-progress", "--score-window", "8", input=src.read_text())
    assert as_model.exit_code == 0 and as_model.stdout == as_input.stdout


def test_checkpoint_directory_is_converted_once_and_said_so_once(run, qwen_checkpoint):
    # No --no-progress: off a terminal (the runner's stderr is a buffer) no bar is drawn anyway.
    first = run("generate", str(qwen_checkpoint), "hi", "-n", "2", "--no-think", "--max-model-len", "256")
    assert first.exit_code == 0, first.output
    assert "%|" not in first.stderr and "it/s" not in first.stderr
    notes = [line for line in first.stderr.splitlines() if line.startswith("converted ")]
    assert len(notes) == 1 and notes[0].startswith(f"converted {qwen_checkpoint} into the cache, ")
    assert " s (" in notes[0] and "ready: Qwen3_5ForCausalLM" in first.stderr
    again = run("generate", "--model", str(qwen_checkpoint), "hi", "-n", "2", "--no-think", *SMALL)
    assert again.exit_code == 0 and "converted" not in again.stderr and "ready: Qwen3_5ForCausalLM" in again.stderr
    # inspect names a model the same way: the directory's cached conversion
    inspected = run("inspect", str(qwen_checkpoint))
    assert inspected.exit_code == 0 and "Qwen3_5ForCausalLM" in inspected.stdout and "converted" not in inspected.stderr


def test_progress_bars_only_on_a_terminal(monkeypatch):
    import sys

    from ninfer.serve.cli_options import show_progress

    class Terminal:
        def __init__(self, tty: bool):
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    monkeypatch.setattr(sys, "stderr", Terminal(True))
    assert show_progress(False) and not show_progress(True)
    monkeypatch.setattr(sys, "stderr", Terminal(False))
    assert not show_progress(False)
