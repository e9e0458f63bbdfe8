"""HostFunction: a Python call queued on a CUDA stream in stream order (the driver's ``cuLaunchHostFunc``), so that
a stream capture records it as a host node of the graph and every replay runs it between the nodes around it.

The seed's rules for such a node (its structured-output section) and CUDA's:
- the call makes no CUDA API call: it reads and writes pinned host buffers only (numpy views, made before);
- it runs on a driver thread and takes the GIL there, so the host never waits for its stream while holding the GIL
  (torch's waits, copies and kernel launches release it; the cyclic collector is what could free a CUDA block
  under the GIL, and frees return blocks to the caching allocator without a device sync);
- an exception never crosses into the driver: it is kept, and `take_error` hands it to the host after the stream's
  sync, before anything the call produced is used;
- the ctypes trampoline lives as long as this object, which the graph's owner keeps (its address is in the node).

Without CUDA the call runs at once when queued: the CPU stand-in of the same order.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable

import torch

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # CUhostFn: void (*)(void *userData); ctypes takes the GIL


@functools.cache
def _launch_host_func():
    """The driver's cuLaunchHostFunc(CUstream, CUhostFn, void *) -> CUresult (libcuda ships with the driver)."""
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchHostFunc
    fn.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


class HostFunction:
    def __init__(self, call: Callable[[], None]):
        self.call = call
        self.error: BaseException | None = None
        self._trampoline = _HOST_FN(self._run)

    def _run(self, _user_data) -> None:
        try:
            self.call()
        except BaseException as e:  # noqa: BLE001 - kept for the host: nothing may unwind into the driver
            self.error = e

    def queue(self, stream: "torch.cuda.Stream | None") -> None:
        """Run the call after the work queued on `stream` so far, before the work queued after it (at once when
        `stream` is None: no CUDA). Inside a capture of `stream` this records the host node."""
        if stream is None:
            self._run(None)
            return
        rc = _launch_host_func()(ctypes.c_void_p(stream.cuda_stream), self._trampoline, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchHostFunc failed with CUresult {rc}")

    def take_error(self) -> BaseException | None:
        """The exception the last runs raised (None: none), cleared."""
        error, self.error = self.error, None
        return error
