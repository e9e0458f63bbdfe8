"""One generation Runtime and one scoring Runtime over the embedded random-weight model, shared by the tests;
each test gets a fresh ServerState and TestClient over them."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from ninfer.serve.app import create_app
from ninfer.serve.state import ServerState
from ninfer.runtime_options import RuntimeOptions
from ninfer.wiring import build_runtime


@pytest.fixture(scope="session", autouse=True)
def _two_threads():
    """Tiny model, shared 2-core box: intra-op threads only add contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _share() -> dict:
    """On CUDA each Runtime of these fixtures plans 12% of the card beyond what the process holds already
    (`gpu_memory_utilization` counts the whole card, as vLLM's does), so that the speculative and plain Runtimes
    of a twin test live in one process; on a CPU nothing."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"gpu_memory_utilization": min(1.0, (total - free) / total + 0.12)}


@pytest.fixture(scope="session")
def gen_runtime():
    rt = build_runtime(RuntimeOptions(max_model_len=512, max_num_seqs=2, seed=7, **_share()), progress=False)
    yield rt
    rt.close()


def _teacher(rt, program):
    """ForcedDrafts' teacher: the reference Program's own model, or (the fast Program, on a GPU) the reference
    model over the same artifact, fp32 on the host (drafts it gets wrong only shorten blocks: lossless)."""
    from ninfer.reference.model import ReferenceModel
    from ninfer.reference.weights import load_model

    if isinstance(program.model, ReferenceModel):
        return program.model
    return load_model(rt.model_path, dtype=torch.float32)


@pytest.fixture(scope="session")
def spec_runtime():
    """The generation Runtime with the MTP backend (k = 3) behind ForcedDrafts: drafts are the target's own greedy
    continuation cut at random lengths, so blocks of several tokens (and grammar-rejected drafts) really occur. The
    width is fixed: on a GPU the draft policy's measured costs would turn a tiny model's rounds into plain steps."""
    from ninfer.testing.speculation import ForcedDrafts

    rt = build_runtime(RuntimeOptions(max_model_len=512, max_num_seqs=2, seed=7,
                                      speculative_config={"method": "mtp", "num_speculative_tokens": 3,
                                                          "adaptive": False}, **_share()),
                       progress=False)
    program = rt.engine.core.program
    ForcedDrafts(_teacher(rt, program)).install(program)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def dflash_runtime(tmp_path_factory):
    """The generation Runtime with the DFlash2 backend (k = 7, fixed width as `spec_runtime`'s) on the embedded
    model plus a random drafter; with `forced`, ForcedDrafts in front of it (the drafter's context still advances
    with every token)."""
    from ninfer.convert.default_model import default_model_path
    from ninfer.testing.drafters import with_drafter

    path = with_drafter(default_model_path(), tmp_path_factory.mktemp("dflash") / "m.ninfer", "dflash2", block_size=8)
    rt = build_runtime(RuntimeOptions(model=str(path), max_model_len=512, max_num_seqs=2, seed=7,
                                      speculative_config={"method": "dflash2", "num_speculative_tokens": 7,
                                                          "adaptive": False},
                                      **_share()), progress=False)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def dflash_teacher(dflash_runtime):
    """ForcedDrafts' teacher for the DFlash2 runtime (its target model; the drafter is not read)."""
    return _teacher(dflash_runtime, dflash_runtime.engine.core.program)


@pytest.fixture
def dflash_client(dflash_runtime) -> TestClient:
    return _client(dflash_runtime)


@pytest.fixture(scope="session")
def score_runtime():
    rt = build_runtime(RuntimeOptions(purpose="scoring", max_model_len=256, score_window=64, score_stride=32,
                                      **_share()), progress=False)
    yield rt
    rt.close()


def _client(rt, **kw) -> TestClient:
    state = ServerState(rt, rt.name, **kw)
    return TestClient(create_app(state), raise_server_exceptions=False)


@pytest.fixture
def client(gen_runtime) -> TestClient:
    return _client(gen_runtime)


@pytest.fixture
def make_client(gen_runtime):
    def make(rt=gen_runtime, **kw) -> TestClient:
        return _client(rt, **kw)
    return make


@pytest.fixture
def spec_client(spec_runtime) -> TestClient:
    return _client(spec_runtime)


@pytest.fixture
def score_client(score_runtime) -> TestClient:
    return _client(score_runtime)
