"""Count the device launches of a piece of model code, on a CPU (through the Triton interpreter) as on a GPU: every
Triton kernel launch, and every torch op that runs a kernel (views and allocations run none). That is what a CUDA
graph of the code replays, node for node, except that one cuBLAS GEMM may be two kernels (a split-K reduce), which
only a device profile sees (benchmarks/gpu/profile_fast.py).

``with LaunchCounter() as c: ...`` records ``(section, name)`` per launch; ``c.section("gdn")`` attributes the
launches inside it, and ``c.syncs`` lists the ops that read a device value back (a graph body must have none).
``count_step(fn)`` counts one call (a decode step, a prefill piece) with the fast model's sublayers as sections (``gdn``, ``attention``, ``ffn``;
the rest is ``step``). Run the code once before counting: an autotuned kernel's first call launches every
configuration it times.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# ops that only allocate or re-describe memory: no kernel. (Views are recognised by their schema.)
_NO_KERNEL = {aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
              aten.new_empty_strided.default, aten.empty_like.default, aten._unsafe_view.default,
              aten.detach.default, aten.lift_fresh.default, aten.set_.source_Storage_storage_offset}
# ops that copy a device value to the host
_SYNCS = {aten._local_scalar_dense.default, aten.is_nonzero.default}


def _triton_kernel_classes() -> list[type]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    return [JITFunction, InterpretedFunction]


# the fast model's sublayer forwards, as ninfer.fast.model.model calls them, and the section each one's launches go to
SUBLAYERS = {"gdn_mixer": "gdn", "attention_mixer": "attention", "ffn": "ffn"}


class LaunchCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.launches: list[tuple[str, str]] = []
        self.syncs: list[str] = []
        self._section = "step"
        self._in_kernel = 0  # the interpreter runs a kernel through torch ops of its own: not launches
        self._saved: list[tuple[type, object]] = []

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        outer, self._section = self._section, name
        try:
            yield
        finally:
            self._section = outer

    def counts(self) -> Counter:
        """Launches per section."""
        return Counter(s for s, _ in self.launches)

    def names(self, section: str) -> list[str]:
        return [n for s, n in self.launches if s == section]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._in_kernel:
            if func in _SYNCS:
                self.syncs.append(str(func))
            elif not func.is_view and func not in _NO_KERNEL:
                self.launches.append((self._section, f"aten.{func.overloadpacket.__name__}"))
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> "LaunchCounter":
        for cls in _triton_kernel_classes():
            self._saved.append((cls, cls.run))
            cls.run = self._counted(cls.run)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        for cls, run in self._saved:
            cls.run = run
        self._saved.clear()

    def _counted(self, run):
        counter = self

        def counted_run(kernel, *args, grid, warmup, **kwargs):
            if not warmup and not counter._in_kernel:
                counter.launches.append((counter._section, kernel.__name__))
            counter._in_kernel += 1
            try:
                return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                counter._in_kernel -= 1
        return counted_run


def count_step(fn: Callable[[], object]) -> LaunchCounter:
    """Count the launches of ``fn()`` (a fast-model call), each sublayer's in its own section."""
    import ninfer.fast.model.model as model_module
    counter = LaunchCounter()
    saved = {name: getattr(model_module, name) for name in SUBLAYERS}

    def sectioned(name: str):
        def run(*args, **kwargs):
            with counter.section(SUBLAYERS[name]):
                return saved[name](*args, **kwargs)
        return run
    try:
        for name in SUBLAYERS:
            setattr(model_module, name, sectioned(name))
        with counter:
            fn()
    finally:
        for name, f in saved.items():
            setattr(model_module, name, f)
    return counter
