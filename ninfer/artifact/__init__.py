"""The ``.ninfer`` v3 container: header, descriptor, objects/planes, Bindings, Uses, Frontend resources.

Public entry points: :func:`open_artifact` (alias ``open``) to read, :class:`ArtifactWriter` to write object by
object, :func:`write_artifact` to write a whole value-preserving model from logical tensors.
"""

from __future__ import annotations

from .build import write_artifact
from .descriptor import ACTIVATIONS, Binding, Descriptor, Object, Plane, Resource, Use, intersect_activations
from .errors import ArtifactError
from .reader import Artifact, open_artifact
from .writer import ArtifactWriter

open = open_artifact  # noqa: A001 - `ninfer.artifact.open(path, features=...)` reads like the builtin on purpose

__all__ = ["ACTIVATIONS", "Artifact", "ArtifactError", "ArtifactWriter", "Binding", "Descriptor", "Object", "Plane",
           "Resource", "Use", "intersect_activations", "open", "open_artifact", "write_artifact"]
