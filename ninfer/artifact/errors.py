"""The one error type of the artifact layer."""

from __future__ import annotations

from ninfer.errors import ExitCode, NinferError


class ArtifactError(NinferError, ValueError):
    """A ``.ninfer`` file (or a write request) that breaks the container contract.

    ``subject`` names the object, binding, resource or descriptor field at fault and ``check`` the check that failed,
    so a corrupted file reports e.g. ``object 'layers.3.mlp.up_proj.weight': checksum mismatch ...``.
    """

    exit_code = ExitCode.CORRUPT
    hint = "convert the checkpoint again, or check the file with `ninfer inspect --verify FILE`"

    def __init__(self, subject: str, check: str, detail: str = ""):
        msg = f"{subject}: {check}"
        super().__init__(f"{msg} ({detail})" if detail else msg)
        self.subject = subject
        self.check = check
