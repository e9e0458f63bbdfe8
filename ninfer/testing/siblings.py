"""Loading a test's sibling module by path: pytest runs in importlib mode, where a conftest or another test file
beside a test is not importable by name."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from types import ModuleType


def sibling(test_file: str, name: str) -> ModuleType:
    """The module `name` (a file name such as "conftest.py") beside `test_file` (a test's `__file__`), executed
    once per process."""
    return _load(pathlib.Path(test_file).resolve().with_name(name))


@functools.cache
def _load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
