"""Image prompts through the Engine on the reference Program with its vision tower: prefill chunks cut inside an
image give the same greedy tokens; a checkpoint after an image is an ordinary checkpoint that a later prompt with the
same image resumes from (identical output to a cold run); a different image at the same place reuses nothing past
it; and a Program without the tower refuses image prompts at submission, naming why."""

from __future__ import annotations

import json

import numpy as np
import pytest

PIL = pytest.importorskip("PIL.Image")

from ninfer.contracts import RequestRejected  # noqa: E402
from ninfer.convert.convert import convert_checkpoint  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.frontend.image_processor import ImageProcessorConfig, process_image  # noqa: E402
from ninfer.frontend.vision_prompt import VisionLimits, VisionPrompt  # noqa: E402
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig  # noqa: E402
from ninfer.testing.checkpoints import TINY_PREPROCESSOR, VISION_TOKEN_IDS, make_hf_checkpoint  # noqa: E402
from ninfer.testing.serving import in_turns, serve  # noqa: E402
from ninfer.testing.sessions import token_request  # noqa: E402

START, END, PAD = (VISION_TOKEN_IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id"))
CONFIG = ReferenceProgramConfig(max_concurrency=4, max_context=256)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    ckpt = make_hf_checkpoint(tmp_path_factory.mktemp("ve") / "ck", multimodal=True, seed=9)
    return convert_checkpoint(ckpt, ckpt.parent / "m.ninfer", progress=False)


@pytest.fixture(scope="module")
def vision_prompt(artifact):
    from ninfer.artifact import open_artifact

    with open_artifact(artifact) as a:
        v = a.config.vision
    return VisionPrompt(v, ImageProcessorConfig.from_json(json.dumps(TINY_PREPROCESSOR), v), VisionLimits(4))


def _request(vp, seed: int, tail: list[int], max_tokens: int = 5, **kw):
    img = process_image(vp.processor, PIL.fromarray(np.random.RandomState(seed).randint(0, 256, (90, 150, 3),
                                                                                         dtype=np.uint8)))
    ids, _, media = vp.expand([1, 2, 3, START, PAD, END, *tail], [], [img])
    return token_request(ids, max_tokens, media=media, **kw), media


def _program(artifact, vision=True):
    return ReferenceProgram.from_artifact(artifact, CONFIG, vision=vision)


def test_chunks_inside_an_image_give_the_same_tokens(artifact, vision_prompt):
    whole = serve(_program(artifact), [_request(vision_prompt, 1, [7, 8])[0]], prefix_caching=False)
    pieces = serve(_program(artifact), [_request(vision_prompt, 1, [7, 8])[0]], prefix_caching=False, prefill_chunk=5)
    assert whole[0].token_ids == pieces[0].token_ids and len(whole[0].token_ids) == 5


def test_checkpoint_after_an_image_is_reused_exactly(artifact, vision_prompt):
    first, media = _request(vision_prompt, 2, [7, 8, 9])
    after_image = media.images[0].end + 1  # past <|vision_end|>
    first = token_request(first.prompt, 5, media=media, capture_hints=(after_image,))
    same, _ = _request(vision_prompt, 2, [10, 11, 12, 13])
    other, _ = _request(vision_prompt, 3, [10, 11, 12, 13])
    prog = _program(artifact)
    (a,), (b, c) = in_turns(prog, [[first], [same, other]], max_concurrency=1)
    assert b.usage.cached_prompt_tokens >= after_image
    assert c.usage.cached_prompt_tokens <= media.images[0].offset  # nothing of a different image is reused
    cold_b = serve(_program(artifact), [_request(vision_prompt, 2, [10, 11, 12, 13])[0]], prefix_caching=False)
    cold_c = serve(_program(artifact), [_request(vision_prompt, 3, [10, 11, 12, 13])[0]], prefix_caching=False)
    assert (b.token_ids, c.token_ids) == (cold_b[0].token_ids, cold_c[0].token_ids)


def test_a_program_without_the_tower_refuses_images(artifact, vision_prompt):
    engine = Engine(_program(artifact, vision=False), threaded=False)
    request, _ = _request(vision_prompt, 4, [7])
    with pytest.raises(RequestRejected, match="the prompt has images; the Vision feature is not prepared"):
        engine.submit(request)
    at = request.media.images[0].offset
    ids = list(request.prompt)
    ids[at] += 1  # one placeholder of another image
    with pytest.raises(RequestRejected, match="placeholder ids at 4..19 are not its own"):
        Engine(_program(artifact), threaded=False).submit(token_request(ids, 5, media=request.media))


def test_inconsistent_media_is_refused_before_the_program_sees_it(artifact, vision_prompt):
    import dataclasses

    request, media = _request(vision_prompt, 5, [7])
    img = media.images[0]
    for bad in (dataclasses.replace(img, pixels=img.pixels[:-1]), dataclasses.replace(img, grid=(1, 3, 6))):
        forged = dataclasses.replace(media, images=(bad,))
        with pytest.raises(RequestRejected, match="image 0: (pixels of shape|grid)"):
            Engine(_program(artifact), threaded=False).submit(token_request(request.prompt, 5, media=forged))


def _forgeries(media):
    """Media that pass `PromptMedia.check` (the Engine's own) but do not fit the model's tower."""
    import dataclasses

    img = media.images[0]
    yield "patch", dataclasses.replace(media, images=(dataclasses.replace(img, pixels=img.pixels[:, :-1]),))
    yield "pixels", dataclasses.replace(media, images=(dataclasses.replace(img, pixels=img.pixels.tolist()),))
    yield "image_token_id", dataclasses.replace(media, image_token_id=10**6)
    yield "positions", dataclasses.replace(media, positions=media.positions.tolist())


@pytest.mark.parametrize("what", ["patch", "pixels", "image_token_id", "positions"])
def test_media_the_tower_cannot_take_fail_their_request_alone(artifact, vision_prompt, what):
    """A library caller's media can be consistent and still not be this model's: refused at submission (not numpy
    arrays) or at admission (another pad id or patch size: a 400 at the Gateway), while the other request is served
    and the Engine stays up."""
    from ninfer.contracts import FinishReason

    good, _ = _request(vision_prompt, 6, [7, 8])
    other, media = _request(vision_prompt, 7, [7, 8])  # another image: nothing of `good` serves it
    forged = token_request(other.prompt, 5, media=dict(_forgeries(media))[what])
    prog = _program(artifact)
    engine = Engine(prog, threaded=False)
    handles = [engine.submit(good)]
    if what in ("pixels", "positions"):
        with pytest.raises(RequestRejected, match="must be an? (float|integer) numpy array, not list"):
            engine.submit(forged)
    else:
        handles.append(engine.submit(forged))
    engine.run_until_idle()
    results = [h.result(timeout=0) for h in handles]
    assert engine.available, engine.failure
    assert results[0].finish_reason is FinishReason.LENGTH and len(results[0].token_ids) == 5
    for bad in results[1:]:
        assert bad.finish_reason is FinishReason.REJECTED and "vision tower" in bad.error, bad.error
    prog.check_invariants()
