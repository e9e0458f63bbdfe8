"""Pipeline parallel on one host: the stage plan (`plan.py`: which layers each device runs, its bytes; pure Python,
so the CLI parses its flags without torch), the devices' budgets (`budgets.py`) and the `StageLink` the residual
passes through from stage to stage (`link.py`). docs/pipeline.md."""

from .plan import (StageCapacityError, StageError, StageMemory, StagePlan, kv_pages_per_device, parse_devices,
                   parse_stage_layers, plan_stages, stage_memory)

__all__ = ["StageCapacityError", "StageError", "StageMemory", "StagePlan", "kv_pages_per_device", "parse_devices",
           "parse_stage_layers", "plan_stages", "stage_memory"]
