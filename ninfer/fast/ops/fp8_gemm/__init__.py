from .naive import fp8_gemm_naive, quantize_rows_fp8_naive

__all__ = ["fp8_gemm_naive", "quantize_rows_fp8_naive"]
