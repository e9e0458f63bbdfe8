"""Image prompts with a speculative backend on the reference Program (docs/speculative.md, "Images"): greedy with
MTP, DFlash or DFlash2 (real drafts and ForcedDrafts) equals greedy without on prompts with two images, prefill
chunks cut inside them; every draft equals the one computed from scratch with the documented positions (the MTP
pair at p's MRoPE position with the image feature as x_{p+1}'s embedding, the drafter at MRoPE's temporal row and
position + rope_delta); a sampled request resumed from a checkpoint after an image equals its cold run. Over two
pipeline stages (plain, MTP, DFlash, DFlash2) the same requests and the prefix hits equal the single-stage runs."""

from __future__ import annotations

import pytest

pytest.importorskip("PIL.Image")

from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod  # noqa: E402
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig  # noqa: E402
from ninfer.sampling import SamplingParams  # noqa: E402
from ninfer.testing.image_prompts import (ScratchDrafts, assert_prefix_hit_on_an_image_equals_the_cold_run,  # noqa: E402
                                          image_request, multimodal_artifacts, vision_prompt)
from ninfer.testing.serving import assert_drained, serve  # noqa: E402
from ninfer.testing.spec_driving import record_drafts  # noqa: E402
from ninfer.testing.speculation import ForcedDrafts  # noqa: E402
from ninfer.testing.stages import assert_same_stores  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return multimodal_artifacts(tmp_path_factory.mktemp("vs"))


@pytest.fixture(scope="module")
def vp(artifacts):
    return vision_prompt(artifacts["mtp"])


def _program(artifacts, method: str | None, k: int = 0, forced: bool = False, stages: int = 1) -> ReferenceProgram:
    """`stages` 2: two pipeline stages on the CPU, of layers 0-1 (GDN only) and 2-3."""
    spec = None if method is None else SpeculativeConfig(SpeculativeMethod(method), k)
    path = artifacts["mtp" if method is None else method]
    staged = dict(devices=("cpu", "cpu"), stage_layers=(2, 2)) if stages > 1 else {}
    program = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(max_concurrency=2, max_context=256,
                                                                          speculative=spec, **staged), vision=True)
    return ForcedDrafts(program.model, program.executor.vision).install(program) if forced else program


def _requests(vp, **kw):
    return [image_request(vp, (1, 2), [7, 8], 10, **kw), image_request(vp, (3,), [9], 10, sizes=((64, 96),), **kw)]


@pytest.fixture(scope="module")
def plain(artifacts, vp):
    return [r.token_ids for r in serve(_program(artifacts, None), _requests(vp, sampling=GREEDY),
                                       max_concurrency=2, prefill_chunk=7, prefix_caching=False)]


@pytest.mark.parametrize("method, k, forced", [("mtp", 3, False), ("mtp", 3, True), ("dflash", 7, False),
                                               ("dflash", 7, True), ("dflash2", 7, False), ("dflash2", 7, True)])
def test_greedy_with_a_backend_equals_greedy_without(artifacts, vp, plain, method, k, forced):
    program = _program(artifacts, method, k, forced)
    out = serve(program, _requests(vp, sampling=GREEDY), max_concurrency=2, prefill_chunk=7, prefix_caching=False)
    assert [r.token_ids for r in out] == plain and all(len(t) == 10 for t in plain)
    if forced:
        assert sum(r.usage.accepted_draft_tokens for r in out) > 2
    assert_drained(program)


@pytest.mark.parametrize("method", ["mtp", "dflash"])
def test_drafts_equal_the_drafts_from_scratch(artifacts, vp, method):
    """Sampled rows (q compared too) and chunks cut inside the images: the backend state built piece by piece,
    verified and rolled back equals the one-pass computation at the documented positions."""
    program = _program(artifacts, method, 3 if method == "mtp" else 7)
    drafter = None if method == "mtp" else program.drafter
    check = ScratchDrafts(program.model, program.executor.vision, drafter, 8)
    check.install(program)
    sampled = dict(sampling=SamplingParams(temperature=1.0), seed=3)
    serve(program, _requests(vp, **sampled), max_concurrency=2, prefill_chunk=7, prefix_caching=False)
    assert check.checked > 12


@pytest.mark.parametrize("method, k", [("mtp", 3), ("dflash2", 7)])
@pytest.mark.parametrize("where", ["after", "inside"])
def test_a_prefix_hit_on_an_image_equals_the_cold_run(artifacts, vp, method, k, where):
    assert_prefix_hit_on_an_image_equals_the_cold_run(lambda: _program(artifacts, method, k), vp, where, q_tol=1e-4)


@pytest.mark.parametrize("method, k", [(None, 0), ("mtp", 3), ("dflash", 7)])
def test_images_over_two_stages_equal_one_stage(artifacts, vp, method, k):
    """The image features enter at rank 0's embedding, the MRoPE positions reach both stages: sampled requests,
    chunks cut inside the images, the same drafts and tokens as one stage and every page and slot the same bytes."""
    runs, programs = [], [_program(artifacts, method, k, stages=stages) for stages in (1, 2)]
    sampled = dict(sampling=SamplingParams(temperature=1.0), seed=3)
    for program in programs:
        drafts = record_drafts(program) if method else []
        out = serve(program, _requests(vp, **sampled), max_concurrency=2, prefill_chunk=7, prefix_caching=False)
        runs.append((drafts, [(r.token_ids, r.usage.accepted_draft_tokens) for r in out]))
        assert_drained(program)
    assert programs[1].link.passes > 0 and runs[1] == runs[0]
    assert method is None or sum(len(d) for d in runs[0][0]) > 12
    assert_same_stores(*programs)


@pytest.mark.parametrize("method, k, where", [(None, 0, "inside"), ("mtp", 3, "after"), ("dflash2", 7, "inside")])
def test_a_prefix_hit_on_an_image_over_two_stages_equals_one_stages_cold_run(artifacts, vp, method, k, where):
    assert_prefix_hit_on_an_image_equals_the_cold_run(lambda: _program(artifacts, method, k, stages=2), vp, where,
                                                      cold=lambda: _program(artifacts, method, k), q_tol=1e-4)
