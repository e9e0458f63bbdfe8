"""When the Vision feature is not prepared, an image request is refused with the reason, and the tower is not loaded:
a text-only artifact, --limit-mm-per-prompt 0, a speculative backend, the scoring purpose."""

from __future__ import annotations

import io

import pytest

PIL = pytest.importorskip("PIL.Image")

from ninfer.contracts import RequestRejected  # noqa: E402
from ninfer.frontend import ChatRequest  # noqa: E402
from ninfer.frontend.media import ImageData  # noqa: E402
from ninfer.runtime_options import RuntimeOptions, WiringError, parse_image_limit  # noqa: E402
from ninfer.wiring import build_runtime, vision_refusal  # noqa: E402


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    from ninfer.testing.vision_model import build_vision_test_model

    return build_vision_test_model(tmp_path_factory.mktemp("vr") / "v.ninfer")


def _png() -> bytes:
    buf = io.BytesIO()
    PIL.new("RGB", (40, 40), (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


def _image_chat() -> ChatRequest:
    return ChatRequest([{"role": "user", "content": [{"type": "image", "image": ImageData(_png(), "test")}]}])


@pytest.fixture(scope="module")
def default_model():
    from ninfer.convert.default_model import default_model_path

    return default_model_path()


def test_refusal_reasons(vision_model, default_model):
    opts = RuntimeOptions(model=str(vision_model))
    assert vision_refusal(vision_model, opts) is None  # either Program, with or without a speculative backend
    assert "no vision weights" in vision_refusal(default_model, opts)
    assert "--limit-mm-per-prompt 0" in vision_refusal(vision_model, RuntimeOptions(limit_mm_per_prompt=0))
    assert "scoring" in vision_refusal(vision_model, RuntimeOptions(purpose="scoring"))


@pytest.mark.parametrize("limit, served", [(0, False), (2, True)])
def test_limit_zero_prepares_nothing_and_refuses_with_the_reason(vision_model, limit, served):
    rt = build_runtime(RuntimeOptions(model=str(vision_model), program="reference", max_model_len=256,
                                      max_num_seqs=1, limit_mm_per_prompt=limit, warmup=False), progress=False)
    try:
        program = rt.engine.core.program
        assert (program.executor.vision is not None) is served
        assert (program.limits.no_vision is None) is served
        if served:
            assert rt.frontend.prepare_chat(_image_chat()).prompt.media is not None
        else:
            with pytest.raises(RequestRejected, match=r"image part; this server takes no images "
                                                      r"\(--limit-mm-per-prompt 0\)"):
                rt.frontend.prepare_chat(_image_chat())
    finally:
        rt.close()


def test_text_only_artifact_refuses_images(default_model):
    rt = build_runtime(RuntimeOptions(program="reference", max_model_len=256, max_num_seqs=1, warmup=False),
                       progress=False)
    try:
        with pytest.raises(RequestRejected, match="the model has no vision weights"):
            rt.frontend.prepare_chat(_image_chat())
    finally:
        rt.close()


def test_image_limit_option():
    assert parse_image_limit('{"image": 3}') == 3 and parse_image_limit("5") == 5 and parse_image_limit(None) == 8
    with pytest.raises(WiringError, match="--limit-mm-per-prompt"):
        parse_image_limit('{"images": 3}')


def test_an_unusable_processor_config_stops_the_start(tmp_path):
    from ninfer.testing.checkpoints import TINY_PREPROCESSOR
    from ninfer.testing.vision_model import build_vision_test_model

    bad = build_vision_test_model(tmp_path / "bad.ninfer", preprocessor=dict(TINY_PREPROCESSOR, patch_size=14))
    with pytest.raises(WiringError, match="image processor config is unusable: .*differ from the tower"):
        build_runtime(RuntimeOptions(model=str(bad), program="reference", max_model_len=256, max_num_seqs=1,
                                     warmup=False), progress=False)
