"""Where fast-model tests run, decided once before triton is imported (see conftest.py)."""

import os

import torch

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if ON_GPU else "cpu"
