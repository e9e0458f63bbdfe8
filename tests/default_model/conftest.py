"""Build the default model once per session into a private cache dir (never the home cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer.convert.default_model import default_model_path


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ninfer-cache")


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
