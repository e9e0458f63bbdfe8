from .naive import logprobs_naive
from .triton import LogprobsWorkspace, logprobs

__all__ = ["LogprobsWorkspace", "logprobs", "logprobs_naive"]
