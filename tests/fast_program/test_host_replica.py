"""A checkpoint resumed from its host replica equals the same checkpoint resumed from the device, token for token
and logprob for logprob, on both Programs: demotion (PLACE to the host) and promotion (PLACE back) move the same
bytes, and the resume from the host goes through the same materialization as the one from the device."""

from __future__ import annotations

import pytest

from ninfer.contracts import ResourceChoice, RowDecision, TransitionKind
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import run_transition as run

LOGPROBS = SamplingParams(temperature=0.0, logprobs=2)


def generate(program, prompt, n, source=None, captures=()):
    """Resume (or start) a sequence, prefill in chunks of 5, decode until n tokens: (handle, tokens, logprobs)."""
    r = run(program, ResourceChoice(TransitionKind.MATERIALIZE, request_id=1, prompt=prompt, max_new_tokens=n,
                                    source=source, captures=captures, sampling=LOGPROBS))
    batch = None
    while batch is None:
        batch = program.prefill(r.handle, 5)
    tokens, lps = [], []
    while True:
        tokens.append(batch.rows[0].tokens[0])
        lps.append(batch.rows[0].logprobs[0])
        program.commit(batch.take(), [RowDecision(1, len(tokens) == n)])
        if len(tokens) == n:
            return r.handle, tokens, lps
        batch = program.decode([r.handle])


@pytest.mark.parametrize("kind", ["reference", "fast"])
def test_resume_from_the_host_replica_equals_resume_from_the_device(make_fast, make_reference, prompt_of, kind):
    program = make_fast() if kind == "fast" else make_reference()
    base = prompt_of(13, seed=3)  # 13 % 4: the resume copies a partial page too
    handle, _, _ = generate(program, base, 2, captures=(len(base),))
    (info,) = run(program, ResourceChoice(TransitionKind.CAPTURE, handle=handle)).published
    run(program, ResourceChoice(TransitionKind.RELEASE, handle=handle))
    prompt = base + prompt_of(6, seed=4)
    runs = []
    for tier in ("device", "host", "device again"):
        if tier != "device":
            run(program, ResourceChoice(TransitionKind.PLACE, source=info.id))  # demote, then promote back
        on_device = program.checkpoint_info(info.id).on_device
        assert on_device == (tier != "host")
        h, tokens, lps = generate(program, prompt, 5, source=info.id)
        runs.append((tokens, lps))
        run(program, ResourceChoice(TransitionKind.RELEASE, handle=h))
    assert runs[0] == runs[1] == runs[2]  # exactly: the replica holds the very bytes of the device state
    usage = program.resource_usage()
    assert usage.checkpoints == 1 and usage.host_checkpoints == 0 and usage.active_sequences == 0
