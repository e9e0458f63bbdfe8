"""Checks on a parsed JSON request body that no schema expresses: nesting depth and text that UTF-8 can encode.

JSON may spell lone UTF-16 surrogates ("\\ud800"), which Python keeps in its str but which no UTF-8 tokenizer,
template or response encoder accepts; a body nested deeper than MAX_JSON_DEPTH is refused before any recursive
code (validation, rendering, schema compilation) walks it. Both are 400s naming the offending field. The walk is
iterative, so it cannot itself hit the recursion limit; a body nested beyond what the JSON parser itself accepts
(~1000 levels) never reaches it and is FastAPI's 400 for a body that does not parse.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from .errors import APIError

MAX_JSON_DEPTH = 64  # arrays and objects, the body itself being level 1


def _where(path: tuple) -> str:
    """The field's path as errors name it (messages[0].content); a key that is itself bad text is escaped."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out.encode("utf-8", "backslashreplace").decode("utf-8") if out else "body"


def _check_text(text: str, path: tuple) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = _where(path)
        raise APIError(400, f"{where}: text is not valid Unicode (a lone surrogate U+{ord(text[e.start]):04X} at "
                       f"character {e.start}): it cannot be encoded as UTF-8", param=where,
                       code="invalid_encoding") from None


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise APIError(400) for nesting deeper than `max_depth` or for a string (key or value) UTF-8 cannot encode."""
    stack: list[tuple[Any, int, tuple]] = [(value, 1, ())]
    while stack:
        v, depth, path = stack.pop()
        if isinstance(v, str):
            _check_text(v, path)
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > max_depth:
            where = _where(path)
            raise APIError(400, f"{where}: JSON nested deeper than {max_depth} levels", param=where,
                           code="too_deep")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for key, item in items:
            if isinstance(key, str):
                _check_text(key, path + (key,))
            stack.append((item, depth + 1, path + (key,)))


async def checked_body(request: Request) -> None:
    """App-wide dependency: runs after FastAPI parsed a JSON body (the parse is cached) and before validation."""
    if request.method in ("POST", "PUT", "PATCH") and "json" in request.headers.get("content-type", ""):
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001 - an unparsable body is FastAPI's own 400, raised by the route
            return
        check_json(body)
