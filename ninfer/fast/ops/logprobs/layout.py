"""The logprobs op's output row, shared by ``naive.py`` and ``triton.py``: int32 columns, float32 values stored as
their bits, so one device-to-host copy brings a row back whole."""

MAX_TOP = 20  # OpenAI's top_logprobs cap, vLLM's max_logprobs (SamplingParams.logprobs <= 20)

RANK = 0  # 1 + the number of tokens strictly more likely than the chosen one (vLLM's rank)
CHOSEN = 1  # the chosen token's logprob (float32 bits)
TOP_IDS = 2  # MAX_TOP ids, most likely first, ties to the lower id
TOP_VALUES = TOP_IDS + MAX_TOP  # their logprobs (float32 bits)
COLUMNS = TOP_VALUES + MAX_TOP
