"""Drive an OutputSession the way the Engine does: preview a row, commit it, publish the chunk."""

from __future__ import annotations

import numpy as np

from ninfer.frontend.render import assistant_text


def allowed(mask_row) -> np.ndarray:
    """The token ids a bitmask row allows."""
    return np.flatnonzero(np.unpackbits(mask_row.numpy().view(np.uint8), bitorder="little"))


def stream(session, ids, sizes=None):
    """Feed `ids` in rows of the given sizes (default one token each); returns (chunks, accepted ids)."""
    sizes = list(sizes or [])
    chunks, taken, i = [], [], 0
    while i < len(ids) and not session.terminal:
        n = sizes.pop(0) if sizes else 1
        preview = session.preview(ids[i:i + n])
        chunks.append(session.commit(preview))
        taken.extend(ids[i:i + preview.accepted])
        i += n
        session.check_invariants()
    return chunks, taken


def joined(chunks):
    text = "".join(c.text for c in chunks)
    reasoning = "".join(c.reasoning_text for c in chunks)
    calls = {}
    for c in chunks:
        for d in c.tool_calls:
            entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id is not None:
                assert entry["id"] is None, "id sent twice"
                entry["id"], entry["name"] = d.id, d.name
            entry["arguments"] += d.arguments
    return text, reasoning, [calls[i] for i in sorted(calls)]


def generated_text(message, thinking=True):
    """What the model generates for `message` after the generation prompt (through <|im_end|>)."""
    full = assistant_text(message, keep_reasoning=True)
    head = "<|im_start|>assistant\n<think>\n" if thinking else "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert full.startswith(head)
    return full[len(head):-1]
