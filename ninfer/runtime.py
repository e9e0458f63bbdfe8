"""``Runtime``: what a Gateway holds once ``ninfer.wiring.build_runtime`` has loaded a model: the Frontend, the
Engine (generation) or the CausalScoreCore (scoring), the facts the ready line prints, and the seed stream of
requests that bring no seed of their own."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from ninfer.engine.engine import Engine
from ninfer.engine.scoring import CausalScoreCore
from ninfer.frontend import Frontend
from ninfer.runtime_options import RuntimeOptions
from ninfer.sampling.defaults import SamplingDefaults


@dataclass
class Runtime:
    """What a Gateway holds: the Frontend, and the Engine (generation) or the CausalScoreCore (scoring)."""

    options: RuntimeOptions
    name: str
    model_path: Path
    random_weights: bool
    program_kind: str
    frontend: Frontend
    max_context: int
    weights: str = ""  # where the weights came from, for the ready line (weights_origin)
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    engine: Engine | None = None
    scorer: CausalScoreCore | None = None
    load_seconds: float = 0.0
    speculative: str | None = None  # the speculative backend that runs ("mtp (k=3)"), None: plain decoding
    stages: str | None = None  # pipeline stages that run ("cpu,cpu: 2,2 layers"), None: one device
    eager: bool = False  # the fast Program runs without CUDA graphs (--enforce-eager)
    _seeds: random.Random = field(default_factory=random.Random)

    @property
    def purpose(self) -> str:
        return self.options.purpose

    @property
    def available(self) -> bool:
        core = self.engine if self.engine is not None else self.scorer
        return core is not None and core.available

    @property
    def failure(self) -> str | None:
        core = self.engine if self.engine is not None else self.scorer
        return None if core is None else core.failure

    def request_seed(self, seed: int | None) -> int | None:
        """A request's own seed, else one drawn from --seed's stream (so a seeded server replays), else None."""
        if seed is not None or self.options.seed is None:
            return seed
        return self._seeds.getrandbits(63)

    def summary(self) -> str:
        lanes = f"{self.options.max_num_seqs} lanes" if self.engine is not None else "serial scoring"
        cache = "prefix cache on" if self.options.enable_prefix_caching and self.engine is not None else "no cache"
        spec = f" | speculative {self.speculative}" if self.speculative else ""
        spec += f" | stages {self.stages}" if self.stages else ""
        spec += " | eager (no CUDA graphs)" if self.eager else ""
        sampling = f" | {self.sampling_defaults.describe()}" if self.engine is not None else ""
        return (f"ready: {self.name} ({self.weights}) | {self.purpose} on the {self.program_kind} Program | "
                f"context {self.max_context} | {lanes} | {cache}{spec}{sampling} | loaded in "
                f"{self.load_seconds:.1f} s")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        if self.scorer is not None:
            self.scorer.shutdown()
        self.frontend.close()
