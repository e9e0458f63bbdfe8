"""The `ninfer` command line, one module per family of subcommands. Every model-running command builds its Program,
Frontend and Engine through `ninfer.wiring.build_runtime` and drives the public Engine path.

Heavy modules are imported inside each command so `ninfer --help` stays instant.
"""

from . import artifacts, bench, generation, oracle, serving  # noqa: F401 - each registers its commands on main
from .group import main

__all__ = ["main"]
