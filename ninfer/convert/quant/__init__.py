"""Quantized conversion: imports of published quantized checkpoints and quantizing recipes (docs/quantization.md)."""
