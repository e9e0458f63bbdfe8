"""ninfer: an inference engine for the Qwen3.5 family with a reference Program as its oracle."""

__version__ = "0.1.0"
