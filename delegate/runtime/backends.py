"""Python delegate backends for the .pte runner, looked up by backend id.

ExecuTorch's C++ runtime cannot call a Python backend, so our runner dispatches each
DelegateCall to a PyBackend registered under the delegate's id. Third parties add backends
through the `etwgpu.backends` entry-point group (name = backend id, value = PyBackend class).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable

import torch

from delegate.errors import BackendNotFoundError


@dataclass
class InitContext:
    """What a backend receives at init besides its processed blob."""

    compile_specs: dict                      # key -> bytes
    named_data: Callable[[str], bytes]       # key -> bytes (raises DelegateError if absent)
    device: str = "auto"                     # "auto" | "webgpu" | "cpu" as asked at load
    options: dict = field(default_factory=dict)


class PyBackend:
    """Interface of a runner backend. `init` returns a handle the runner keeps per delegate."""

    backend_id: str = ""
    # True: execute() also takes the runner's planned output tensors and writes into them,
    # returning them, so an output crosses the boundary without an extra copy.
    writes_outputs: bool = False

    def is_available(self) -> bool:
        return True

    def init(self, processed: bytes, ctx: InitContext) -> Any:
        raise NotImplementedError

    def execute(self, handle: Any, inputs: list, outputs: list | None = None) -> list[torch.Tensor]:
        """inputs: tensors and scalars in delegate-call order; returns the outputs in order.
        outputs (only when writes_outputs): the tensors to write the results into."""
        raise NotImplementedError

    def destroy(self, handle: Any) -> None:
        """Free everything `init` created for this handle."""

    def describe(self, handle: Any) -> dict:
        """For `inspect`: e.g. {"device": ..., "ops": [...]}."""
        return {}


_BACKENDS: dict[str, PyBackend] = {}
_loaded = False


def register_backend(backend_id: str, backend: PyBackend) -> None:
    _BACKENDS[backend_id] = backend


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    # Our own backend is always there, even without an installed distribution.
    from delegate.runtime.wgpu_backend import WgpuRuntimeBackend

    _BACKENDS.setdefault(WgpuRuntimeBackend.backend_id, WgpuRuntimeBackend())
    for ep in entry_points(group="etwgpu.backends"):
        if ep.name not in _BACKENDS:
            _BACKENDS[ep.name] = ep.load()()


def get_backend(backend_id: str) -> PyBackend:
    _load()
    try:
        return _BACKENDS[backend_id]
    except KeyError:
        raise BackendNotFoundError(
            f"backend id {backend_id!r}: expected one of {sorted(_BACKENDS)}, got an unknown id"
        ) from None


def backend_ids() -> list[str]:
    _load()
    return sorted(_BACKENDS)
