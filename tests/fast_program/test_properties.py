"""The Engine property harness against the fast Program on the tiny fp32 model (eos 0): random schedules with
shared prefixes, session turns, cancellations, deadlines, thinking budgets and injected faults; schedule invariance
against solo runs, and every page and slot not held by a checkpoint free again at teardown. The prefill graphs'
twin checks the padded pieces against a Program whose every prefill piece is eager. The speculative twin
runs the MTP backend (k = 3) behind ForcedDrafts, every greedy request equal to its solo run without the backend;
the DFlash twins run DFlash2 (k = 7, a draft window of 12) behind ForcedDrafts (the drafter context still advanced)
and DFlash (k = 15) with its real drafts.

Tight pools (2 lanes of at most 16 pages, 40 pages, 2 checkpoint slots) make pressure and victims common. On CPU
the naive kernels run (the Triton interpreter would take hours here); on the GPU the Triton kernels."""

import functools

import torch
from hypothesis import settings

from ninfer.fast.program import FastProgram, FastProgramConfig
from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
from ninfer.reference.model import ReferenceModel
from ninfer.testing.harness import make_engine_machine
from ninfer.testing.siblings import sibling
from ninfer.testing.spec_driving import drafts_on_device
from ninfer.testing.speculation import ForcedDrafts


@functools.cache
def _conftest():
    conf = sibling(__file__, "conftest.py")
    cfg = conf.tiny_config()
    return conf, cfg, conf.tiny_weights(cfg)


@functools.cache
def _mtp_weights():
    conf = _conftest()[0]
    cfg = conf.tiny_config(mtp=1)
    return cfg, conf.tiny_weights(cfg, features=("text", "mtp"))


def _program(mtp: bool = False, speculative: SpeculativeConfig | None = None,
             prefill_graph_tokens: int = 512) -> FastProgram:
    conf, cfg, weights = _conftest()
    if mtp:
        cfg, weights = _mtp_weights()
    config = FastProgramConfig(max_concurrency=2, max_context=64, page_size=4, kv_pages=40, checkpoint_slots=2,
                               host_bytes=1 << 16, dtype=torch.float32, eos_token_ids=(0,), speculative=speculative,
                               prefill_graph_tokens=prefill_graph_tokens)
    return FastProgram.build(cfg, weights.__getitem__, config, budget_bytes=conf.BUDGET, device=conf.DEVICE,
                             kernels="triton" if conf.ON_GPU else "naive")


@functools.cache
def _teacher() -> ReferenceModel:
    cfg, weights = _mtp_weights()
    return ReferenceModel(cfg, weights, dtype=torch.float32)


def _speculative() -> FastProgram:
    return ForcedDrafts(_teacher()).install(_program(True, SpeculativeConfig(SpeculativeMethod.MTP, 3, adaptive=False)))


def _speculative_on_device() -> FastProgram:
    """ForcedDrafts' blocks as a device `DraftBlock`, as the MTP head leaves its drafts: masked rounds take their rows
    from the prefix masks' fill over the drafts on the device, and the teacher's drafts are accepted deep into a
    block, so rows past a block's first are read."""
    program = _speculative()
    drafts_on_device(program)
    return program


def _dflash(kind: str, k: int, window: int | None, forced: bool) -> FastProgram:
    from ninfer.models.qwen3_5.drafter import DrafterConfig
    from ninfer.testing.drafters import drafter_hf_config, drafter_tensors

    conf, cfg, weights = _conftest()
    drafter = DrafterConfig.from_hf(drafter_hf_config(cfg, kind))
    source = {**weights, **drafter_tensors(drafter, 1)}
    config = FastProgramConfig(max_concurrency=2, max_context=64, page_size=4, kv_pages=40, checkpoint_slots=2,
                               host_bytes=1 << 16, dtype=torch.float32, eos_token_ids=(0,),
                               speculative=SpeculativeConfig(SpeculativeMethod(kind), k, window, adaptive=False))
    program = FastProgram.build(cfg, source.__getitem__, config, budget_bytes=conf.BUDGET, device=conf.DEVICE,
                                kernels="triton" if conf.ON_GPU else "naive", drafter=drafter)
    return ForcedDrafts(ReferenceModel(cfg, weights, dtype=torch.float32)).install(program) if forced else program


Machine = make_engine_machine(_program, max_concurrency=2)
# CI: 60 examples on CPU (~10 s with the naive kernels), 15 on the GPU (each example builds Programs and captures
# their decode graphs); the soak profile (5,000) gives 250 here.
_CI_EXAMPLES = 15 if _conftest()[0].ON_GPU else 60
Machine.TestCase.settings = settings(settings.default,
                                    max_examples=max(_CI_EXAMPLES, settings.default.max_examples // 20),
                                    stateful_step_count=30)
TestFastEngine = Machine.TestCase

# Prefill pieces padded to the graph bucket (64 tokens: the context's) against every piece eager: each greedy request
# equal to its solo run on a Program without prefill graphs
PrefillGraphs = make_engine_machine(_program, max_concurrency=2, oracle=lambda: _program(prefill_graph_tokens=0))
PrefillGraphs.TestCase.settings = settings(settings.default,
                                           max_examples=max(_CI_EXAMPLES // 2, settings.default.max_examples // 40),
                                           stateful_step_count=30)
TestPrefillGraphsFastEngine = PrefillGraphs.TestCase

Speculative = make_engine_machine(_speculative_on_device, max_concurrency=2, oracle=lambda: _program(True),
                                  grammar_rows=True)
# 30 examples on CPU (each speculative round also runs ForcedDrafts' teacher model), 8 on the GPU
Speculative.TestCase.settings = settings(settings.default,
                                         max_examples=max(8 if _conftest()[0].ON_GPU else 30,
                                                          settings.default.max_examples // 40),
                                         stateful_step_count=30)
TestSpeculativeFastEngine = Speculative.TestCase

# Async scheduling: decode rounds launched ahead of the host's commit, adopted or rolled back (docs/engine.md
# "Async scheduling"); every request must equal its solo run on a synchronous Engine. Some requests are masked at
# every other token, so masked rounds fall back to synchronous and a launched step meets a masked round.
Async = make_engine_machine(_program, max_concurrency=2, async_scheduling=True, grammar_rows=True)
Async.TestCase.settings = settings(settings.default,
                                   max_examples=max(_CI_EXAMPLES, settings.default.max_examples // 20),
                                   stateful_step_count=30)
TestAsyncFastEngine = Async.TestCase

# Async scheduling with MTP: whole speculative rounds launched ahead (draft, verify, device acceptance), adopted or
# rolled back; every request equal to its solo run on a synchronous Engine and, greedy, on the plain Program
AsyncSpeculative = make_engine_machine(_speculative, max_concurrency=2, async_scheduling=True, grammar_rows=True,
                                       oracle=lambda: _program(True))
AsyncSpeculative.TestCase.settings = Speculative.TestCase.settings
TestAsyncSpeculativeFastEngine = AsyncSpeculative.TestCase

# 15 examples each on CPU (a DFlash round runs the drafter, and ForcedDrafts its teacher), 5 on the GPU
_dflash_settings = settings(settings.default, max_examples=max(5 if _conftest()[0].ON_GPU else 15,
                                                               settings.default.max_examples // 80),
                            stateful_step_count=30)
DFlash2 = make_engine_machine(lambda: _dflash("dflash2", 7, 12, True), max_concurrency=2, oracle=lambda: _program())
DFlash2.TestCase.settings = _dflash_settings
TestDFlash2FastEngine = DFlash2.TestCase
# the drafter's own device drafts; some requests masked at every other token, so the schedules also cross rounds
# whose rows come from the prefix masks' fill (`PrefixMasks`: a few such rows per run; its own tests plant its bugs)
DFlash = make_engine_machine(lambda: _dflash("dflash", 15, None, False), max_concurrency=2, oracle=lambda: _program(),
                             grammar_rows=True)
DFlash.TestCase.settings = _dflash_settings
TestDFlashFastEngine = DFlash.TestCase
