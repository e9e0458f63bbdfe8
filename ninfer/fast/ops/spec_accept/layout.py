"""What the spec_accept op reads and writes, shared by ``naive.py`` and ``triton.py``.

Rows carry the sample op's per-row columns (``ninfer.fast.ops.sample.layout``: SEED, POSITION, FLAGS with its GREEDY
bit), with POSITION the absolute position of the first verified token (frontier + 1): verified row i of a block is
drawn at POSITION + i, as the host's ``ninfer.sampling.accept`` numbers them. The result is one int32 row per batch
row, so one host copy per step brings back every row's tokens and length.
"""

from __future__ import annotations

from ninfer.fast.ops.sample.layout import ALL_MASKED, BAD_LOGITS, FLAGS, GREEDY, OK, POSITION, SEED

# columns of the result [B, TOKENS + k + 1]
COUNT = 0  # tokens emitted: accepted drafts + the bonus (or residual) token, 1..num_drafts + 1
STATUS = 1  # OK, or BAD_LOGITS / ALL_MASKED of the first verified row the walk reached that cannot be drawn from
TOKENS = 2  # the emitted tokens, then NO_TOKEN up to k + 1
NO_TOKEN = -1

__all__ = ["ALL_MASKED", "BAD_LOGITS", "COUNT", "FLAGS", "GREEDY", "NO_TOKEN", "OK", "POSITION", "SEED", "STATUS",
           "TOKENS"]
