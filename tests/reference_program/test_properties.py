"""The Engine property harness against the reference Program on a tiny fp64 model (fp64 so that a different
chunking or a cache hit cannot flip a near-tie token: the harness compares outputs exactly), without and with the
MTP, DFlash and DFlash2 backends.

With MTP (k = 3) and DFlash2 (k = 7, a draft window of 12) ForcedDrafts forces random acceptance lengths; DFlash
(k = 15) runs its real drafts: random schedules, chunking, cancellation, faults, thinking budgets and prefix hits,
with every greedy request equal to its solo run on the same model without the backend (docs/speculative.md)."""

import functools

import torch
from hypothesis import settings

from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
from ninfer.reference.model import ReferenceModel
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.testing.harness import make_engine_machine
from ninfer.testing.siblings import sibling
from ninfer.testing.speculation import ForcedDrafts


@functools.cache
def _model(mtp: int = 0) -> ReferenceModel:
    conf = sibling(__file__, "conftest.py")
    cfg = conf.tiny_config(mtp=mtp)
    features = ("text", "mtp") if mtp else ("text",)
    return ReferenceModel(cfg, conf.tiny_weights(cfg, features=features), dtype=torch.float64)


def _program(model: ReferenceModel | None = None, speculative: SpeculativeConfig | None = None,
             drafter=None) -> ReferenceProgram:
    # Tight pools: 2 lanes of at most 16 pages each and 2 checkpoint slots, so pressure and victims are common.
    config = ReferenceProgramConfig(max_concurrency=2, max_context=64, page_size=4, kv_pages=40, checkpoint_slots=2,
                                    host_bytes=1 << 16, dtype=torch.float64, eos_token_ids=(0,),
                                    speculative=speculative)
    return ReferenceProgram(model or _model(), config, drafter)


def _speculative() -> ReferenceProgram:
    return ForcedDrafts(_model(1)).install(_program(_model(1), SpeculativeConfig(SpeculativeMethod.MTP, 3)))


Machine = make_engine_machine(_program, max_concurrency=2)
# 60 examples in CI; the soak profile (5,000) gives 250 here, since each example runs the real model.
Machine.TestCase.settings = settings(settings.default, max_examples=max(60, settings.default.max_examples // 20),
                                    stateful_step_count=30)
TestReferenceEngine = Machine.TestCase

Speculative = make_engine_machine(_speculative, max_concurrency=2, oracle=lambda: _program(_model(1)))
# 30 examples in CI (each speculative round also runs ForcedDrafts' teacher model); 125 in the soak profile.
Speculative.TestCase.settings = settings(settings.default, max_examples=max(30, settings.default.max_examples // 40),
                                         stateful_step_count=30)
TestSpeculativeReferenceEngine = Speculative.TestCase


def _dflash(kind: str, k: int, window: int | None, forced: bool) -> ReferenceProgram:
    program = _program(_model(), SpeculativeConfig(SpeculativeMethod(kind), k, window), _drafter(kind))
    return ForcedDrafts(_model()).install(program) if forced else program


@functools.cache
def _drafter(kind: str):
    from ninfer.testing.drafters import reference_drafter
    return reference_drafter(_model(), kind)


# 15 examples each in CI (a DFlash round runs the drafter, and ForcedDrafts its teacher); 60 in the soak profile.
_dflash_settings = settings(settings.default, max_examples=max(15, settings.default.max_examples // 80),
                            stateful_step_count=30)
DFlash2 = make_engine_machine(lambda: _dflash("dflash2", 7, 12, True), max_concurrency=2, oracle=lambda: _program())
DFlash2.TestCase.settings = _dflash_settings
TestDFlash2ReferenceEngine = DFlash2.TestCase
DFlash = make_engine_machine(lambda: _dflash("dflash", 15, None, False), max_concurrency=2, oracle=lambda: _program())
DFlash.TestCase.settings = _dflash_settings
TestDFlashReferenceEngine = DFlash.TestCase
