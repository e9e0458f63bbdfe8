"""The Qwen3.5 chat template that ships inside ninfer.

``ninfer/frontend/templates/qwen3_5.jinja`` is llama.cpp's ``models/templates/Qwen3.5-4B.jinja`` (from the
llama-cpp-python 0.3.36 sdist, MIT), vendored byte for byte; docs/tokenizer.md records its source and sha256.
Checkpoints that carry their own ``chat_template.jinja`` keep theirs; this one is for artifacts built without
one (the embedded default model, tests).
"""

from __future__ import annotations

import hashlib
from importlib import resources

from ninfer.errors import ExitCode, NinferError

TEMPLATE_PACKAGE = "ninfer.frontend"
TEMPLATE_RESOURCE = "templates/qwen3_5.jinja"
TEMPLATE_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"


class ChatTemplateError(NinferError, RuntimeError):
    """The packaged chat template is missing or differs from the vendored file."""

    exit_code = ExitCode.UNAVAILABLE
    hint = "reinstall ninfer (pip install -e .)"


def default_chat_template() -> str:
    """Text of the packaged Qwen3.5 chat template, checked against its recorded sha256."""
    resource = resources.files(TEMPLATE_PACKAGE).joinpath(TEMPLATE_RESOURCE)
    try:
        data = resource.read_bytes()
    except FileNotFoundError as e:
        raise ChatTemplateError(f"packaged chat template {TEMPLATE_PACKAGE}/{TEMPLATE_RESOURCE} is missing") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != TEMPLATE_SHA256:
        raise ChatTemplateError(
            f"packaged chat template {TEMPLATE_RESOURCE} has sha256 {digest}, expected {TEMPLATE_SHA256}")
    return data.decode("utf-8")
