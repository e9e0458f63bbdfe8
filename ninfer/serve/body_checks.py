"""Checks on a parsed JSON request body that no schema expresses: nesting depth and text that UTF-8 can encode.

JSON may spell lone UTF-16 surrogates ("\\ud800"), which Python keeps in its str but which no UTF-8 tokenizer,
template or response encoder accepts; a body nested deeper than MAX_JSON_DEPTH is refused before any recursive
code (validation, rendering, schema compilation) walks it. Both are 400s naming the offending field. The walk is
iterative, so it cannot itself hit the recursion limit; a body nested beyond what the JSON parser itself accepts
(~1000 levels) never reaches it and is FastAPI's 400 for a body that does not parse.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from .errors import APIError

MAX_JSON_DEPTH = 64  # arrays and objects, the body itself being level 1


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


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise APIError(400) for nesting deeper than `max_depth` or for a string (key or value) UTF-8 cannot encode.

    Both checks run on a fast path that keeps no paths: the depth walk visits containers only, the encoding is one
    C-level pass (json.dumps, then encode). Only a body that fails is walked again to name the field.
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


async def checked_body(request: Request) -> None:
    """App-wide dependency: runs after FastAPI parsed a JSON body (the parse is cached) and before validation."""
    kind = request.headers.get("content-type", "")
    # FastAPI reads a body as JSON under a JSON content type and under none at all
    if request.method in ("POST", "PUT", "PATCH") and (not kind or "json" in kind):
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001 - an unparsable body is FastAPI's own 400, raised by the route
            return
        await run_in_threadpool(check_json, body)  # ~0.1 s for 200k messages: not on the event loop
