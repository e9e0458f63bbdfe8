"""Request-level rejections versus Engine-wide failure.

A rejection ends one request before any Program mutation; an EngineFailure means shared physical state can no
longer be interpreted safely, so the whole Engine fails. An internal invariant error is never downgraded to a
rejection, a cache miss, a wait or a retry.
"""

from __future__ import annotations

import enum


class RejectReason(enum.Enum):
    QUEUE_TIMEOUT = "queue_timeout"
    OVERLOADED = "overloaded"  # the bounded queue is full
    CONTEXT_TOO_LONG = "context_too_long"  # beyond the public context contract
    UNREPRESENTABLE = "unrepresentable"  # the prompt or generation request cannot be represented
    INFEASIBLE = "infeasible"  # infeasible even from root with every inactive cache entry released
    CANCELLED = "cancelled"  # cancelled while waiting
    ENGINE_UNAVAILABLE = "engine_unavailable"  # submitted to an Engine that failed or is shutting down
    GRAMMAR_OVERLOADED = "grammar_overloaded"  # no grammar compiler process could start now (host out of processes)
    GRAMMAR_UNAVAILABLE = "grammar_unavailable"  # no grammar compiler process can start at all


class RequestRejected(Exception):
    """One request ends without touching the Program; the Engine keeps serving the others."""

    def __init__(self, reason: RejectReason, message: str):
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


class EngineFailure(Exception):
    """Shared state can no longer be explained: every waiting and future request is told so."""


class StalePlan(Exception):
    """A ResourcePlan sealed against an older resource_revision; re-plan, no side effects happened."""
