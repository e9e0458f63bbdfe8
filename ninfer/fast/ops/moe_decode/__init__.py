from .naive import moe_decode_naive, moe_decode_route_naive
from .triton import MAX_ROWS, MoeDecodeConfig, moe_decode, pick_config, smem_bytes

__all__ = ["MAX_ROWS", "MoeDecodeConfig", "moe_decode", "moe_decode_naive", "moe_decode_route_naive", "pick_config",
           "smem_bytes"]
