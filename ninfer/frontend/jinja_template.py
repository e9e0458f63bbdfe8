"""Render a checkpoint's own Jinja chat template the way transformers' apply_chat_template does.

Same environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols), the same globals
(`raise_exception`, `strftime_now`, `namespace`, `dict`), the same `tojson` (no HTML escaping, non-ASCII kept)
and the same variables (messages, tools, documents, add_generation_prompt, the tokenizer's special tokens and
the caller's chat_template_kwargs). Templates are untrusted code: the sandbox stays on.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .messages import reject

# The special-token variables transformers passes for a Qwen3.5 tokenizer (no BOS, no UNK).
SPECIAL_TOKEN_VARS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
RESERVED_KWARGS = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


class TemplateRaised(Exception):
    """A template called raise_exception: the conversation is not representable by it."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """Like transformers' TemplateNamespace: no underscore attributes, so no reach into CPython internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attribute {name!r}")


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = dict
    return env.from_string(source)


class JinjaChatTemplate:
    """A compiled chat template; `render` raises RequestRejected(UNREPRESENTABLE) when the template refuses."""

    def __init__(self, source: str):
        try:
            self.template = _compile(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"chat template does not compile: line {e.lineno}: {e.message}") from e
        self.source = source

    def render(self, messages: Sequence[Mapping], tools: Sequence[Mapping] = (), *,
               add_generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None) -> str:
        kwargs = dict(template_kwargs or {})
        clash = RESERVED_KWARGS.intersection(kwargs)
        if clash:
            raise reject(f"chat_template_kwargs may not set {', '.join(sorted(clash))}")
        variables = {**SPECIAL_TOKEN_VARS, **kwargs}
        try:
            return self.template.render(messages=list(messages), tools=list(tools) or None, documents=None,
                                        add_generation_prompt=add_generation_prompt, **variables)
        except TemplateRaised as e:
            raise reject(f"the chat template refused the conversation: {e}") from e
        except (TypeError, ValueError, jinja2.TemplateError) as e:
            raise reject(f"the chat template failed on the conversation: {type(e).__name__}: {e}") from e
