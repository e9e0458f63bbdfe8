"""Where ops tests run, decided once before triton is imported (see conftest.py)."""

import os

import torch

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if ON_GPU else "cpu"
# elementwise kernels upcast right after every load, so bf16 io is testable in the interpreter too
IO_DTYPES = (torch.bfloat16, torch.float32)
# kernels that feed bf16 straight into tl.dot can only be checked in fp32 on CPU: the interpreter's bf16 arithmetic
# is wrong (ecosystem-notes.md section 7)
DOT_IO_DTYPES = (torch.bfloat16, torch.float32) if ON_GPU else (torch.float32,)
