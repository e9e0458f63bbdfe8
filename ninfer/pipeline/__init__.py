"""Pipeline parallel on one host: the stage plan (`plan.py`: which layers each device runs, its bytes) and the
`StageLink` the residual passes through from stage to stage (`link.py`). docs/pipeline.md."""

from .link import PeerLink, StageLink
from .plan import StageError, StageMemory, StagePlan, kv_pages_per_device, parse_devices, parse_stage_layers, \
    plan_stages, stage_memory

__all__ = ["PeerLink", "StageError", "StageLink", "StageMemory", "StagePlan", "kv_pages_per_device",
           "parse_devices", "parse_stage_layers", "plan_stages", "stage_memory"]
