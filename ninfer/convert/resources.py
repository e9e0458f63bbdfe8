"""Frontend resources of a checkpoint: tokenizer, chat template, generation config, image processor config.

Files the checkpoint carries are copied byte for byte. A checkpoint without ``tokenizer.json`` or a chat template
gets ninfer's built-in Qwen3.5 ones (``ninfer.convert.tokenizer`` / ``ninfer.convert.chat_template``, imported only
then, since building the tokenizer takes seconds); the provenance records which source each resource came from.
"""

from __future__ import annotations

import json
from pathlib import Path

from ninfer.models.qwen3_5.vision_config import DEFAULT_PREPROCESSOR

from .errors import ConversionError

CHECKPOINT = "checkpoint"
BUILTIN = "builtin"


def _template_from_tokenizer_config(src: Path) -> str | None:
    path = src / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    except json.JSONDecodeError as e:
        raise ConversionError(str(src), [f"tokenizer_config.json is not valid JSON: {e}"]) from None
    if isinstance(value, list):
        # Named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}].
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default") or next(iter(named.values()), None)
    return value if isinstance(value, str) else None


def chat_template(src: Path) -> tuple[str | None, str]:
    """The checkpoint's chat template text and where it came from."""
    jinja = src / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), f"{CHECKPOINT}:chat_template.jinja"
    text = _template_from_tokenizer_config(src)
    if text is not None:
        return text, f"{CHECKPOINT}:tokenizer_config.json"
    legacy = src / "chat_template.json"
    if legacy.is_file():
        value = json.loads(legacy.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(value, str):
            return value, f"{CHECKPOINT}:chat_template.json"
    return None, ""


def collect_resources(src: str | Path, vision: bool = False) -> tuple[dict[str, bytes], dict[str, str]]:
    """(resource name -> bytes, resource name -> source) for ``tokenizer.json``, ``tokenizer_config.json``,
    ``chat_template.jinja`` and ``generation_config.json``; with ``vision`` also ``preprocessor_config.json`` (the
    image processor's constants: the checkpoint's, else the released Qwen3.5 ones)."""
    src = Path(src)
    out: dict[str, bytes] = {}
    origin: dict[str, str] = {}
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).is_file():
            out[name], origin[name] = (src / name).read_bytes(), f"{CHECKPOINT}:{name}"
    if vision:
        name = "preprocessor_config.json"
        if (src / name).is_file():
            out[name], origin[name] = (src / name).read_bytes(), f"{CHECKPOINT}:{name}"
        else:
            out[name], origin[name] = json.dumps(DEFAULT_PREPROCESSOR, indent=2).encode("utf-8"), BUILTIN
    if "tokenizer.json" not in out:
        from ninfer.convert.tokenizer import build_qwen35_tokenizer_json

        out["tokenizer.json"], origin["tokenizer.json"] = build_qwen35_tokenizer_json().encode("utf-8"), BUILTIN
    text, where = chat_template(src)
    if text is None:
        from ninfer.convert.chat_template import default_chat_template

        text, where = default_chat_template(), BUILTIN
    out["chat_template.jinja"], origin["chat_template.jinja"] = text.encode("utf-8"), where
    return out, origin
