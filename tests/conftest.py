"""Hypothesis profiles: `ci` (default, a few minutes in all) and `soak` (long, for release gating).

Select with HYPOTHESIS_PROFILE=soak.
"""

import os

# Triton kernels run in the interpreter on CPU; it must be chosen before anything imports triton.
if os.environ.get("NINFER_TEST_DEVICE") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("soak", deadline=None, max_examples=5000, stateful_step_count=120,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory):
    """One cache directory per test session: the tokenizer JSON and the default model are built once in it."""
    path = tmp_path_factory.getbasetemp() / "ninfer-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(session_cache_dir):
    """No test writes to the user's cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("NINFER_CACHE_DIR", str(session_cache_dir))
    yield
    mp.undo()
