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

