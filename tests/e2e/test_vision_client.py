"""Images through `ninfer serve` with the real `openai` client, on a random-weight multimodal model with the real
vocabulary (ninfer.testing.vision_model): data URLs in every accepted format, allowed local files, prefix reuse over
a repeated image with identical output (and none across different images), /tokenize's exact count, hostile
media answered 400 with the server still serving, and an image chat on a server with the MTP backend equal to the
plain one. The Program is the reference one, or the fast one with
NINFER_TEST_DEVICE=cuda (tests/e2e/conftest.py); the test ids carry it."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib

import httpx
import numpy as np
import openai
import pytest

PIL = pytest.importorskip("PIL.Image")

from tests.e2e.conftest import PROGRAM, LiveServer, program_args  # noqa: E402

MAX_BYTES = 300_000
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
LOGPROB_TOL = 5e-2 if PROGRAM == "fast" else 1e-3  # the fast Program serves bf16: verify and decode round apart


def _picture(w: int, h: int, seed: int):
    return PIL.fromarray(np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8))


def _encoded(img, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _ask(url: str, text: str = "what is this?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    allowed = root / "allowed"
    allowed.mkdir()
    _picture(80, 60, 7).save(allowed / "cat.jpg", "JPEG")
    (root / "secret.png").write_bytes(_encoded(_picture(40, 40, 8), "PNG"))
    os.symlink(root / "secret.png", allowed / "link.png")
    return root


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    from ninfer.testing.vision_model import build_vision_test_model

    return build_vision_test_model(tmp_path_factory.mktemp("vm") / "vision.ninfer")


@pytest.fixture(scope="module", params=[PROGRAM])
def server(request, tmp_path_factory, media_dir, vision_model):
    srv = LiveServer([str(vision_model), *program_args(), "--max-model-len", "1024", "--max-num-seqs", "2",
                      "--served-model-name", "vl", "--limit-mm-per-prompt", '{"image": 3}',
                      "--allowed-local-media-path", str(media_dir / "allowed"), "--media-max-bytes", str(MAX_BYTES),
                      "--media-max-pixels", "4000000"], tmp_path_factory.mktemp("vserve") / "server.log")
    try:
        srv.wait_ready()
        srv.wait_log(f"on the {request.param} Program")
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def mtp_client(tmp_path_factory, vision_model):
    """The same model served with the MTP head drafting 3 tokens a round. At the full block every round: random
    weights reject every draft, so on a GPU (measured round costs) the adaptive width would go plain after the
    warm-up, and no image round would draft."""
    srv = LiveServer([str(vision_model), *program_args(), "--max-model-len", "1024", "--max-num-seqs", "2",
                      "--served-model-name", "vl", "--speculative-config",
                      '{"method": "mtp", "num_speculative_tokens": 3, "adaptive": false}'],
                     tmp_path_factory.mktemp("vspec") / "server.log")
    try:
        srv.wait_ready()
        srv.wait_log("speculative mtp (k=3, fixed width)")
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        srv.stop()


def _chat(client, messages, **kw):
    return client.chat.completions.create(model="vl", messages=messages, max_tokens=6, temperature=0,
                                          extra_body=NO_THINK, **kw)


def test_every_format_and_the_exact_token_count(client, server):
    img = _picture(90, 70, 1)
    for fmt, mime in (("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")):
        messages = _ask(_data_url(_encoded(img, fmt), mime))
        r = _chat(client, messages)
        assert r.choices[0].finish_reason == "length", fmt
        count = httpx.post(f"{server.url}/tokenize", json={"messages": messages, **NO_THINK}).json()["count"]
        assert r.usage.prompt_tokens == count, fmt


def test_repeated_image_hits_the_cache_with_identical_output(client):
    url = _data_url(_encoded(_picture(130, 90, 2), "PNG"))
    cold = _chat(client, _ask(url, "describe it"))
    warm = _chat(client, _ask(url, "describe it"))
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert warm.usage.prompt_tokens_details.cached_tokens > cold.usage.prompt_tokens - 8
    other = _chat(client, _ask(_data_url(_encoded(_picture(130, 90, 3), "PNG")), "describe it"))
    assert other.usage.prompt_tokens == cold.usage.prompt_tokens
    assert other.usage.prompt_tokens_details.cached_tokens < 8  # the shared text before the image at most


def test_allowed_local_file(client, media_dir):
    r = _chat(client, _ask(f"file://{media_dir / 'allowed' / 'cat.jpg'}"))
    assert r.choices[0].finish_reason == "length"


def _bomb_png(side: int) -> bytes:
    """A valid PNG header claiming side x side pixels, with a tiny (incomplete) body."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("url, needle", [
    (_data_url(_encoded(_picture(60, 60, 4), "PNG")[:200]), "cannot be decoded"),  # truncated
    (_data_url(_bomb_png(5000)), "5000x5000 = 25000000 pixels, over the limit of 4000000"),  # decompression bomb
    (_data_url(_bomb_png(30000)), "decompression bomb"),  # past Pillow's own bound
    (_data_url(b"\x00" * (MAX_BYTES + 10)), "over the limit of 300000 bytes"),  # huge data URL
    (_data_url(b"not an image at all"), "not a PNG, JPEG, WebP or GIF"),
    ("data:image/png;base64,@@@@", "not valid base64"),
    ("file:///etc/passwd", "outside --allowed-local-media-path"),
    ("ALLOWED/../secret.png", "outside --allowed-local-media-path"),  # .. escape
    ("ALLOWED/link.png", "outside --allowed-local-media-path"),  # symlink escape
    ("file://evil.host/ALLOWED/cat.jpg", "no host"),
    ("https://example.com/x.png", "--allow-remote-media"),
    ("ftp://example.com/x.png", "unsupported image URL scheme"),
])
def test_hostile_media_is_a_400_naming_it(client, media_dir, url, needle):
    url = url.replace("ALLOWED", f"file://{media_dir / 'allowed'}") if url.startswith("ALLOWED") else url
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, _ask(url))
    assert needle in str(e.value)
    assert _chat(client, [{"role": "user", "content": "still there?"}]).choices[0].finish_reason == "length"


def test_image_count_and_placement_limits(client):
    url = _data_url(_encoded(_picture(40, 40, 5), "PNG"))
    part = {"type": "image_url", "image_url": {"url": url}}
    with pytest.raises(openai.BadRequestError, match="over the limit of 3"):
        _chat(client, [{"role": "user", "content": [part] * 4}])
    with pytest.raises(openai.BadRequestError, match="only user messages may carry images"):
        _chat(client, [{"role": "system", "content": [part]}, {"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="image pad tokens"):
        _chat(client, [{"role": "user", "content": [part, {"type": "text", "text": "<|image_pad|>"}]}])
    two = _chat(client, [{"role": "user", "content": [part, {"type": "text", "text": "and"}, part]}])
    assert two.choices[0].finish_reason == "length"


def test_an_image_chat_with_mtp_equals_the_plain_one(client, mtp_client):
    """Images compose with a speculative backend (docs/speculative.md, "Images"): greedy output token for token the
    plain server's, one image and two, the drafts counted in the usage extension."""
    first = _data_url(_encoded(_picture(100, 70, 9), "PNG"))
    second = {"type": "image_url", "image_url": {"url": _data_url(_encoded(_picture(64, 64, 11), "JPEG"),
                                                                  "image/jpeg")}}
    two = [{"role": "user", "content": [*_ask(first)[0]["content"], second]}]
    for messages in (_ask(first), two):
        plain, spec = (c.chat.completions.create(model="vl", messages=messages, max_tokens=16, temperature=0,
                                                 logprobs=True, extra_body=NO_THINK) for c in (client, mtp_client))
        got, want = spec.choices[0].logprobs.content, plain.choices[0].logprobs.content
        assert [t.token for t in got] == [t.token for t in want]
        # a verify pass at a wrong rotary position shows here even where the random model's argmax does not move
        assert [t.logprob for t in got] == pytest.approx([t.logprob for t in want], abs=LOGPROB_TOL)
        assert spec.usage.model_extra["speculative_decoding"]["draft_tokens"] > 0
