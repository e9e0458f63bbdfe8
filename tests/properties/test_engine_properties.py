"""The Engine property harness against the ToyProgram (fast enough for hundreds of random schedules)."""

from hypothesis import settings

from ninfer.testing.harness import make_engine_machine
from ninfer.testing.toy_program import ToyProgram


def _toy():
    return ToyProgram(max_concurrency=3, total_pages=24, page_size=4, checkpoint_slots=3, draft_tokens=1)


def _toy_speculative():
    return ToyProgram(max_concurrency=3, total_pages=40, page_size=3, checkpoint_slots=2, draft_tokens=3)


ToyMachine = make_engine_machine(_toy)
ToyMachine.TestCase.settings = settings(settings.default, max_examples=max(150, settings.default.max_examples),
                                        stateful_step_count=max(40, settings.default.stateful_step_count))
TestToyEngine = ToyMachine.TestCase

SpecMachine = make_engine_machine(_toy_speculative, max_concurrency=2)
SpecMachine.TestCase.settings = settings(settings.default, max_examples=max(80, settings.default.max_examples // 2),
                                         stateful_step_count=max(40, settings.default.stateful_step_count))
TestSpeculativeToyEngine = SpecMachine.TestCase
