"""Small pure rules of the Engine, each with PEP 316 contracts that crosshair checks in CI
(`tests/contracts/test_crosshair.py`)."""

from __future__ import annotations


def should_release_capacity(response_done: bool, consumer_released: bool, capacity_released: bool) -> bool:
    """Outstanding capacity is released once both facts hold, in either order, and never twice.

    post: not (__return__ and capacity_released)
    post: __return__ == (response_done and consumer_released and not capacity_released)
    """
    return response_done and consumer_released and not capacity_released


def budget_room(max_tokens: int, committed: int) -> int:
    """Output tokens a request may still commit.

    pre: max_tokens >= 1
    pre: 0 <= committed <= max_tokens
    post: 0 <= __return__ <= max_tokens
    post: __return__ + committed == max_tokens
    """
    return max_tokens - committed


def accepted_fits_budget(accepted: int, terminal: bool, room: int) -> bool:
    """A row may not commit past the budget, and a row that exhausts it must be terminal.

    pre: room >= 1
    post: not __return__ or accepted <= room
    post: not (__return__ and accepted == room) or terminal
    """
    return accepted <= room and (terminal or accepted < room)
