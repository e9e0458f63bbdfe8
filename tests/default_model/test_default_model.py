"""The embedded default model: contents, real Frontend files, caching and concurrent builds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ninfer.convert import default_model as dm
from ninfer.convert.chat_template import default_chat_template
from ninfer.frontend.tokenizer import Qwen35Tokenizer
from ninfer.models.qwen3_5.config import FULL, LINEAR

PROMPT = ("<|im_start|>user\nReply in one short sentence: what makes a good inference engine?<|im_end|>\n"
          "<|im_start|>assistant\n<think>\n")


def test_built_into_the_cache_dir(model_path, session_cache_dir):
    assert model_path.is_file() and model_path.suffix == ".ninfer"
    assert model_path.is_relative_to(session_cache_dir)
    # Real vocabulary (248,320 x 64 bf16 embedding, stored once) plus ~10 MB of tokenizer.json.
    assert 35e6 < model_path.stat().st_size < 60e6


def test_metadata_says_random_weights(artifact):
    assert artifact.metadata["name"] == "ninfer-default-random"
    assert artifact.metadata["random_weights"] is True
    assert artifact.provenance["recipe"] == {"name": dm.NAME, "version": dm.RECIPE_VERSION, "key": dm.recipe_key()}
    assert artifact.provenance["resources"]["tokenizer.json"] == "builtin"


def test_config(artifact):
    cfg = artifact.config
    assert cfg.vocab_size == 248320 and cfg.hidden_size == 64
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert cfg.mtp_num_hidden_layers == 1 and cfg.tie_word_embeddings
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 32)
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (2, 4)


@pytest.fixture(scope="module")
def tok(artifact) -> Qwen35Tokenizer:
    return Qwen35Tokenizer.load(artifact.resource("tokenizer.json").decode("utf-8"))


def test_real_tokenizer_and_template(artifact, tok):
    assert tok.vocab_size == 248077
    ids = tok.encode(PROMPT)
    assert len(ids) == 23 and ids[:4] == [248045, 846, 198, 20206]
    assert artifact.resource("chat_template.jinja").decode("utf-8") == default_chat_template()
    gen = json.loads(artifact.resource("generation_config.json"))
    assert gen["eos_token_id"] == [248046, 248044]


def test_embedding_is_stored_once(artifact):
    assert artifact.bindings["lm_head.weight"].object == artifact.bindings["embed_tokens.weight"].object
    assert [tuple(o.planes[0].shape) for o in artifact.objects.values()].count((248320, 64)) == 1


def test_weight_initialisation(artifact):
    assert artifact.tensor("embed_tokens.weight").dtype == torch.bfloat16
    assert artifact.tensor("layers.0.linear_attn.A_log").dtype == torch.float32
    emb = artifact.tensor("embed_tokens.weight").float()
    assert abs(emb.std().item() - dm.INIT_STD) < 1e-3
    a_log = artifact.tensor("layers.1.linear_attn.A_log")
    assert bool(((a_log >= 0) & (a_log <= torch.log(torch.tensor(16.0)))).all())
    # zero-centred norms hold w (used as 1 + w); the GDN gated norm holds w itself.
    assert artifact.tensor("layers.3.input_layernorm.weight").float().abs().max() < 0.2
    assert (artifact.tensor("layers.0.linear_attn.norm.weight").float() - 1).abs().max() < 0.2
    assert artifact.tensor("mtp.fc.weight").shape == (64, 128)


def test_weights_are_seeded():
    cfg = dm.default_config()
    first = dict(dm.random_tensors(cfg))
    again = dict(dm.random_tensors(cfg))
    assert first.keys() == again.keys() and "lm_head.weight" not in first
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_reference_model_runs_on_it(artifact, tok):
    from ninfer.reference.model import ReferenceModel

    weights = {name: artifact.tensor(name) for name in artifact.bindings}
    model = ReferenceModel(artifact.config, weights, dtype=torch.float32)
    logits = model.prefill(torch.tensor(tok.encode(PROMPT)), model.new_state())
    assert logits.shape == (23, 248320)
    assert torch.isfinite(logits).all() and logits[-1].std() > 0


def test_second_call_is_cached(model_path, session_cache_dir, monkeypatch):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(session_cache_dir))
    mtime = model_path.stat().st_mtime_ns
    start = time.perf_counter()
    assert dm.default_model_path() == model_path
    assert time.perf_counter() - start < 0.5
    assert model_path.stat().st_mtime_ns == mtime


def _seed_tokenizer_cache(src: Path, dst: Path) -> None:
    """Copy the built tokenizer.json so a fresh cache dir only has to build the weights."""
    shutil.copytree(src / "tokenizers", dst / "tokenizers")


def test_cache_dir_env_is_respected(session_cache_dir, tmp_path, monkeypatch, model_path):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    _seed_tokenizer_cache(session_cache_dir, tmp_path)
    path = dm.default_model_path()
    assert path.is_relative_to(tmp_path) and path.name == model_path.name
    assert path.is_file()


def test_concurrent_builds_both_end_with_a_valid_file(session_cache_dir, tmp_path, model_path):
    _seed_tokenizer_cache(session_cache_dir, tmp_path)
    code = ("from ninfer.convert.default_model import default_model_path; "
            "from ninfer.artifact import open_artifact; p = default_model_path(); "
            "a = open_artifact(p, features=('text', 'mtp')); a.verify(); print(p)")
    env = {**os.environ, "NINFER_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], [r[1][-2000:] for r in results]
    paths = {r[0].strip() for r in results}
    assert len(paths) == 1
    built = Path(paths.pop())
    assert built.is_file() and built.name == model_path.name
    assert [p.name for p in built.parent.iterdir()] == [built.name]
