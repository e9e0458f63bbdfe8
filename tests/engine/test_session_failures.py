"""A request's OutputSession that fails before a model call (its grammar mask at the prompt's last chunk or at a
decode round, its draft masks, its forced-control suffix, or a suffix outside the vocabulary) ends that request
alone with the reason, as a failed preview does; the other requests of the round are served and the Engine stays
up (the seed: no request can fail the Engine for everyone)."""

import dataclasses

import pytest

from ninfer.contracts import FinishReason
from ninfer.engine.records import GenerationRequest
from ninfer.testing.sessions import TokenSession, token_request
from ninfer.testing.toy_program import ToyProgram


class _Breaks(TokenSession):
    """A TokenSession whose `what` call raises once `after` tokens are committed."""

    def __init__(self, max_tokens: int, what: str, after: int, **kw):
        super().__init__(max_tokens, stop_ids=(), **kw)
        self.what, self.after = what, after

    def _maybe(self) -> None:
        if len(self.tokens) >= self.after:
            raise RuntimeError(f"planted: {self.what}")

    def next_token_mask(self):
        if self.what == "mask":
            self._maybe()
        return super().next_token_mask()

    def draft_masks(self):
        if self.what == "draft_masks":
            self._maybe()
        return super().draft_masks()

    def control_suffix(self):
        if self.what == "control":
            self._maybe()
        return super().control_suffix()


CASES = {  # id: (session, the error it ends with, a speculative Program)
    "mask at the prompt's end": (lambda: _Breaks(8, "mask", 0), "frontend mask failed: planted: mask", False),
    "mask in decode": (lambda: _Breaks(8, "mask", 3), "frontend mask failed: planted: mask", False),
    "draft masks": (lambda: _Breaks(8, "draft_masks", 2), "frontend mask failed: planted: draft_masks", True),
    "control suffix": (lambda: _Breaks(8, "control", 0, think_budget=3), "frontend control suffix failed: planted",
                       False),
    "suffix outside the vocabulary": (lambda: TokenSession(8, stop_ids=(), think_budget=3, think_end=10**6),
                                      "token id 1000000 outside the vocabulary", False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_session_failing_before_its_model_call_ends_its_request_alone(make_engine, case):
    session, error, speculative = CASES[case]
    program = ToyProgram(max_concurrency=2, draft_tokens=3 if speculative else 1)
    if speculative:  # declared, so the Engine asks each row's session for its draft masks
        program.limits = dataclasses.replace(program.limits, speculative="toy (k=3)", draft_tokens=3)
    eng, _ = make_engine(program=program, max_concurrency=2)
    good = eng.submit(token_request(range(10, 30), 8))
    bad = eng.submit(GenerationRequest(tuple(range(40, 60)), session(), 8))
    eng.run_until_idle()
    assert eng.available, eng.failure
    ok, failed = good.result(timeout=0), bad.result(timeout=0)
    assert ok.finish_reason is FinishReason.LENGTH and len(ok.token_ids) == 8
    assert failed.finish_reason is FinishReason.ERROR and error in failed.error, failed.error
    assert program.resource_usage().active_sequences == 0 and eng.outstanding == 0
