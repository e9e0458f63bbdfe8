"""Frontend resources: copied from the checkpoint, or ninfer's built-in Qwen3.5 tokenizer and template."""

from __future__ import annotations

import json

from ninfer.artifact import open_artifact
from ninfer.convert.convert import convert_checkpoint
from ninfer.testing.checkpoints import TINY_CHAT_TEMPLATE


def test_checkpoint_resources_copied(tmp_path, checkpoints):
    src = checkpoints["dense"]
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    with open_artifact(out) as art:
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            assert art.resource(name) == (src / name).read_bytes()
        assert art.resource("chat_template.jinja").decode() == TINY_CHAT_TEMPLATE
        assert art.provenance["resources"]["chat_template.jinja"] == "checkpoint:chat_template.jinja"


def test_chat_template_from_tokenizer_config(tmp_path, fresh_checkpoint):
    src = fresh_checkpoint(chat_template_in_config=True)
    assert not (src / "chat_template.jinja").exists()
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    with open_artifact(out) as art:
        assert art.resource("chat_template.jinja").decode() == TINY_CHAT_TEMPLATE
        assert art.provenance["resources"]["chat_template.jinja"] == "checkpoint:tokenizer_config.json"


def test_named_templates_pick_default(tmp_path, fresh_checkpoint):
    src = fresh_checkpoint()
    (src / "chat_template.jinja").unlink()
    tcfg = json.loads((src / "tokenizer_config.json").read_text())
    tcfg["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (src / "tokenizer_config.json").write_text(json.dumps(tcfg))
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    with open_artifact(out) as art:
        assert art.resource("chat_template.jinja") == b"D"


def test_builtin_fallback_without_tokenizer(tmp_path, fresh_checkpoint):
    from ninfer.convert.chat_template import default_chat_template
    from ninfer.convert.tokenizer import build_qwen35_tokenizer_json

    src = fresh_checkpoint(tokenizer=False)
    out = convert_checkpoint(src, tmp_path / "m.ninfer", progress=False)
    with open_artifact(out) as art:
        assert art.resource("tokenizer.json").decode() == build_qwen35_tokenizer_json()
        assert art.resource("chat_template.jinja").decode() == default_chat_template()
        origins = art.provenance["resources"]
        assert origins["tokenizer.json"] == "builtin" and origins["chat_template.jinja"] == "builtin"
        assert "tokenizer_config.json" not in art.resources
        assert art.resource("generation_config.json") == (src / "generation_config.json").read_bytes()
