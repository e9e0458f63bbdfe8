"""Logits with images: the reference model (image features at the pads, the Frontend's MRoPE positions) against
transformers' Qwen3_5(Moe)ForConditionalGeneration on tiny random multimodal checkpoints, two odd-sized images in
one prompt. The prompt in one piece, in pieces cut inside an image, and decode steps after it (index + rope_delta)
all within relative RMS 1e-5 of transformers' single forward over the whole sequence."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL.Image")

from ninfer.convert.convert import convert_checkpoint  # noqa: E402
from ninfer.frontend.image_processor import ImageProcessorConfig, process_image  # noqa: E402
from ninfer.frontend.vision_prompt import VisionLimits, VisionPrompt, mrope_positions  # noqa: E402
from ninfer.reference.weights import load_model, load_vision_tower  # noqa: E402
from ninfer.testing.checkpoints import TINY_PREPROCESSOR, VISION_TOKEN_IDS, load_hf_vlm, make_hf_checkpoint  # noqa: E402
from oracle.metrics import rel_rms  # noqa: E402

TOL = 1e-5
START, END, PAD = (VISION_TOKEN_IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id"))


def _image(w: int, h: int, seed: int):
    return PIL.fromarray(np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8))


def _prompt(art, sizes):
    """Expanded prompt ids and PromptMedia: text, image, text, image, text."""
    model = load_model(art)
    vcfg = model.cfg.vision
    vp = VisionPrompt(vcfg, ImageProcessorConfig.from_json(json.dumps(TINY_PREPROCESSOR), vcfg), VisionLimits(4))
    images = [process_image(vp.processor, _image(w, h, i)) for i, (w, h) in enumerate(sizes)]
    ids = [10, 20, 30, START, PAD, END, 40, 50, START, PAD, END, 60, 70, 80]
    expanded, _, media = vp.expand(ids, [], images)
    return model, expanded, media, images


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def artifact(request, tmp_path_factory):
    ckpt = make_hf_checkpoint(tmp_path_factory.mktemp("vl") / "ck", moe=request.param, multimodal=True, seed=5)
    return ckpt, convert_checkpoint(ckpt, ckpt.parent / "m.ninfer", progress=False)


def _hf_logits(ckpt, media, ids, images):
    hf = load_hf_vlm(ckpt)
    model_ids = torch.tensor([media.model_ids(ids)])
    with torch.no_grad():
        return hf(input_ids=model_ids, mm_token_type_ids=(model_ids == PAD).int(),
                  pixel_values=torch.from_numpy(np.concatenate([im.pixels for im in images])),
                  image_grid_thw=torch.tensor([im.grid for im in images])).logits[0]


def _ours(model, tower, media, ids, cuts):
    state = model.new_state()
    out = []
    for a, b in zip(cuts, cuts[1:]):
        rows, feats = [], []
        for img in media.images:
            lo, hi = max(a, img.offset), min(b, img.end)
            if lo < hi:
                rows.append(torch.arange(lo - a, hi - a))
                feats.append(tower.encode(torch.from_numpy(img.pixels), img.grid)[lo - img.offset:hi - img.offset])
        embeds = (torch.cat(rows), torch.cat(feats)) if rows else None
        out.append(model.prefill(torch.tensor(media.model_ids(ids[a:b])), state,
                                 positions=torch.from_numpy(media.positions_for(a, b)), embeds=embeds))
    return torch.cat(out), state


def test_prompt_and_decode_logits_match_transformers(artifact):
    ckpt, art = artifact
    model, ids, media, images = _prompt(art, [(131, 77), (50, 170)])
    tower = load_vision_tower(art)
    n, tail = len(ids), [90, 91, 92]
    want = _hf_logits(ckpt, media, ids + tail, images)  # one forward: HF's rope index covers the tail too
    got, state = _ours(model, tower, media, ids, [0, n])
    assert rel_rms(got, want[:n]) < TOL
    one = media.images[0]
    cut, _ = _ours(model, tower, media, ids, [0, one.offset + 3, media.images[1].offset + 1, n])  # inside images
    assert rel_rms(cut, want[:n]) < TOL
    for j, tok in enumerate(tail):
        step = model.decode_step(tok, state, positions=torch.from_numpy(media.positions_for(n + j, n + j + 1)))
        assert rel_rms(step, want[n + j]) < TOL


def test_positions_follow_the_grids():
    from ninfer.contracts.media import PromptImage

    img = PromptImage(offset=2, grid=(1, 4, 6), merge=2, digest="00" * 16, pixels=None)  # 2 x 3 merged tokens
    pos, delta = mrope_positions(10, [img])
    assert pos[:, :2].tolist() == [[0, 1]] * 3
    assert pos[0, 2:8].tolist() == [2] * 6
    assert pos[1, 2:8].tolist() == [2, 2, 2, 3, 3, 3] and pos[2, 2:8].tolist() == [2, 3, 4, 2, 3, 4]
    assert pos[:, 8:].tolist() == [[5, 6]] * 3  # next text at 2 + max(2, 3)
    assert delta == 6 + 1 - 10
