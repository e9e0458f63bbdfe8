"""The Engine property harness against the ToyProgram (fast enough for hundreds of random schedules)."""

from hypothesis import settings

from ninfer.testing.harness import make_engine_machine
from ninfer.testing.toy_program import ToyProgram


def _toy():
    return ToyProgram(max_concurrency=3, total_pages=24, page_size=4, checkpoint_slots=3, draft_tokens=1)


def _toy_small_catalog():
    """One checkpoint slot beyond the lanes' and few pages: every capture displaces, demotes or is refused."""
    return ToyProgram(max_concurrency=2, total_pages=16, page_size=4, checkpoint_slots=1, draft_tokens=1)


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

SmallMachine = make_engine_machine(_toy_small_catalog, max_concurrency=2)
SmallMachine.TestCase.settings = settings(settings.default, max_examples=max(80, settings.default.max_examples // 2),
                                          stateful_step_count=max(60, settings.default.stateful_step_count))
TestSmallCatalogToyEngine = SmallMachine.TestCase
