"""The FFN and GDN-conv activation a config names (``hidden_act``), as transformers' ``ACT2FN`` computes it."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.config import Qwen35Config


def _new_gelu(x: torch.Tensor) -> torch.Tensor:
    # transformers' NewGELUActivation: the tanh approximation written out, not F.gelu(approximate="tanh")
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "gelu_new": _new_gelu, "relu": F.relu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(cfg: Qwen35Config) -> Callable[[torch.Tensor], torch.Tensor]:
    return ACTIVATIONS[cfg.hidden_act]
