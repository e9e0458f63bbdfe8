"""Bounds on caller input that the Frontend parses, walks or tokenizes: JSON nesting depth and UTF-8 encodability.

Rendering, schema checks and tool-argument parsing recurse over JSON values, and a tokenizer takes only text that
UTF-8 can encode (a Python str may hold lone UTF-16 surrogates, which JSON can spell as "\\ud800"). Input past
either bound is a RequestRejected(UNREPRESENTABLE) naming where it sits, never a RecursionError or a TypeError.
The Gateway applies the same depth to whole request bodies (ninfer/serve/body_checks.py, run by json_body.py).
"""

from __future__ import annotations

import json
from typing import Any

from ninfer.contracts import RejectReason, RequestRejected

MAX_JSON_DEPTH = 64  # nested arrays and objects; the outermost value is level 1


def _reject(message: str) -> RequestRejected:
    return RequestRejected(RejectReason.UNREPRESENTABLE, message)


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` nests arrays/objects (any Mapping or list/tuple) deeper than `limit`; iterative."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


def check_depth(value: Any, where: str) -> None:
    if too_deep(value):
        raise _reject(f"{where} nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")


def loads_bounded(text: str, where: str) -> Any:
    """json.loads of caller text, refused (not raised as RecursionError) when nested past MAX_JSON_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _reject(f"{where} nests arrays and objects deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise _reject(f"{where} is not valid JSON: {e}") from e
    check_depth(value, where)
    return value


def check_text(text: str, where: str) -> None:
    """Refuse text UTF-8 cannot encode (a lone surrogate), naming the first offending character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _reject(f"{where} is not valid Unicode: a lone surrogate U+{ord(text[e.start]):04X} at character "
                     f"{e.start} cannot be encoded as UTF-8") from None
