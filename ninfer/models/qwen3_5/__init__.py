"""Qwen3.5 model family: config, logical parameters and capacity queries shared by both Programs."""

from .config import ARCHITECTURES, FULL, LINEAR, ConfigError, Qwen35Config
from .params import MTP, TEXT, VISION, ParamSpec, logical_parameters

__all__ = ["ARCHITECTURES", "FULL", "LINEAR", "MTP", "TEXT", "VISION", "ConfigError", "ParamSpec", "Qwen35Config",
           "logical_parameters"]
