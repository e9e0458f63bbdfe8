"""Build a Triton kernel for Hopper (sm_90) on a machine without a GPU and read what it needs: TTIR -> TTGIR -> PTX
-> cubin through ``triton.compile`` with the ptxas Triton ships, then the cubin's resource usage (``cuobjdump``). It
catches on the CPU what otherwise only the GPU's first launch shows: a helper that is not ``@triton.jit``, an op the
backend rejects, register spills, shared memory over the limit, too few programs resident per SM.

The kernel must be a ``JITFunction``: run this where ``TRITON_INTERPRET`` is unset (the ops tests set it, so they
run it in a subprocess).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_TARGET = GPUTarget("cuda", 90, 32)
# an H100/H200 SM: 64K 32-bit registers, at most 64 resident warps
_SM_REGISTERS, _SM_WARPS = 65536, 64


@dataclass(frozen=True)
class Sm90Build:
    registers: int  # per thread
    spill_bytes: int  # local memory per thread (spills)
    shared_bytes: int  # static + Triton's dynamic shared memory per program
    num_warps: int
    ttgir: str = field(default="", repr=False)  # the TritonGPU IR, where layouts and their conversions show
    cubin: bytes = field(default=b"", repr=False)

    @cached_property
    def sass_opcodes(self) -> list[str]:
        """The SASS opcode of every instruction, in program order (a predicate such as ``@!P0`` stripped)."""
        sass = _cuobjdump(self.cubin, "-sass")
        return re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(\S+)", sass, re.M)

    def opcodes(self, prefix: str) -> int:
        """SASS instructions whose opcode starts with `prefix` (e.g. "F2F." for the quarter-rate conversions)."""
        return sum(op.startswith(prefix) for op in self.sass_opcodes)

    def before(self, marker: str, prefix: str) -> int:
        """SASS instructions starting with `prefix` placed before the first `marker` instruction (all of them
        without one): e.g. the loads a kernel issues before PDL's wait on the kernel before it (ACQBULK)."""
        ops = self.sass_opcodes
        end = next((i for i, op in enumerate(ops) if op.startswith(marker)), len(ops))
        return sum(op.startswith(prefix) for op in ops[:end])

    def loop_conversions(self) -> int:
        """Layout conversions inside the kernel's loops (`ttg.convert_layout` between an `scf.for` and its
        `scf.yield`): each moves a tile between threads through shared memory, with barriers, every iteration."""
        count, depth = 0, 0
        for line in self.ttgir.splitlines():
            depth += "scf.for" in line
            count += depth > 0 and "ttg.convert_layout" in line
            depth -= depth > 0 and "scf.yield" in line
        return count

    @property
    def programs_per_sm(self) -> int:
        """Programs one SM holds at once, by registers and warps (shared memory is checked separately)."""
        return min(_SM_REGISTERS // (self.registers * 32 * self.num_warps), _SM_WARPS // self.num_warps)


def _cuobjdump(cubin: bytes, flag: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def _resources(cubin: bytes) -> tuple[int, int, int]:
    out = _cuobjdump(cubin, "-res-usage")
    found = {k: int(re.search(rf"{k}:(\d+)", out).group(1)) for k in ("REG", "LOCAL", "SHARED")}
    return found["REG"], found["LOCAL"], found["SHARED"]


def build_sm90(kernel, types: dict[str, str], constexprs: dict[str, object], num_warps: int,
               num_stages: int, divisible: tuple[str, ...] = ()) -> Sm90Build:
    """``types``: a Triton signature type ("*bf16", "i32", ...) per runtime argument; ``constexprs``: the value of
    every ``tl.constexpr`` argument without a default (one with a default takes it unless given); ``divisible``:
    the integer arguments a launch passes as multiples of 16.

    Specialised as a launch specialises it: every pointer 16-byte aligned (torch's allocations are) and the
    ``divisible`` integers (strides, K) multiples of 16. Without that the compiler cannot prove a tile's rows
    aligned, loads element by element and pipelines nothing, and the build says little of the launched kernel."""
    names = kernel.arg_names
    # a constexpr with a default (e.g. PDL) takes it unless given, as a launch that leaves it out does
    constexprs = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **constexprs}
    signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
    aligned = [n for n in names if n not in constexprs and (types[n].startswith("*") or n in divisible)]
    src = ASTSource(kernel, signature, constexprs={(names.index(n),): v for n, v in constexprs.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    compiled = triton.compile(src, target=_TARGET, options=dict(num_warps=num_warps, num_stages=num_stages))
    regs, local, static_shared = _resources(compiled.asm["cubin"])
    return Sm90Build(regs, local, static_shared + compiled.metadata.shared, num_warps, compiled.asm["ttgir"],
                     compiled.asm["cubin"])


def run_build_script(script: Path, args: list[str]) -> list[dict]:
    """Run a test's build script (it calls ``build_sm90`` and prints one JSON object a line) in a subprocess
    without ``TRITON_INTERPRET`` (the ops tests set it), from the repository root; the objects it printed.
    AssertionError with the script's stderr when it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
