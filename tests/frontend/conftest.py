"""Shared Frontend fixtures: the real Qwen3.5 vocabulary, the vendored template, one grammar compiler.

The tokenizer JSON is built once per session into the session cache dir (the same one tests/tokenizer uses),
so no test touches the home cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ninfer.convert.chat_template import default_chat_template
from ninfer.convert.tokenizer import build_qwen35_tokenizer_json
from ninfer.frontend import Frontend
from ninfer.frontend.tokenizer import Qwen35Tokenizer

# The shared test data (corpus.py, helpers.py) sits beside this file; pytest's import mode may not put it on the path.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tok() -> Qwen35Tokenizer:
    return Qwen35Tokenizer.load(build_qwen35_tokenizer_json())  # session cache dir: tests/conftest.py


@pytest.fixture(scope="session")
def template() -> str:
    return default_chat_template()


@pytest.fixture(scope="session")
def fe(tok, template) -> Frontend:
    """Renders with the checkpoint's Jinja template; builds its grammar compiler on first use."""
    return Frontend(tok, max_context=32768, chat_template=template)


@pytest.fixture(scope="session")
def compiler(fe):
    return fe.grammar


@pytest.fixture(scope="session")
def fe_builtin(tok) -> Frontend:
    """Renders with the built-in Python renderer (a checkpoint without a template)."""
    return Frontend(tok, max_context=32768)
