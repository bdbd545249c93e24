"""The pure-Python .pte runner, shaped like `executorch.runtime`.

    prog = Runtime.get().load_program("model.pte", device="auto")
    outs = prog.load_method("forward").execute([x])
    prog.destroy()

ExecuTorch's C++ runtime cannot call a Python backend, so we read the .pte with ExecuTorch's
own deserializer and interpret the execution plan (method.py): non-delegated kernels run as
ATen `.out` ops, DelegateCalls go to the Python backend registered under the delegate's id.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from delegate.errors import DelegateError, ProgramError
from delegate.runtime.memory import writable_bytes
from delegate.runtime.method import Method

# program.fbs: `file_identifier "ET12"`, at bytes 4..8 after the flatbuffer's root offset.
FILE_IDENTIFIER = b"ET12"
_EXT_MAGIC = b"eh00"      # optional extended header right after the identifier
_EXT_MIN_LENGTH = 24      # magic, length, program_size, segment_base_offset
_INLINE = 0               # DataLocation.INLINE


def read_source(source) -> bytes:
    """The bytes of a .pte given as bytes-like or as a path."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            return Path(source).read_bytes()
        except OSError as e:
            raise ProgramError(f".pte path {str(source)!r}: expected a readable file, "
                               f"got {type(e).__name__}: {e.strerror}") from None
    raise ProgramError(f".pte source: expected bytes or a path, got {type(source).__name__}")


def check_header(data: bytes) -> None:
    """Reject what is plainly not a whole ExecuTorch program before parsing it."""
    n = len(data)
    if n < 8:
        raise ProgramError(f".pte size: expected at least 8 bytes (root offset + "
                           f"{FILE_IDENTIFIER!r}), got {n}")
    if data[4:8] != FILE_IDENTIFIER:
        raise ProgramError(f".pte file identifier at bytes 4..8: expected {FILE_IDENTIFIER!r}, "
                           f"got {bytes(data[4:8])!r}")
    program_size = n
    if data[8:12] == _EXT_MAGIC:
        program_size = _check_extended_header(data)
    root = int.from_bytes(data[0:4], "little")
    if not 8 <= root <= program_size - 4:
        raise ProgramError(f".pte root table offset: expected within [8, {program_size - 4}], "
                           f"got {root}")


def _check_extended_header(data: bytes) -> int:
    n = len(data)
    if n < 8 + _EXT_MIN_LENGTH:
        raise ProgramError(f".pte extended header: expected {8 + _EXT_MIN_LENGTH} bytes, got {n}")
    length = int.from_bytes(data[12:16], "little")
    program_size = int.from_bytes(data[16:24], "little")
    seg_base = int.from_bytes(data[24:32], "little")
    seg_size = int.from_bytes(data[32:40], "little") if length > _EXT_MIN_LENGTH and n >= 40 else 0
    if length < _EXT_MIN_LENGTH:
        raise ProgramError(f".pte extended header length: expected >= {_EXT_MIN_LENGTH}, "
                           f"got {length}")
    if not 16 <= program_size <= n:
        raise ProgramError(f".pte program size: expected within [16, {n}] (the file size), "
                           f"got {program_size} (truncated file?)")
    if seg_base and not program_size <= seg_base <= n:
        raise ProgramError(f".pte segment base offset: expected within [{program_size}, {n}], "
                           f"got {seg_base} (truncated file?)")
    if seg_base and seg_base + seg_size > n:
        raise ProgramError(f".pte size: expected {seg_base + seg_size} bytes (segments end), "
                           f"got {n} (truncated file?)")
    return program_size


def read_pte(source):
    """PTEFile (bytes or path) via ExecuTorch's deserializer; any failure is a ProgramError."""
    data = read_source(source)
    check_header(data)
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        return deserialize_pte_binary(data)
    except Exception as e:  # noqa: BLE001 - corrupt flatbuffers fail in many ways
        raise ProgramError(f".pte contents: expected a valid ExecuTorch program, got "
                           f"{type(e).__name__}: {e}") from None


class Program:
    """A parsed .pte: its methods, constants, named data and delegate blobs."""

    def __init__(self, source, device: str = "auto", options: dict | None = None):
        pte = read_pte(source)
        self._program = pte.program
        self._mutable = pte.mutable_data or []
        self._named = pte.named_data
        self._device, self._options = device, dict(options or {})
        self._plans = {p.name: p for p in self._program.execution_plan or []}
        self._constants: dict[tuple, np.ndarray] = {}
        self._methods: list[Method] = []

    @property
    def method_names(self) -> set[str]:
        return set(self._plans)

    def load_method(self, name: str) -> Method:
        if name not in self._plans:
            raise ProgramError(f"method name: expected one of {sorted(self._plans)}, got {name!r}")
        try:
            method = Method(self, self._plans[name], self._device, self._options)
        except DelegateError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt plan the named checks missed
            raise ProgramError(f"method {name!r}: expected a loadable execution plan, got "
                               f"{type(e).__name__}: {e}") from e
        self._methods.append(method)
        return method

    # -- data the methods read ----------------------------------------------------------------
    def constant_region(self, idx: int, nbytes: int) -> np.ndarray:
        buffers = self._program.constant_buffer or []
        return self._region(("const", idx), buffers, idx, nbytes, "constant buffer")

    def mutable_region(self, idx: int, nbytes: int) -> np.ndarray:
        # A fresh copy: each method's buffer starts from the serialized state.
        return self._region(("mut", idx), self._mutable, idx, nbytes, "mutable data").copy()

    def _region(self, key, buffers, idx: int, nbytes: int, what: str) -> np.ndarray:
        if not 0 < idx < len(buffers):
            raise ProgramError(f"{what} index: expected [1, {len(buffers)}), got {idx}")
        if key not in self._constants:
            self._constants[key] = writable_bytes(buffers[idx].storage)
        data = self._constants[key]
        if data.size < nbytes:
            raise ProgramError(f"{what} {idx}: expected at least {nbytes} bytes, got {data.size}")
        return data[:nbytes]

    def named_bytes(self, key: str) -> bytes:
        """Named data by key (for backends' InitContext); ProgramError when absent."""
        entry = self._named.pte_data.get(key) if self._named is not None else None
        if entry is None:
            known = sorted(self._named.pte_data) if self._named is not None else []
            raise ProgramError(f"named data key: expected one of {known}, got {key!r}")
        buf = self._named.buffers[entry.buffer_index]
        return buf if isinstance(buf, bytes) else buf.to_bytes()

    def named_region(self, key: str, nbytes: int) -> np.ndarray:
        if ("named", key) not in self._constants:
            self._constants[("named", key)] = writable_bytes(self.named_bytes(key))
        data = self._constants[("named", key)]
        if data.size < nbytes:
            raise ProgramError(f"named data {key!r}: expected {nbytes} bytes, got {data.size}")
        return data[:nbytes]

    def delegate_bytes(self, ref) -> bytes:
        blobs = self._program.backend_delegate_data or []
        if int(ref.location) != _INLINE or not 0 <= ref.index < len(blobs):
            raise ProgramError(f"delegate data reference: expected an inline index in "
                               f"[0, {len(blobs)}), got {ref}")
        return bytes(blobs[ref.index].data)

    # -- lifetime -----------------------------------------------------------------------------
    def destroy(self) -> None:
        """Destroy every delegate of every loaded method; idempotent."""
        methods, self._methods = self._methods, []
        for m in methods:
            m.destroy()

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


class Runtime:
    """Process-wide entry point, as `executorch.runtime.Runtime`."""

    _instance: "Runtime | None" = None

    @classmethod
    def get(cls) -> "Runtime":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def load_program(self, source, device: str = "auto", options: dict | None = None) -> Program:
        return Program(source, device=device, options=options)
