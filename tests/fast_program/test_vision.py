"""Images on the fast Program against the reference Program on the same tiny multimodal checkpoint (transformers'
own random tiny tower and text model, converted), both through the real Engine in fp32: the naive kernels on CPU,
the Triton kernels and CUDA graphs with NINFER_TEST_DEVICE=cuda.

Two odd-sized images in one prompt, prefill chunks cut inside them, then decode steps (which rotate at position +
rope_delta), also under async scheduling: greedy tokens equal and logprobs close; penalties over a prompt with
images see the pad id as the reference's draw does; a repeated image resumes from a checkpoint after it with the
cold run's output, and a resume inside an image encodes it again; features are freed once the prefill passes the
image."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL.Image")

from ninfer.contracts import GenerationResult, OutputDelta  # noqa: E402
from ninfer.convert.convert import convert_checkpoint  # noqa: E402
from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.fast.program import FastProgram  # noqa: E402
from ninfer.frontend.image_processor import ImageProcessorConfig, process_image  # noqa: E402
from ninfer.frontend.vision_prompt import VisionLimits, VisionPrompt  # noqa: E402
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig  # noqa: E402
from ninfer.sampling import SamplingParams  # noqa: E402
from ninfer.testing.checkpoints import TINY_PREPROCESSOR, VISION_TOKEN_IDS, make_hf_checkpoint  # noqa: E402
from ninfer.testing.serving import assert_drained, in_turns, serve  # noqa: E402
from ninfer.testing.sessions import token_request  # noqa: E402

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
START, END, PAD = (VISION_TOKEN_IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id"))
LIMITS = dict(max_concurrency=2, max_context=256)
TOL = 3e-2 if ON_GPU else 1e-4  # logprobs; the GPU's fp32 tl.dot is TF32


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    ckpt = make_hf_checkpoint(tmp_path_factory.mktemp("fv") / "ck", multimodal=True, seed=9)
    return convert_checkpoint(ckpt, ckpt.parent / "m.ninfer", progress=False)


@pytest.fixture(scope="module")
def vp(artifact):
    from ninfer.artifact import open_artifact

    with open_artifact(artifact) as a:
        v = a.config.vision
    return VisionPrompt(v, ImageProcessorConfig.from_json(json.dumps(TINY_PREPROCESSOR), v), VisionLimits(4))


def _fast(artifact, vp) -> FastProgram:
    patches = vp.processor.max_pixels // vp.processor.patch_size ** 2
    return FastProgram.from_artifact(artifact, **LIMITS, budget_bytes=1 << 30, device=DEVICE, page_size=4,
                                     kv_pages=200, dtype=torch.float32, kernels="triton" if ON_GPU else "naive",
                                     vision_patches=patches)


def _reference(artifact) -> ReferenceProgram:
    return ReferenceProgram.from_artifact(artifact, ReferenceProgramConfig(**LIMITS), vision=True)


def _image(seed: int, h: int, w: int):
    return PIL.fromarray(np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8))


def _request(vp, seeds, tail, max_tokens=6, sizes=((90, 150), (70, 40)), **kw):
    """A prompt with one image per seed (odd sizes), text between and after them."""
    images = [process_image(vp.processor, _image(s, *hw)) for s, hw in zip(seeds, sizes)]
    text = [1, 2, 3]
    for i in range(len(images)):
        text += [START, PAD, END, 20 + i]
    ids, _, media = vp.expand(text + list(tail), [], images)
    return token_request(ids, max_tokens, media=media, **kw)


def _stream(program, requests, turns=None, **config):
    """(token ids, logprobs, cached prompt tokens) per request from its events; `turns`: batches served one after
    another on one Engine (later ones meet earlier checkpoints) in place of `requests` at once."""
    engine = Engine(program, EngineConfig(check_invariants=True, **{"max_concurrency": 2, **config}), threaded=False)
    handles = []
    for batch in turns or [requests]:
        handles += [engine.submit(r) for r in batch]
        engine.run_until_idle()
    assert engine.available, engine.failure
    out = []
    for h in handles:
        events = list(h.events(timeout=0))
        deltas = [e for e in events if isinstance(e, OutputDelta)]
        (result,) = [e for e in events if isinstance(e, GenerationResult)]
        out.append((sum((d.token_ids for d in deltas), ()), sum((d.logprobs or () for d in deltas), ()),
                    result.usage.cached_prompt_tokens))
    return out


@pytest.mark.parametrize("chunk, overlap", [(None, False), (7, False), (7, True)],
                         ids=["whole", "cut-inside-images", "async-scheduling"])
def test_two_images_prefill_and_decode_equal_the_reference(artifact, vp, chunk, overlap):
    greedy = SamplingParams(temperature=0.0, logprobs=0)
    reqs = lambda: [_request(vp, (1, 2), [7, 8], 8, sampling=greedy)]  # noqa: E731
    assert reqs()[0].media.rope_delta != 0  # decode rotates apart from the KV position
    cfg = dict(prefix_caching=False, **({} if chunk is None else {"prefill_chunk": chunk}))
    fast = _fast(artifact, vp)
    (got,) = _stream(fast, reqs(), async_scheduling=overlap, **cfg)
    (want,) = _stream(_reference(artifact), reqs(), **cfg)
    assert got[0] == want[0] and len(got[0]) == 8
    assert got[1] == pytest.approx(want[1], abs=TOL)
    assert fast.executor.images.held() == 0  # each image's features freed by the piece that reached its end
    assert_drained(fast)


def test_penalties_see_the_pad_id_like_the_reference(artifact, vp):
    params = SamplingParams(temperature=0.0, repetition_penalty=1.8, presence_penalty=0.5, logprobs=0)
    reqs = lambda: [_request(vp, (3,), [9, 10], 6, sizes=((64, 96),), sampling=params)]  # noqa: E731
    (got,), (want,) = _stream(_fast(artifact, vp), reqs()), _stream(_reference(artifact), reqs())
    assert got[0] == want[0] and len(got[0]) == 6  # a placeholder in the tables would fail the row
    assert got[1] == pytest.approx(want[1], abs=TOL)


def test_a_repeated_image_resumes_with_the_cold_output(artifact, vp):
    first = _request(vp, (4,), [7, 8, 9], sizes=((90, 150),))
    after = first.media.images[0].end + 1  # past <|vision_end|>
    first = token_request(first.prompt, 5, media=first.media, capture_hints=(after,))
    same = _request(vp, (4,), [10, 11, 12], sizes=((90, 150),))
    other = _request(vp, (5,), [10, 11, 12], sizes=((90, 150),))
    fast = _fast(artifact, vp)
    (_,), (b, c) = in_turns(fast, [[first], [same, other]], max_concurrency=1)
    assert b.usage.cached_prompt_tokens >= after
    assert c.usage.cached_prompt_tokens <= other.media.images[0].offset  # a different image reuses nothing past it
    cold = serve(_reference(artifact), [_request(vp, (4,), [10, 11, 12], sizes=((90, 150),)),
                                        _request(vp, (5,), [10, 11, 12], sizes=((90, 150),))],
                 prefix_caching=False, max_concurrency=1)
    assert (b.token_ids, c.token_ids) == (cold[0].token_ids, cold[1].token_ids)


def test_without_the_tower_images_are_refused(artifact):
    fast = FastProgram.from_artifact(artifact, **LIMITS, budget_bytes=1 << 30, device=DEVICE, page_size=4,
                                     kv_pages=200, dtype=torch.float32, kernels="triton" if ON_GPU else "naive")
    assert fast.limits.no_vision and "not prepared" in fast.limits.no_vision


def test_a_resume_inside_an_image_encodes_it_again(artifact, vp):
    """A checkpoint inside an image (the features were freed when the first prefill passed it): the resumed prefill
    encodes the image again and takes the rest of its rows, with the cold run's tokens and logprobs."""
    greedy = SamplingParams(temperature=0.0, logprobs=0)
    first = _request(vp, (6,), [7, 8, 9], sizes=((90, 150),))
    inside = first.media.images[0].offset + 5
    first = token_request(first.prompt, 4, media=first.media, capture_hints=(inside,))
    again = lambda: _request(vp, (6,), [10, 11], sizes=((90, 150),), sampling=greedy)  # noqa: E731
    fast = _fast(artifact, vp)
    _, got = _stream(fast, None, turns=[[first], [again()]], max_concurrency=1)
    assert got[2] == inside
    (want,) = _stream(_reference(artifact), [again()], prefix_caching=False, max_concurrency=1)
    assert got[0] == want[0] and got[1] == pytest.approx(want[1], abs=TOL)
    assert fast.executor.images.held() == 0


@pytest.mark.parametrize("forge", ["patch", "image_token_id", "patches"])
def test_media_the_tower_cannot_take_fail_their_request_alone(artifact, vp, forge):
    """Media of another model's tower (pad id, patch size) or of more patches than the Program planned its encode
    for are refused at admission; the other request is served."""
    import dataclasses

    from ninfer.contracts import FinishReason

    good, other = _request(vp, [1], [7], sizes=((70, 40),)), _request(vp, [2], [7], sizes=((90, 150),))
    media, img = other.media, other.media.images[0]
    if forge == "image_token_id":
        media = dataclasses.replace(media, image_token_id=10**6)
    elif forge == "patch":
        media = dataclasses.replace(media, images=(dataclasses.replace(img, pixels=img.pixels[:, :-1]),))
    if forge == "patches":  # planned for fewer patches than the other image has (a processor allowing less)
        assert good.media.images[0].pixels.shape[0] < img.pixels.shape[0]
        prog = FastProgram.from_artifact(artifact, **LIMITS, budget_bytes=1 << 30, device=DEVICE, page_size=4,
                                         kv_pages=200, dtype=torch.float32, kernels="triton" if ON_GPU else "naive",
                                         vision_patches=img.pixels.shape[0] - 1)
    else:
        prog = _fast(artifact, vp)
    engine = Engine(prog, EngineConfig(max_concurrency=2), threaded=False)
    handles = [engine.submit(good), engine.submit(dataclasses.replace(other, media=media))]
    engine.run_until_idle()
    ok, bad = (h.result(timeout=0) for h in handles)
    assert engine.available, engine.failure
    assert ok.finish_reason is FinishReason.LENGTH
    assert bad.finish_reason is FinishReason.REJECTED and "vision tower" in bad.error, bad.error
    assert_drained(prog)


def test_an_image_prompt_rides_beside_an_image_row_decoding(artifact, vp):
    """Mixed units with images on both sides: the second prompt's chunks (cut inside its image: MRoPE rows and the
    tower's features in the eager mixed pass) ride in the rounds of the first request, which decodes at position +
    rope_delta; greedy tokens and logprobs equal the reference Program's, which runs each chunk, then the round."""
    greedy = SamplingParams(temperature=0.0, logprobs=0)
    outs = []
    for program in (_fast(artifact, vp), _reference(artifact)):
        engine = Engine(program, EngineConfig(check_invariants=True, max_concurrency=2, prefill_chunk=7,
                                              prefix_caching=False), threaded=False)
        first = engine.submit(_request(vp, (1,), [7, 8], 12, sizes=((90, 150),), sampling=greedy))
        while not engine.core.scheduler.decode_ready:
            engine.step()  # until the first request decodes
        rides = []
        if isinstance(program, FastProgram):
            mixed = program.model.mixed
            program.model.mixed = lambda *a, **kw: rides.append(kw.get("embeds") is not None) or mixed(*a, **kw)
        second = engine.submit(_request(vp, (2,), [9], 4, sizes=((70, 40),), sampling=greedy))
        engine.run_until_idle()
        assert engine.available, engine.failure
        if isinstance(program, FastProgram):
            assert any(rides) and len(rides) >= 2  # chunks rode, holding image rows
        streams = []
        for h in (first, second):
            deltas = [e for e in h.events(timeout=0) if isinstance(e, OutputDelta)]
            streams.append((sum((d.token_ids for d in deltas), ()), sum((d.logprobs or () for d in deltas), ())))
        outs.append(streams)
    got, want = outs
    assert [t for t, _ in got] == [t for t, _ in want] and len(got[1][0]) == 4
    for (_, a), (_, b) in zip(got, want):
        assert a == pytest.approx(b, abs=TOL)
