"""Request and lane states of the seed's lifecycle, with their only legal transitions.

Lane, State/KV execution resource and compact batch row are three different identities: a lane is the Engine's
long-lived active-request position, the execution resource is the Program's, and a row is only the index in the
current GPU unit. None is derived from another.
"""

from __future__ import annotations

import enum


class RequestState(enum.Enum):
    WAITING = "waiting"  # owns its prompt and output state only; no Program sequence exists
    MATERIALIZING = "materializing"  # a resource transition holds the logical claim; its source stays valid
    PREFILL = "prefill"  # Active, consuming the prompt suffix
    DECODE_READY = "decode_ready"  # may join the next compact decode round
    CONTROL_READY = "control_ready"  # the Frontend asked to commit a forced-control suffix
    TERMINAL_PENDING = "terminal_pending"  # execution ended; active resources not yet retained or released
    FINISHED = "finished"  # resources and output committed; the response may complete


class LaneState(enum.Enum):
    FREE = "free"
    MATERIALIZING = "materializing"
    ACTIVE = "active"
    TERMINAL_PENDING = "terminal_pending"


class FinishReason(enum.Enum):
    STOP = "stop"  # a stop token or stop string
    LENGTH = "length"  # max_tokens or the context contract
    TOOL_CALLS = "tool_calls"
    CANCELLED = "cancelled"  # the consumer cancelled or abandoned the handle
    DEADLINE = "deadline"  # the request's deadline passed while it was active
    REJECTED = "rejected"  # a request-level rejection before any Program mutation
    ERROR = "error"  # the Engine failed


_S = RequestState
# Waiting and Materializing may end directly (cancellation, queue timeout, infeasible, aborted materialization):
# no Program sequence exists there, so there is nothing to retain or release.
REQUEST_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    _S.WAITING: frozenset({_S.MATERIALIZING, _S.FINISHED}),
    _S.MATERIALIZING: frozenset({_S.PREFILL, _S.DECODE_READY, _S.FINISHED}),
    _S.PREFILL: frozenset({_S.PREFILL, _S.DECODE_READY, _S.CONTROL_READY, _S.TERMINAL_PENDING}),
    _S.DECODE_READY: frozenset({_S.DECODE_READY, _S.CONTROL_READY, _S.TERMINAL_PENDING}),
    _S.CONTROL_READY: frozenset({_S.DECODE_READY, _S.CONTROL_READY, _S.TERMINAL_PENDING}),
    _S.TERMINAL_PENDING: frozenset({_S.FINISHED}),
    _S.FINISHED: frozenset(),
}

_L = LaneState
LANE_TRANSITIONS: dict[LaneState, frozenset[LaneState]] = {
    _L.FREE: frozenset({_L.MATERIALIZING}),
    # An aborted or failed materialization returns the lane without ever activating it.
    _L.MATERIALIZING: frozenset({_L.ACTIVE, _L.FREE}),
    _L.ACTIVE: frozenset({_L.TERMINAL_PENDING}),
    _L.TERMINAL_PENDING: frozenset({_L.FREE}),
}


class IllegalTransition(RuntimeError):
    """A state change the lifecycle forbids: an internal invariant error, never a request-level outcome."""


def check_request_transition(old: RequestState, new: RequestState) -> None:
    if new not in REQUEST_TRANSITIONS[old]:
        raise IllegalTransition(f"request state {old.value} -> {new.value} is not a lifecycle transition")


def check_lane_transition(old: LaneState, new: LaneState) -> None:
    if new not in LANE_TRANSITIONS[old]:
        raise IllegalTransition(f"lane state {old.value} -> {new.value} is not a lifecycle transition")
