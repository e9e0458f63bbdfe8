from .layout import QKind, QuantWeight, Segments, concat_rows, from_planes, fusable
from .naive import dequantize_naive, qlinear_a8_naive, qlinear_naive, quantize_rows_fp8_naive

__all__ = ["QKind", "QuantWeight", "Segments", "concat_rows", "dequantize_naive", "from_planes", "fusable",
           "qlinear_a8_naive", "qlinear_naive", "quantize_rows_fp8_naive"]
