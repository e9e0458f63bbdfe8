"""Driving the reference Program through its protocol by hand, for its protocol tests: one transition to its
result, materialize with every chunk capture, generate, capture, finish, and the oracle (the model alone)."""

from __future__ import annotations

import torch

from ninfer.contracts import Infeasible, ResourceChoice, RowDecision, TransitionKind
from ninfer.sampling import SamplingParams

LOGPROBS = SamplingParams(temperature=0.0, logprobs=2)
TOL = 1e-5


def run(prog, choice):
    """Plan, start and advance one transition to its result."""
    plan = prog.plan(choice)
    assert not isinstance(plan, Infeasible), plan
    txn = prog.start(plan)
    result = prog.advance(txn)
    while result is None:
        result = prog.advance(txn)
    prog.check_invariants()
    return result


def every_capture(prog, prompt, source):
    """The prompt end, then every multiple of 64 inside the prompt past the source."""
    start = len(prog.ckpts[source].tokens) if source is not None else 0
    return (len(prompt),) + tuple(range((start // 64 + 1) * 64, len(prompt), 64))


def materialize(prog, prompt, max_new=8, source=None, victims=(), sampling=LOGPROBS, captures=None, **kw):
    captures = every_capture(prog, prompt, source) if captures is None else captures
    return run(prog, ResourceChoice(TransitionKind.MATERIALIZE, prompt=tuple(prompt), max_new_tokens=max_new,
                                    source=source, victims=tuple(victims), sampling=sampling, captures=captures,
                                    **kw))


def generate(prog, handle, n, chunk=7):
    """Prefill in chunks, then decode until n tokens are committed: (tokens, logprobs)."""
    batch = None
    while batch is None:
        batch = prog.prefill(handle, chunk)
        prog.check_invariants()
    tokens, lps = [], []
    while True:
        prog.commit(batch.take(), [RowDecision(1, len(tokens) + 1 == n)])
        tokens.append(batch.rows[0].tokens[0])
        lps.append(batch.rows[0].logprobs[0])
        prog.check_invariants()
        if len(tokens) == n:
            return tokens, lps
        batch = prog.decode([handle])


def cold(model, prompt, n):
    """The oracle: the reference model alone, greedy."""
    state = model.new_state()
    logits = model.prefill(torch.tensor(prompt), state)[-1]
    tokens, lps = [], []
    for _ in range(n):
        tokens.append(int(torch.argmax(logits)))
        lps.append(float(torch.log_softmax(logits.double(), -1)[tokens[-1]]))
        logits = model.decode_step(tokens[-1], state)
    return tokens, lps


def assert_same(got, want):
    assert got[0] == want[0]
    assert max(abs(a - b) for a, b in zip(got[1], want[1])) < TOL


def finish(prog, handle, retain_at=None):
    kind = TransitionKind.RETAIN if retain_at is not None else TransitionKind.RELEASE
    return run(prog, ResourceChoice(kind, handle=handle, capture_at=retain_at))


def assert_baseline(prog):
    u = prog.resource_usage()
    assert u.active_sequences == u.reserved_pages == u.sequence_pages == 0, u
    assert u.free_pages + u.checkpoint_pages == u.total_pages, u


def capture(prog, handle):
    return run(prog, ResourceChoice(TransitionKind.CAPTURE, handle=handle)).published


def published(prog, prompt, max_new=8):
    """One request whose prompt end is captured after its first output token, then released: the inactive
    checkpoint it leaves."""
    h = materialize(prog, prompt, max_new=max_new).handle
    generate(prog, h, 1)
    (info,) = capture(prog, h)
    finish(prog, h)
    return info
