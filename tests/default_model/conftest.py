"""Build the default model once per session into a session cache dir (never the home cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer.convert.default_model import default_model_path


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()  # into the session cache dir set by tests/conftest.py


@pytest.fixture(scope="session")
def artifact(model_path: Path):
    from ninfer.artifact import open_artifact

    with open_artifact(model_path, features=("text", "mtp")) as a:
        yield a
