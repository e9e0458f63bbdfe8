"""Expected failures reach the user as one `error: <what> (<where>)` line (plus a hint), with a documented exit
status; the traceback only under --debug or NINFER_DEBUG=1; `ninfer serve` exits before binding its port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from cli_helpers import SMALL, edited_checkpoint
from click.testing import CliRunner

from ninfer.cli import main
from ninfer.errors import ExitCode


def _error_lines(stderr: str) -> list[str]:
    """stderr without the one-off notes (conversion, progress): the error line and its hint."""
    return [line for line in stderr.splitlines() if line.startswith(("error:", "hint:", "Traceback", "  File"))]


def assert_one_line(result, code: ExitCode, *fragments: str) -> str:
    lines = _error_lines(result.stderr)
    assert result.exit_code == code, result.output
    assert lines and lines[0].startswith("error: "), result.stderr
    assert len(lines) <= 2 and all(line.startswith("hint: ") for line in lines[1:]), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_missing_model_file(run, tmp_path):
    missing = str(tmp_path / "nope.ninfer")
    assert_one_line(run("generate", missing, "hi", *SMALL), ExitCode.NOT_FOUND, "no such model", f"({missing})")


def test_missing_directories(run, tmp_path):
    missing = str(tmp_path / "no-checkpoint")
    for args in (["convert", missing, str(tmp_path / "out.ninfer")], ["oracle", "hf", "--checkpoint", missing],
                 ["inspect", missing]):
        assert_one_line(run(*args), ExitCode.NOT_FOUND, f"({missing})")


def test_corrupted_artifact(run, corrupt_model):
    assert_one_line(run("chat", str(corrupt_model), *SMALL, input="/exit\n"), ExitCode.CORRUPT,
                    "object 'embed_tokens.weight': checksum mismatch", f"({corrupt_model})")
    assert_one_line(run("inspect", "--verify", str(corrupt_model)), ExitCode.CORRUPT, "checksum mismatch")


def test_unknown_architecture(run, tmp_path):
    from ninfer.testing.checkpoints import make_hf_checkpoint

    tiny = make_hf_checkpoint(tmp_path / "tiny", num_layers=2, mtp=False, tokenizer=False)
    ck = edited_checkpoint(tiny, tmp_path / "llama", model_type="llama", architectures=["LlamaForCausalLM"])
    assert_one_line(run("generate", str(ck), "hi", *SMALL), ExitCode.BAD_MODEL, "model_type", "'llama'", f"({ck})")


def test_tokenizer_of_another_family(run, tmp_path):
    from ninfer.testing.checkpoints import make_hf_checkpoint

    ck = make_hf_checkpoint(tmp_path / "bytes-tokenizer", num_layers=2, mtp=False)  # a byte-level tokenizer.json
    result = run("generate", str(ck), "hi", *SMALL)
    assert_one_line(result, ExitCode.BAD_MODEL, "not a Qwen3.5 tokenizer", f"({ck})")
    assert "hint: ninfer runs the Qwen3.5 vocabulary only" in result.stderr


def test_bad_flag_values(run, default_model):
    assert_one_line(run("serve", "--max-num-seqs", "9"), ExitCode.USAGE, "--max-num-seqs", "1<=x<=8")
    assert_one_line(run("generate", "hi", "--speculative-config", "[1]", *SMALL), ExitCode.USAGE,
                    "--speculative-config must be a JSON object")
    assert_one_line(run("generate", "hi", "--max-model-len", "999999", "--no-progress"), ExitCode.USAGE,
                    "--max-model-len 999999 exceeds the model's 262144")


def test_a_bug_is_one_line_too_and_debug_shows_the_traceback(run, monkeypatch, default_model):
    def boom(*_a, **_k):
        raise RuntimeError("boom")

    monkeypatch.setattr("ninfer.convert.inspect.inspect_artifact", boom)
    line = assert_one_line(run("inspect", str(default_model)), ExitCode.INTERNAL)
    assert line == "error: internal error: RuntimeError: boom"
    for args, env in ((["--debug", "inspect", str(default_model)], {}),
                      (["inspect", str(default_model), "--debug"], {}),
                      (["inspect", str(default_model)], {"NINFER_DEBUG": "1"})):
        result = CliRunner().invoke(main, args, env=env)
        assert isinstance(result.exception, RuntimeError) and "error:" not in result.stderr, args


def test_debug_lets_an_expected_failure_through(corrupt_model):
    from ninfer.artifact import ArtifactError

    result = CliRunner().invoke(main, ["inspect", "--verify", str(corrupt_model)], env={"NINFER_DEBUG": "1"})
    assert isinstance(result.exception, ArtifactError)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_refuses_a_model_that_does_not_load_before_binding(corrupt_model):
    port = _free_port()
    env = {**os.environ, "NINFER_DEBUG": ""}
    proc = subprocess.run([sys.executable, "-m", "ninfer.cli", "serve", str(corrupt_model), "--port", str(port),
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == ExitCode.CORRUPT, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: object 'embed_tokens.weight': checksum mismatch"), proc.stderr
    assert lines[1:] == ["hint: convert the checkpoint again, or check the file with `ninfer inspect --verify FILE`"]
    assert "Uvicorn running" not in proc.stderr and "ready:" not in proc.stderr
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_missing_optional_package_names_its_extra(run, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` now fails as on a machine without it
    monkeypatch.setitem(sys.modules, "transformers", None)
    result = run("serve", "--no-progress")
    assert_one_line(result, ExitCode.UNAVAILABLE, "needs the 'uvicorn' package", "(the [serve] extra)")
    assert "hint: pip install -e '.[serve]'" in result.stderr and "ready:" not in result.stderr  # before loading
    ck = tmp_path / "ck"
    ck.mkdir()
    assert_one_line(run("oracle", "hf", "--checkpoint", str(ck)), ExitCode.UNAVAILABLE, "'transformers'",
                    "(the [test] extra)")


def test_serve_on_a_taken_port_fails_before_loading(run):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run("serve", "--port", str(port), "--no-progress")
    assert_one_line(result, ExitCode.UNAVAILABLE, f"cannot listen on 127.0.0.1:{port}", "(--host, --port)")
    assert "ready:" not in result.stderr
