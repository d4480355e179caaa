"""Loading cubins and launching kernels, behind one small interface with two backends.

``DriverLoader`` uses ``cuda.bindings.driver`` (cuModuleLoadData, cuModuleGetFunction,
cuFuncSetAttribute for > 48 KiB of dynamic shared memory, cuLaunchKernel on the caller's
stream with the ``void**`` parameter array of a :class:`evaluators.run._tmap.ParamPack`).
``PycudaLoader`` does the same through pycuda where ``import pycuda.driver`` works (the device
image lacks it; it builds from its sdist there: ``bench/pycuda_wheel_build.sh``), launching
with the pack's parameter block (``CU_LAUNCH_PARAM_BUFFER_POINTER``, pycuda's raw launch).
:func:`get_loader` picks one. Every driver call is checked; a failing one raises
:class:`CudaError` with the error's name and string, and :attr:`CudaError.poisons` says whether
the context is now unusable (the worker must then exit, see ``_worker``).

Launches go to a raw stream handle: torch's current stream (0, the legacy stream, in the
worker) or, for graph capture, the stream :meth:`Loader.capture_stream` gives (None: any stream
the caller makes will do; pycuda can only launch on streams it created).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence

from populations import Registry

__all__ = ["CudaError", "LoaderUnavailable", "Loader", "DriverLoader", "PycudaLoader", "LOADERS", "get_loader",
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


class Params(Protocol):
    """A kernel's arguments (:class:`evaluators.run._tmap.ParamPack`)."""

    address: int  # the void** array

    def param_buffer(self) -> bytes: ...


class Loader(Protocol):
    """What the harness needs from a backend."""

    name: str

    def load(self, cubin: bytes) -> Any: ...
    def function(self, module: Any, name: str, dynamic_smem: int) -> Any: ...
    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int, stream: int, params: Params) -> None: ...
    def launcher(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int) -> Callable[[int, Params], None]: ...
    def capture_stream(self) -> Optional[int]: ...
    def param_layout(self, fn: Any) -> Optional[list[tuple[int, int]]]: ...
    def resident_blocks(self, fn: Any, threads: int, smem: int) -> Optional[int]: ...
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

    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int, stream: int, params: Params) -> None:
        self.check("cuLaunchKernel", self.drv.cuLaunchKernel(fn, *grid, *block, smem, self.drv.CUstream(stream),
                                                             params.address, 0))

    def capture_stream(self) -> Optional[int]:
        return None  # any stream: cuLaunchKernel takes a raw handle

    def launcher(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int) -> Callable[[int, Params], None]:
        """``go(stream, params)``: :meth:`launch` with the launch geometry bound once, the stream
        handles converted once per stream, and the error path only on failure (the harness calls
        it thousands of times per candidate at tiny shapes)."""
        drv, launch, check = self.drv, self.drv.cuLaunchKernel, self.check
        gx, gy, gz = (int(v) for v in grid)
        bx, by, bz = (int(v) for v in block)
        success = drv.CUresult.CUDA_SUCCESS
        streams: dict[int, Any] = {}

        def go(stream: int, params: Params) -> None:
            handle = streams.get(stream)
            if handle is None:
                handle = streams[stream] = drv.CUstream(stream)
            result = launch(fn, gx, gy, gz, bx, by, bz, smem, handle, params.address, 0)
            if result[0] is not success:  # check() raises on any non-zero code
                check("cuLaunchKernel", result)
        return go

    def param_layout(self, fn: Any) -> Optional[list[tuple[int, int]]]:
        """Each parameter's (offset, size) in the parameter block of ``fn`` (from :meth:`function`),
        as the driver has it (``cuFuncGetParamInfo``, CUDA 12.4+); None where the driver cannot say."""
        query = getattr(self.drv, "cuFuncGetParamInfo", None)
        if query is None:  # cuda.bindings older than 12.4
            return None
        out: list[tuple[int, int]] = []
        while True:
            res = query(fn, len(out))
            if int(res[0]) == 0:
                out.append((int(res[1]), int(res[2])))
            elif res[0] == self.drv.CUresult.CUDA_ERROR_INVALID_VALUE:  # past the last parameter
                return out
            else:  # a driver without the query
                return None

    def resident_blocks(self, fn: Any, threads: int, smem: int) -> Optional[int]:
        """CTAs of ``fn`` (``threads`` each, ``smem`` dynamic shared bytes) one SM holds at once
        (``cuOccupancyMaxActiveBlocksPerMultiprocessor``)."""
        return int(self.check("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                              self.drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, int(threads), int(smem))))

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
    """pycuda backend with the same interface; only where ``import pycuda.driver`` works.

    It works in the CUDA context torch made current (the device's primary context, retained and
    pushed, so modules, pointers and streams are shared). pycuda launches a kernel with one
    parameter block (:meth:`ParamPack.param_buffer`), laid out at the offsets the driver gives
    for the kernel (asked through ``layouts``, a :class:`DriverLoader` on the same cubin: pycuda
    cannot say, and a block laid out by hand was wrong for an sm_90a kernel). It launches on a
    pycuda ``Stream`` or on the legacy stream (handle 0, torch's default); for graph capture
    :meth:`capture_stream` makes a pycuda stream the caller wraps (``torch.cuda.ExternalStream``).
    pycuda's exceptions become :class:`CudaError` named by the driver's error (looked up from its
    message)."""

    name = "pycuda"

    def __init__(self, device_ordinal: int = 0, cuda: Any = None, layouts: Any = None) -> None:
        if cuda is None:
            try:
                import pycuda.driver as cuda  # type: ignore[import-not-found]
            except Exception as exc:  # ImportError, or a pycuda built without a driver
                raise LoaderUnavailable(f"pycuda is not usable here: {exc}") from None
        self.cuda = cuda
        cuda.init()
        self.context = cuda.Device(device_ordinal).retain_primary_context()
        self.context.push()  # torch's primary context: pycuda's own bookkeeping must know it
        self._streams: dict[int, Any] = {}
        self._names = _error_names()
        self.layouts = layouts if layouts is not None else DriverLoader()
        import atexit

        atexit.register(self._pop)  # pycuda aborts the process at exit if a pushed context is left

    def _pop(self) -> None:
        try:
            self.context.pop()
        except Exception:
            pass

    def _error(self, call: str, exc: BaseException) -> CudaError:
        text = str(exc).split(" failed: ", 1)[-1].strip()
        return CudaError(call, self._names.get(text, f"PYCUDA_{type(exc).__name__.upper()}"), text)

    def load(self, cubin: bytes) -> Any:
        """(pycuda's module, the same cubin loaded through ``layouts``: only to ask the driver
        where each kernel wants its parameters; pycuda cannot say)."""
        try:
            module = self.cuda.module_from_buffer(cubin)
        except self.cuda.Error as exc:
            raise self._error("cuModuleLoadData", exc) from None
        return module, self.layouts.load(cubin)

    def function(self, module: Any, name: str, dynamic_smem: int) -> Any:
        """(pycuda's function, its parameters' (offset, size) as the driver lays them out)."""
        mod, raw = module
        try:
            fn = mod.get_function(name)
            if dynamic_smem > 48 * 1024:
                fn.set_attribute(self.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem)
        except self.cuda.Error as exc:
            raise self._error(f"cuModuleGetFunction({name})", exc) from None
        return fn, self.layouts.param_layout(self.layouts.function(raw, name, 0))

    def param_layout(self, fn: Any) -> Optional[list[tuple[int, int]]]:
        return fn[1]  # asked once, in function()

    def resident_blocks(self, fn: Any, threads: int, smem: int) -> Optional[int]:
        """Not known through pycuda (no occupancy call): the co-residency check is skipped."""
        return None

    def capture_stream(self) -> Optional[int]:
        """A new non-blocking pycuda stream's raw handle (the loader keeps the stream alive)."""
        stream = self.cuda.Stream(flags=1)  # CU_STREAM_NON_BLOCKING
        self._streams[int(stream.handle)] = stream
        return int(stream.handle)

    def _stream(self, handle: int) -> Any:
        if handle == 0:
            return None  # pycuda's None is the legacy stream
        stream = self._streams.get(handle)
        if stream is None:
            raise LoaderUnavailable(f"pycuda launches only on the legacy stream or on a stream from "
                                    f"capture_stream(); got stream {handle:#x}")
        return stream

    def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int, stream: int, params: Params) -> None:
        self.launcher(fn, grid, block, smem)(stream, params)

    def launcher(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int) -> Callable[[int, Params], None]:
        g, b = tuple(int(v) for v in grid), tuple(int(v) for v in block)
        function, layout = fn

        def go(stream: int, params: Params) -> None:
            try:
                function._launch_kernel(g, b, params.param_buffer(layout), smem, self._stream(stream))
            except self.cuda.Error as exc:
                raise self._error("cuLaunchKernel", exc) from None
        return go

    def unload(self, module: Any) -> None:
        self.layouts.unload(module[1])  # pycuda unloads its own module when its last reference goes

    def synchronize(self) -> Optional[CudaError]:
        try:
            self.cuda.Context.synchronize()
        except self.cuda.Error as exc:
            return self._error("cuCtxSynchronize", exc)
        return None


def _error_names() -> dict[str, str]:
    """The driver's error strings to their names (``an illegal memory access was encountered`` ->
    ``CUDA_ERROR_ILLEGAL_ADDRESS``), from cuda.bindings where it is installed; else empty."""
    names: dict[str, str] = {}
    try:
        from cuda.bindings import driver as drv

        for code in drv.CUresult:
            err, text = drv.cuGetErrorString(code)
            if int(err) == 0 and text:
                names[text.decode() if isinstance(text, bytes) else str(text)] = code.name
    except Exception:  # no cuda.bindings, or no driver to ask: names from the message only
        pass
    return names


#: The kernel loaders by name (``driver``, ``pycuda``); an unknown name raises :class:`LoaderUnavailable`.
LOADERS: Registry[Loader] = Registry("loader", error=LoaderUnavailable)
LOADERS.register("driver", DriverLoader)
LOADERS.register("pycuda", PycudaLoader)


def get_loader(name: str = "driver") -> Loader:
    """The named backend (``driver`` or ``pycuda``); raises :class:`LoaderUnavailable`."""
    return LOADERS.create(name)


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
