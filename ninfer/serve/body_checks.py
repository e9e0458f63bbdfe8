"""Checks on a parsed JSON request body that no schema expresses: nesting depth and text that UTF-8 can encode.

JSON may spell lone UTF-16 surrogates ("\\ud800"), which Python keeps in its str but which no UTF-8 tokenizer,
template or response encoder accepts; a body nested deeper than MAX_JSON_DEPTH is refused before any recursive
code (validation, rendering, schema compilation) walks it. Both are 400s naming the offending field; json_body.py
runs them with the parse, off the event loop. The walk is
iterative, so it cannot itself hit the recursion limit; a body nested beyond what the JSON parser itself accepts
(~1000 levels) never reaches it and is FastAPI's 400 for a body that does not parse.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import APIError

MAX_JSON_DEPTH = 64  # arrays and objects, the body itself being level 1
# How UTF-8 JSON can spell a surrogate: an escape \uD800-\uDFFF, or the bytes ED A0-BF (json.loads decodes bytes with
# surrogatepass). A body with neither holds none; one with a match may still be fine (an escaped pair, "\\ud800").
_SURROGATE_SPELLING = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def may_hold_surrogates(raw: bytes) -> bool:
    """False when the JSON text `raw` cannot decode to a string holding a surrogate (one C-level scan)."""
    return json.detect_encoding(raw) not in ("utf-8", "utf-8-sig") or _SURROGATE_SPELLING.search(raw) is not None


def _where(node: tuple | None) -> str:
    """The field's path as errors name it (messages[0].content) from the walk's (parent, key) chain; a key that is
    itself bad text is escaped."""
    keys = []
    while node is not None:
        node, key = node
        keys.append(key)
    out = ""
    for p in reversed(keys):
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out.encode("utf-8", "backslashreplace").decode("utf-8") if out else "body"


def _check_text(text: str, node: tuple | None) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = _where(node)
        raise APIError(400, f"{where}: text is not valid Unicode (a lone surrogate U+{ord(text[e.start]):04X} at "
                       f"character {e.start}): it cannot be encoded as UTF-8", param=where,
                       code="invalid_encoding") from None


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH, *, raw: bytes | None = None) -> None:
    """Raise APIError(400) for nesting deeper than `max_depth` or for a string (key or value) UTF-8 cannot encode.

    Both checks run on a fast path that keeps no paths: the depth walk visits containers only, the encoding is one
    C-level pass (json.dumps, then encode), skipped when `raw`, the JSON text `value` was parsed from, cannot spell
    a surrogate (that pass holds the GIL for ~60 ms on a 7 MB body). Only a body that fails is walked again to name
    the field.
    """
    # breadth-first, one list per level: ~7x faster than a stack of (value, depth)
    level, depth = ([value] if type(value) is dict or type(value) is list else []), 1
    while level:
        if depth > max_depth:
            _locate(value, max_depth)
        below = []
        for v in level:
            for c in (v.values() if type(v) is dict else v):  # json.loads makes plain dicts and lists only
                if type(c) is dict or type(c) is list:
                    below.append(c)
        level, depth = below, depth + 1
    if raw is not None and not may_hold_surrogates(raw):
        return
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        _locate(value, max_depth)


def _locate(value: Any, max_depth: int) -> None:
    """The slow walk with paths (as (parent, key) links): raise the error of the first bad field found."""
    stack: list[tuple[Any, int, tuple | None]] = [(value, 1, None)]
    while stack:
        v, depth, node = stack.pop()
        if isinstance(v, str):
            _check_text(v, node)
        elif isinstance(v, (dict, list)):
            if depth > max_depth:
                where = _where(node)
                raise APIError(400, f"{where}: JSON nested deeper than {max_depth} levels", param=where,
                               code="too_deep")
            for key, item in (v.items() if isinstance(v, dict) else enumerate(v)):
                if isinstance(key, str):
                    _check_text(key, (node, key))
                stack.append((item, depth + 1, (node, key)))
