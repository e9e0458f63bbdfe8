import pytest

from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.testing.harness import FakeClock
from ninfer.testing.toy_program import ToyProgram


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make_engine(clock):
    def make(program=None, **cfg):
        program = program or ToyProgram(max_concurrency=cfg.get("max_concurrency", 4))
        cfg.setdefault("check_invariants", True)
        return Engine(program, EngineConfig(**cfg), threaded=False, clock=clock), program
    return make



@pytest.fixture(scope="session")
def frontend():
    """The real Frontend over the Qwen3.5 vocabulary (built once into the session cache dir)."""
    from ninfer.convert.tokenizer import build_qwen35_tokenizer_json
    from ninfer.frontend import Frontend
    from ninfer.frontend.tokenizer import Qwen35Tokenizer

    return Frontend(Qwen35Tokenizer.load(build_qwen35_tokenizer_json()), max_context=256)
