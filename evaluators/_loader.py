"""Loading cubins and launching kernels, behind one small interface with two backends.

``DriverLoader`` uses ``cuda.bindings.driver`` (cuModuleLoadData, cuModuleGetFunction,
cuFuncSetAttribute for > 48 KiB of dynamic shared memory, cuLaunchKernel on the caller's
stream with a ``void**`` parameter array built by :mod:`evaluators._tmap`). ``PycudaLoader``
offers the same interface where ``import pycuda.driver`` works (not on the device image);
:func:`get_loader` picks one. Every driver call is checked; a failing one raises
:class:`CudaError` with the error's name and string, and :attr:`CudaError.poisons` says whether
the context is now unusable (the worker must then exit, see ``_worker``).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence

__all__ = ["CudaError", "LoaderUnavailable", "Loader", "DriverLoader", "PycudaLoader", "get_loader",
           "POISONING_ERRORS", "nvrtc_cubin"]

#: Errors after which the CUDA context cannot be used again (sticky errors).
POISONING_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ASSERT", "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_UNKNOWN",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK",
})
#: The same errors as torch words them (torch raises RuntimeError with the runtime's string).
POISONING_WORDS = ("illegal memory access", "misaligned address", "illegal instruction", "unspecified launch failure",
                   "hardware stack error", "device-side assert", "invalid program counter", "operation not permitted when stream is capturing")


class CudaError(RuntimeError):
    """A failed CUDA call: ``name`` like ``CUDA_ERROR_ILLEGAL_ADDRESS`` and the driver's string."""

    def __init__(self, call: str, name: str, text: str = "") -> None:
        super().__init__(f"{call}: {name}" + (f" ({text})" if text else ""))
        self.call, self.name, self.text = call, name, text

    @property
    def poisons(self) -> bool:
        return self.name in POISONING_ERRORS


class LoaderUnavailable(RuntimeError):
    """The backend's Python package or driver cannot be used here."""


def is_poisoning(exc: BaseException) -> bool:
    """Whether an exception (ours or torch's) means the CUDA context is gone."""
    if isinstance(exc, CudaError):
        return exc.poisons
    text = str(exc).lower()
    return any(w in text for w in POISONING_WORDS)


class Kernel(Protocol):
    name: str


class Loader(Protocol):
    """What the harness needs from a backend."""

    name: str

    def load(self, cubin: bytes) -> Any: ...
    def function(self, module: Any, name: str, dynamic_smem: int) -> Any: ...
    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int, stream: int, params: int) -> None: ...
    def launcher(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int) -> Callable[[int, int], None]: ...
    def unload(self, module: Any) -> None: ...
    def synchronize(self) -> Optional[CudaError]: ...


class DriverLoader:
    """cuda.bindings.driver backend (the default; the device image has cuda-bindings 13.x)."""

    name = "driver"

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver
        except ImportError as exc:  # pragma: no cover - the venv and the device both have it
            raise LoaderUnavailable(f"cuda.bindings is not installed: {exc}") from None
        self.drv = driver

    def check(self, call: str, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            name = getattr(err, "name", str(err))
            e2, text = self.drv.cuGetErrorString(err)
            text = text.decode() if isinstance(text, bytes) else str(text)
            raise CudaError(call, name, text if int(e2) == 0 else "")
        return rest[0] if len(rest) == 1 else tuple(rest)

    def load(self, cubin: bytes) -> Any:
        return self.check("cuModuleLoadData", self.drv.cuModuleLoadData(cubin))

    def function(self, module: Any, name: str, dynamic_smem: int) -> Any:
        fn = self.check(f"cuModuleGetFunction({name})", self.drv.cuModuleGetFunction(module, name.encode()))
        if dynamic_smem > 48 * 1024:
            attr = self.drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self.check(f"cuFuncSetAttribute({name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={dynamic_smem})",
                       self.drv.cuFuncSetAttribute(fn, attr, dynamic_smem))
        return fn

    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int, stream: int, params: int) -> None:
        self.check("cuLaunchKernel", self.drv.cuLaunchKernel(fn, *grid, *block, smem, self.drv.CUstream(stream), params, 0))

    def launcher(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int) -> Callable[[int, int], None]:
        """``go(stream, params)``: :meth:`launch` with the launch geometry bound once, the stream
        handles converted once per stream, and the error path only on failure (the harness calls
        it thousands of times per candidate at tiny shapes)."""
        drv, launch, check = self.drv, self.drv.cuLaunchKernel, self.check
        gx, gy, gz = (int(v) for v in grid)
        bx, by, bz = (int(v) for v in block)
        success = drv.CUresult.CUDA_SUCCESS
        streams: dict[int, Any] = {}

        def go(stream: int, params: int) -> None:
            handle = streams.get(stream)
            if handle is None:
                handle = streams[stream] = drv.CUstream(stream)
            result = launch(fn, gx, gy, gz, bx, by, bz, smem, handle, params, 0)
            if result[0] is not success:  # check() raises on any non-zero code
                check("cuLaunchKernel", result)
        return go

    def unload(self, module: Any) -> None:
        self.drv.cuModuleUnload(module)

    def synchronize(self) -> Optional[CudaError]:
        """Synchronise the context; return the (sticky) error if the context is broken."""
        try:
            self.check("cuCtxSynchronize", self.drv.cuCtxSynchronize())
        except CudaError as exc:
            return exc
        return None


class PycudaLoader:
    """pycuda backend with the same interface; only where ``import pycuda.driver`` works."""

    name = "pycuda"

    def __init__(self) -> None:
        try:
            import pycuda.driver as cuda  # type: ignore[import-not-found]
        except Exception as exc:  # ImportError, or a pycuda built without a driver
            raise LoaderUnavailable(f"pycuda is not usable here: {exc}") from None
        self.cuda = cuda

    def load(self, cubin: bytes) -> Any:
        return self.cuda.module_from_buffer(cubin)

    def function(self, module: Any, name: str, dynamic_smem: int) -> Any:
        fn = module.get_function(name)
        if dynamic_smem > 48 * 1024:
            fn.set_attribute(self.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem)
        return fn

    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int, stream: int, params: int) -> None:
        # pycuda packs arguments itself; the harness's packed void** array is passed through the
        # driver entry point that pycuda wraps for raw launches.
        raise LoaderUnavailable("raw void** launches are not exposed by pycuda; use the driver backend")

    def launcher(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int) -> Callable[[int, int], None]:
        def go(stream: int, params: int) -> None:
            self.launch(fn, grid, block, smem, stream, params)
        return go

    def unload(self, module: Any) -> None:
        pass

    def synchronize(self) -> Optional[CudaError]:
        try:
            self.cuda.Context.synchronize()
        except Exception as exc:
            return CudaError("Context.synchronize", type(exc).__name__, str(exc))
        return None


def get_loader(name: str = "driver") -> Loader:
    """The named backend (``driver`` or ``pycuda``); raises :class:`LoaderUnavailable`."""
    if name == "driver":
        return DriverLoader()
    if name == "pycuda":
        return PycudaLoader()
    raise LoaderUnavailable(f"unknown loader {name!r}: use 'driver' or 'pycuda'")


def nvrtc_cubin(source: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """Compile a small header-free kernel with NVRTC (the harness's own probe kernels)."""
    from cuda.bindings import nvrtc

    def ok(res: Any) -> Any:
        err, *rest = res
        if int(err) != 0:
            raise RuntimeError(f"NVRTC: {err}")
        return rest[0] if rest else None

    prog = ok(nvrtc.nvrtcCreateProgram(source.encode(), b"probe.cu", 0, [], []))
    opts = [f"-arch={arch}".encode(), b"-std=c++17", *(o.encode() for o in options)]
    err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    if int(err) != 0:
        size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC failed: {log.decode(errors='replace')}")
    size = ok(nvrtc.nvrtcGetCUBINSize(prog))
    cubin = b" " * size
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
    nvrtc.nvrtcDestroyProgram(prog)
    return cubin
