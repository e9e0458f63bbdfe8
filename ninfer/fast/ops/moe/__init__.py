from .naive import moe_experts_naive, moe_route_naive
from .triton import grouped_gemm, moe_align, moe_experts, moe_route

__all__ = ["grouped_gemm", "moe_align", "moe_experts", "moe_experts_naive", "moe_route", "moe_route_naive"]
