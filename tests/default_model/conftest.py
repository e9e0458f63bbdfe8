"""Build the default model once per session into a session cache dir (never the home cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer.convert.default_model import default_model_path


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One directory per test session, shared by tests/tokenizer and tests/default_model, so the tokenizer
    # JSON (seconds to build) is built once per session.
    path = tmp_path_factory.getbasetemp() / "ninfer-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def model_path(session_cache_dir: Path) -> Path:
    mp = pytest.MonkeyPatch()
    mp.setenv("NINFER_CACHE_DIR", str(session_cache_dir))
    try:
        return default_model_path()
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def artifact(model_path: Path):
    from ninfer.artifact import open_artifact

    with open_artifact(model_path, features=("text", "mtp")) as a:
        yield a
