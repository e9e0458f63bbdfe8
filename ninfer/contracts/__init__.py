"""The one contract layer between Engine and Program: value types, states, errors and invariant rules.

Imports nothing else from ninfer.
"""

from .batch import (ROW_FAILURE_TEXT, BatchKind, PendingBatch, PendingRow, RowDecision, RowFailure, SequenceHandle,
                    check_row_decision)
from .digest import token_digest
from .errors import EngineFailure, RejectReason, RequestRejected, StalePlan
from .media import PromptImage, PromptMedia
from .program import CostFacts, DraftMasks, PrefillChunk, PrefillCosts, Program, ProgramLimits, ResourceUsage
from .events import GenerationResult, GenerationStart, OutputDelta, Usage
from .resources import (CheckpointId, CheckpointInfo, Infeasible, ResourceChoice, ResourcePlan, ResourceResult,
                        RunningTransaction, TransitionKind)
from .states import (FinishReason, IllegalTransition, LaneState, RequestState, check_lane_transition,
                     check_request_transition)

__all__ = ["BatchKind", "check_lane_transition", "check_request_transition", "check_row_decision", "CheckpointId",
           "CheckpointInfo", "CostFacts", "DraftMasks", "PrefillChunk", "PrefillCosts", "EngineFailure", "FinishReason", "GenerationResult",
           "GenerationStart", "IllegalTransition", "Infeasible", "LaneState", "OutputDelta", "PendingBatch",
           "PendingRow", "Program", "ProgramLimits", "PromptImage", "PromptMedia", "RejectReason", "RequestRejected", "RequestState",
           "ResourceChoice", "ResourcePlan", "ResourceResult", "ResourceUsage", "ROW_FAILURE_TEXT", "RowDecision",
           "RowFailure", "RunningTransaction", "SequenceHandle", "StalePlan", "token_digest", "TransitionKind",
           "Usage"]
