"""An exported library's format and its loader: ``evo.load_library(LIB)`` and :class:`EvoLibrary`.

The loader (:func:`load_library`) reads the manifest and returns an :class:`EvoLibrary` whose
``evo_hgemm(a, b)`` (also the torch custom op ``evo::hgemm``) runs the exported kernel for
known shapes on a GPU of the library's architecture and ``torch.matmul`` otherwise. That op is
Python over ctypes and costs more host time than torch.matmul; inside models use
:mod:`evo.torch` (a compiled ``TORCH_LIBRARY`` operator over the same launchers, and
``evo.torch.patch`` for ``nn.Linear``).

Sharing torch's GPU state: the library links CUDA's runtime statically (nvcc's default), so it
carries its own runtime instance. That instance uses whatever driver context is current on the
calling thread, which is the device's primary context torch made current, so both see the same
memory, and the launcher runs on the stream handle torch passes (``CUstream`` handles are the
driver's, valid across runtimes; graph capture happens at the driver level, so launches made
here are captured into torch's ``CUDAGraph``). The loader switches torch to the tensors' device
before a call when it is not the current one.
"""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from ._manifest import LIBRARY, MANIFEST_FORMAT, ExportError, ExportManifest, KernelEntry

__all__ = ["ExportError", "EvoLibrary", "PreparedWeight", "load_library", "evo_hgemm", "MANIFEST_FORMAT", "LIBRARY"]


def _arch_matches(arch: str, capability: tuple[int, int]) -> bool:
    digits = arch[3:].rstrip("a")
    return digits.isdigit() and int(digits) == capability[0] * 10 + capability[1]


class EvoLibrary:
    """An exported library: ``evo_hgemm(a, b)`` runs the exported kernel or falls back to matmul.

    ``reason`` says why the library is not used at all (None when it is); ``manifest`` is the
    :class:`ExportManifest`; ``kernels`` maps (M, N, K, layout) to its :class:`KernelEntry`. The host path per call: a dict lookup, the cached
    ctypes function, a torch allocation for C and the cached workspace.
    """

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = Path(path)
        self.manifest = ExportManifest.read(self.path)
        self.kernels: dict[tuple[int, int, int, str], KernelEntry] = {
            (e.m, e.n, e.k, e.layout): e for e in self.manifest.kernels}
        self.reason: Optional[str] = None
        self._lib: Optional[ctypes.CDLL] = None
        self._fns: dict[tuple[int, int, int, str, bool], Any] = {}
        self._workspaces: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        try:
            import torch
        except ImportError:
            self.reason = "torch is not installed"
            return
        if not torch.cuda.is_available():
            self.reason = "no CUDA device"
            return
        cap = torch.cuda.get_device_capability()
        if not _arch_matches(self.manifest.arch, cap):
            self.reason = f"library is for {self.manifest.arch}, the GPU is sm_{cap[0]}{cap[1]}"
            return
        try:
            self._lib = ctypes.CDLL(str(self.path / self.manifest.library))
        except OSError as exc:
            self.reason = f"cannot load the library: {exc}"

    @property
    def active(self) -> bool:
        return self._lib is not None

    def _function(self, key: tuple[int, int, int, str], prepared: bool = False) -> Any:
        """The launcher of ``key`` through ctypes (cached): the plain one, or with ``prepared`` the
        one for a B padded once (``prepared_b``: an ``ldb`` after B)."""
        fn = self._fns.get((*key, prepared))
        if fn is None:
            entry = self.kernels[key]
            fn = getattr(self._lib, _symbol(entry, prepared))
            fn.restype = ctypes.c_int
            b = [ctypes.c_void_p, ctypes.c_longlong] if prepared else [ctypes.c_void_p]
            fn.argtypes = [ctypes.c_void_p, *b, ctypes.c_void_p] + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2
            self._fns[(*key, prepared)] = fn
        return fn

    def route(self, a: Any, b: Any) -> Optional[tuple[int, int, int, str]]:
        """The exported kernel's key for ``a @ b``, or None when torch.matmul must do it."""
        import torch

        if self._lib is None or a.dim() != 2 or b.dim() != 2 or not a.is_cuda or not b.is_cuda:
            return None
        if a.dtype != torch.float16 or b.dtype != torch.float16 or a.device != b.device:
            return None
        if not a.is_contiguous():
            return None
        # Every exported kernel may use 16-byte loads (cp.async, TMA) from the matrix bases; a
        # view can start anywhere, and a misaligned access would poison the CUDA context.
        if a.data_ptr() % 16 or b.data_ptr() % 16:
            return None
        m, k = a.shape
        k2, n = b.shape
        if k != k2:
            return None
        for layout, fits in (("NN", b.is_contiguous()), ("TN", b.t().is_contiguous())):
            key = (m, n, k, layout)
            if fits and key in self.kernels:
                return key
        return None

    def launcher(self, key: tuple[int, int, int, str]) -> tuple[Any, int]:
        """(the exported C function for ``key``, its workspace bytes): for callers that own their
        buffers and want the bare host path, ``fn(A, B, C, M, N, K, workspace, stream) -> int``
        with device pointers as ints (0 = success; -1 = not on this device: run cuBLAS). Raises KeyError for a shape not exported and
        RuntimeError when the library is not loaded here (see ``reason``)."""
        if self._lib is None:
            raise RuntimeError(f"library not loaded: {self.reason}")
        return self._function(key), self.kernels[key].workspace_bytes

    def prepared_launcher(self, key: tuple[int, int, int, str]) -> Optional[Any]:
        """The exported C function for ``key`` that takes B padded once (``fn(A, B, ldb, C, M, N,
        K, workspace, stream) -> int``, see :meth:`prepare_weight`), or None where the kernel
        does not stage B. Raises like :meth:`launcher`."""
        if self._lib is None:
            raise RuntimeError(f"library not loaded: {self.reason}")
        return self._function(key, prepared=True) if self.kernels[key].prepared_b is not None else None

    def prepare_weight(self, weight: Any) -> "PreparedWeight":
        """``weight`` (N x K, fp16, as ``nn.Linear`` stores it: B of the TN layout) with, where an
        exported kernel of this (N, K) copies B into aligned rows every call (the alignment
        transform, K % 8 != 0), a zero-padded copy made now (rows a multiple of 64 elements
        apart), so that :meth:`evo_hgemm` with it copies only A per call. Costs N x K more memory
        where it pads; holds ``weight`` itself otherwise."""
        import torch

        if weight.dim() != 2 or weight.dtype != torch.float16:
            raise ValueError("prepare_weight needs a 2-D fp16 weight (N x K)")
        n, k = weight.shape
        w = weight.contiguous()
        wants = self._lib is not None and w.is_cuda and any(
            e.prepared_b for (_, en, ek, layout), e in self.kernels.items() if (en, ek, layout) == (n, k, "TN"))
        padded = None
        if wants:
            ldb = -(-k // 64) * 64
            padded = torch.zeros((n, ldb), dtype=torch.float16, device=w.device)
            padded[:, :k].copy_(w)
        return PreparedWeight(w, padded)

    def evo_hgemm(self, a: Any, b: Any) -> Any:
        """``a @ b`` (fp16, fp32 accumulation): the exported kernel where one fits, else torch.matmul.

        ``b`` may be a :class:`PreparedWeight` (from :meth:`prepare_weight`): then ``a @ weight.T``,
        through the kernel's launcher for a B padded once where it has one."""
        import torch

        if isinstance(b, PreparedWeight):
            return self._prepared_hgemm(a, b)
        key = self.route(a, b)
        if key is None:
            return torch.matmul(a, b)
        return self._launch(a, key, [b.data_ptr()], lambda: torch.matmul(a, b))

    def _launch(self, a: Any, key: tuple[int, int, int, str], b_args: list[int], fallback: Any,
                prepared: bool = False) -> Any:
        """Run ``key``'s launcher (``prepared``: the one for a B padded once) on ``a`` and B's
        arguments ``b_args``, on torch's current stream: C, or ``fallback()`` where the launcher
        says the kernel cannot run on this device (-1: a grid that must be resident does not fit)."""
        import torch

        m, n, k, _ = key
        c = torch.empty((m, n), dtype=torch.float16, device=a.device)
        entry = self.kernels[key]
        ws = self._workspace(a, entry.workspace_bytes)
        fn = self._function(key, prepared)
        other = a.device.index is not None and a.device.index != torch.cuda.current_device()
        with torch.cuda.device(a.device) if other else nullcontext():  # its runtime follows the current context
            rc = fn(a.data_ptr(), *b_args, c.data_ptr(), m, n, k, ws, torch.cuda.current_stream().cuda_stream)
        if rc == -1:
            return fallback()
        if rc:
            raise RuntimeError(f"{_symbol(entry, prepared)} failed with code {rc}")
        return c

    def _workspace(self, a: Any, nbytes: int) -> int:
        import torch

        if not nbytes:
            return 0
        wkey = (a.device.index or 0, nbytes)
        buf = self._workspaces.get(wkey)
        if buf is None:
            with self._lock:
                buf = self._workspaces.setdefault(wkey, torch.empty(nbytes, dtype=torch.uint8, device=a.device))
        return buf.data_ptr()

    def _prepared_hgemm(self, a: Any, pw: "PreparedWeight") -> Any:
        """``a @ pw.weight.T`` through the launcher for a B padded once, or the plain path."""
        import torch

        key = self.route(a, pw.weight.t())
        entry = self.kernels.get(key) if key is not None and key[3] == "TN" else None
        prep = entry.prepared_b if entry else None
        if prep is None or pw.padded is None or pw.padded.device != a.device:
            return self.evo_hgemm(a, pw.weight.t())
        return self._launch(a, key, [pw.padded.data_ptr(), pw.padded.stride(0)], lambda: torch.matmul(a, pw.weight.t()),
                            prepared=True)


def _symbol(entry: KernelEntry, prepared: bool) -> str:
    """The C symbol of ``entry``'s launcher: with ``prepared``, the one for a B padded once."""
    if prepared:
        assert entry.prepared_b is not None
        return entry.prepared_b.symbol
    return entry.symbol


@dataclass(frozen=True)
class PreparedWeight:
    """A weight (N x K, as ``nn.Linear`` stores it) and, where the library's kernels for its
    (N, K) would copy it into aligned rows every call, that copy made once (``padded``: N x ldb,
    ldb a multiple of 64, zeros past K). Made by :meth:`EvoLibrary.prepare_weight`; stays valid
    while ``weight`` is not changed (prepare it again after an update)."""

    weight: Any
    padded: Optional[Any]


_CURRENT: Optional[EvoLibrary] = None
_OP: Any = None


def _register_op() -> Any:
    """Register ``evo::hgemm`` once per process; it calls the most recently loaded library."""
    global _OP
    if _OP is None:
        import torch

        # An explicit schema: this module's annotations are strings (``from __future__``).
        @torch.library.custom_op("evo::hgemm", mutates_args=(), schema="(Tensor a, Tensor b) -> Tensor")
        def hgemm(a: Any, b: Any) -> Any:
            return _CURRENT.evo_hgemm(a, b) if _CURRENT is not None else torch.matmul(a, b)

        @hgemm.register_fake
        def _(a: Any, b: Any) -> Any:
            return a.new_empty((a.shape[0], b.shape[1]))

        _OP = hgemm
    return _OP


def load_library(path: Union[str, os.PathLike]) -> EvoLibrary:
    """Read an export's manifest, load its library where the GPU matches, register ``evo::hgemm``.

    Never fails for a library that cannot be used here (no GPU, other arch, missing .so): the
    returned library then routes everything to torch.matmul and says why in ``reason``. A
    missing or malformed manifest raises :class:`ExportError`."""
    global _CURRENT
    lib = EvoLibrary(path)  # ExportManifest.read: one-line ExportError on a bad manifest
    _CURRENT = lib
    try:
        _register_op()
    except ImportError:
        pass
    return lib


def evo_hgemm(a: Any, b: Any) -> Any:
    """``a @ b`` through the op ``evo::hgemm`` of the last :func:`load_library` (torch.matmul before one)."""
    return _register_op()(a, b)
