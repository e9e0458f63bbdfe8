"""The expected failures a user can meet, and the exit status each one ends a command with.

Every ninfer error class that a user can provoke (a bad config, a corrupted artifact, a missing file, a tokenizer of
another family, an option that cannot be honoured) derives from `NinferError`. The CLI prints it as one line,
``error: <what> (<where>)``, with a ``hint:`` line where one helps, and exits with its `ExitCode`; the traceback
only with ``--debug`` or ``NINFER_DEBUG=1``. Imports nothing, so every layer may use it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The documented exit statuses of `ninfer` (docs/cli.md lists them)."""

    FAILED = 1  # the command ran and its result is a failure (lines not scored, a broken checksum, over tolerance)
    USAGE = 2  # a bad flag or option value, or flags that contradict each other
    NOT_FOUND = 3  # a file or directory that was named does not exist
    BAD_MODEL = 4  # not a Qwen3.5 model ninfer can run: config, architecture, tensors, tokenizer
    CORRUPT = 5  # a .ninfer artifact that breaks its container contract (checksum, truncation, descriptor)
    UNAVAILABLE = 6  # this machine cannot run what was asked (no GPU for --program fast, memory)
    INTERNAL = 70  # an unexpected exception: a bug in ninfer


class NinferError(Exception):
    """An expected failure. ``what`` is the message; ``where`` the file, field or flag at fault (set by the layer
    that knows it, see :meth:`locate`); ``hint`` what the user can do about it."""

    exit_code: ExitCode = ExitCode.FAILED
    where: str | None = None
    hint: str | None = None

    @property
    def what(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__

    def locate(self, where: str, *, hint: str | None = None) -> "NinferError":
        """Record the place at fault unless a deeper layer already did; returns self, to be re-raised."""
        if self.where is None:
            self.where = where
        if hint is not None and self.hint is None:
            self.hint = hint
        return self


class UsageError(NinferError):
    """Options that cannot be honoured together or as given."""

    exit_code = ExitCode.USAGE


class NotFoundError(NinferError):
    """A named file or directory that is not there."""

    exit_code = ExitCode.NOT_FOUND


class UnavailableError(NinferError):
    """What was asked needs something this machine lacks."""

    exit_code = ExitCode.UNAVAILABLE


class NotSupportedError(UnavailableError, NotImplementedError):
    """A feature this build does not run (speculative decoding on the fast Program, quantized kernels)."""


class DoesNotFitError(UnavailableError, MemoryError):
    """The model and its context do not fit the memory budget."""

    hint = "lower --max-model-len or --max-num-seqs, or raise --gpu-memory-utilization"


def one_line(text: str) -> str:
    """A message folded onto one line (multi-line details joined with '; ')."""
    parts = (part.strip() for part in text.splitlines())
    return "; ".join(part.removeprefix("- ") for part in parts if part)


def render(error: NinferError) -> list[str]:
    """The lines the CLI prints for an expected failure: ``error: what (where)`` and an optional ``hint:``."""
    head = f"error: {one_line(error.what)}"
    if error.where:
        head += f" ({error.where})"
    return [head] + ([f"hint: {error.hint}"] if error.hint else [])
