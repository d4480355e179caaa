"""Kernel parameters from a resolved plan: pointers, int32s and TMA tensor maps (contracts.md §1).

The driver takes a ``void**`` array whose entries point at each argument's bytes; it copies them
at launch (also during graph capture), so a :class:`ParamPack` only has to outlive the launch
call. Pointers are 8 bytes, integers are 32-bit ``int``, a ``tmap:NAME`` argument is the
128-byte ``CUtensorMap`` by value, held in a 64-byte aligned buffer.

Tensor maps are described over the matrix *as stored*, row-major: globalDim = (cols, rows),
globalStrides = (row pitch in bytes,), boxDim = (box cols, box rows), elementStrides = (1, 1),
fp16, no interleave, the spec's swizzle, L2 promotion 128B, out-of-bounds fill zeros. TMA needs
a 16-byte aligned base and a row pitch that is a multiple of 16 bytes (cols % 8 == 0 in fp16).
"""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from populations import Shape, TensorMapSpec, staged_pitch, stored_dims

__all__ = ["TensorMapError", "TmapGeometry", "matrix_dims", "tmap_geometry", "encode_tensor_map", "ParamPack", "TmapCache"]

TMAP_BYTES = 128
TMAP_ALIGN = 64
#: Bytes and alignment of each kind of kernel argument (a ``CUtensorMap`` is passed by value).
ARG_BYTES = {"ptr": 8, "int": 4, "tmap": TMAP_BYTES}
ARG_ALIGN = {"ptr": 8, "int": 4, "tmap": TMAP_ALIGN}


class TensorMapError(ValueError):
    """A tensor map the hardware cannot describe for this shape (alignment, box size)."""


def matrix_dims(matrix: str, shape: Shape) -> tuple[int, int]:
    """(rows, cols) of A, B or C as stored for ``shape``."""
    if matrix not in ("A", "B", "C"):
        raise TensorMapError(f"no matrix {matrix!r}")
    return stored_dims(matrix, shape)


@dataclass(frozen=True)
class TmapGeometry:
    global_dim: tuple[int, int]      # innermost first: (cols, rows)
    global_strides: tuple[int]       # (row pitch in bytes,)
    box_dim: tuple[int, int]         # (box cols, box rows)
    element_strides: tuple[int, int]
    swizzle: int


def tmap_geometry(spec: TensorMapSpec, shape: Shape) -> TmapGeometry:
    """The encoding arguments for ``spec`` at ``shape``; raises :class:`TensorMapError` if illegal."""
    rows, cols = matrix_dims(spec.matrix, shape)
    # a staged copy (the plan's alignment transform) has the matrix's rows and columns and a
    # pitch rounded up; TMA zero-fills the columns past ``cols``, so the pad is never read
    pitch = (staged_pitch(cols, spec.staged) if spec.staged else cols) * 2
    if pitch % 16:
        raise TensorMapError(f"tensor map over {spec.matrix} ({rows}x{cols}) needs a row pitch that is a multiple "
                             f"of 16 bytes; {cols} fp16 columns give {pitch}")
    box_rows, box_cols = spec.box
    if spec.swizzle and box_cols * 2 > spec.swizzle:
        raise TensorMapError(f"tensor map box of {box_cols} fp16 columns ({box_cols * 2} B) exceeds the "
                             f"{spec.swizzle}-byte swizzle span")
    if (box_cols * 2) % 16:
        raise TensorMapError(f"tensor map box inner size {box_cols * 2} B is not a multiple of 16 bytes")
    return TmapGeometry((cols, rows), (pitch,), (box_cols, box_rows), (1, 1), spec.swizzle)


def encode_tensor_map(spec: TensorMapSpec, shape: Shape, address: int) -> bytes:
    """Encode a CUtensorMap with cuTensorMapEncodeTiled; returns its 128 bytes."""
    from cuda.bindings import driver as drv

    from ._loader import DriverLoader

    if address % 16:
        raise TensorMapError(f"tensor map base address {address:#x} is not 16-byte aligned")
    g = tmap_geometry(spec, shape)
    swizzle = {0: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, 32: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
               64: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B, 128: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    tmap = DriverLoader().check(
        f"cuTensorMapEncodeTiled({spec.matrix}, box={spec.box}, swizzle={spec.swizzle})",
        drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, address,
            [drv.cuuint64_t(d) for d in g.global_dim], [drv.cuuint64_t(s) for s in g.global_strides],
            [drv.cuuint32_t(b) for b in g.box_dim], [drv.cuuint32_t(e) for e in g.element_strides],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle[g.swizzle],
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    return ctypes.string_at(tmap.getPtr(), TMAP_BYTES)


class ParamPack:
    """The ``void**`` array for one launch; keep it alive until the launch call returns.

    ``args`` come from :meth:`LaunchPlan.resolve`: ``"A"``/``"B"``/``"C"``/``"workspace"``,
    ``("tmap", name)`` or an ``int``. ``pointers`` maps the four names to device addresses and
    ``tmaps`` maps names to their 128 encoded bytes.

    All argument bytes live in one ctypes buffer, laid out once per ``args`` (tensor maps first,
    64-byte aligned, then the 8-byte pointers, then the 32-bit ints); the ``void**`` array points
    into it and never changes. The driver copies the argument bytes at launch (graph capture
    included), so the harness keeps one pack per launch and :meth:`fill` rewrites the pointers
    and tensor maps in place for the next call: no allocation per launch (4096 launches per
    candidate at tiny shapes).
    """

    def __init__(self, args: Sequence[Any], pointers: Optional[Mapping[str, int]] = None,
                 tmaps: Optional[Mapping[str, bytes]] = None) -> None:
        kinds: list[str] = []
        ints: list[int] = []
        self.pointer_names: tuple[str, ...] = ()
        self.tmap_names: tuple[str, ...] = ()
        names, tnames = [], []
        for arg in args:
            if isinstance(arg, str):
                kinds.append("ptr")
                names.append(arg)
            elif isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "tmap":
                kinds.append("tmap")
                tnames.append(arg[1])
            elif isinstance(arg, int) and not isinstance(arg, bool):
                if not -(2**31) <= arg < 2**31:
                    raise OverflowError(f"argument {arg} does not fit in int32")
                kinds.append("int")
                ints.append(arg)
            else:
                raise TypeError(f"cannot pass kernel argument {arg!r}")
        self.kinds, self.pointer_names, self.tmap_names = kinds, tuple(names), tuple(tnames)
        n_t, n_p = len(tnames), len(names)
        self._ptr_off = n_t * TMAP_BYTES  # offsets from the 64-byte aligned base
        int_off = self._ptr_off + 8 * n_p
        size = int_off + 4 * len(ints)
        self._store = ctypes.create_string_buffer(size + TMAP_ALIGN)
        self._view = memoryview(self._store).cast("B")  # byte slices of a ctypes array are slow
        base = ctypes.addressof(self._store)
        self._base = (-base) % TMAP_ALIGN  # buffer offset of the aligned base
        self._ptr_fmt = f"<{n_p}Q"
        struct.pack_into(f"<{len(ints)}i", self._store, self._base + int_off, *ints)
        slots, counts = [], {"tmap": 0, "ptr": 0, "int": 0}
        starts = {"tmap": 0, "ptr": self._ptr_off, "int": int_off}
        for kind in kinds:
            slots.append(base + self._base + starts[kind] + ARG_BYTES[kind] * counts[kind])
            counts[kind] += 1
        self._array = (ctypes.c_void_p * max(1, len(kinds)))(*slots)
        self.address = ctypes.addressof(self._array)  #: the ``void**`` to hand to cuLaunchKernel
        if pointers is not None or tmaps is not None or not (names or tnames):
            self.fill(pointers or {}, tmaps or {})

    def fill(self, pointers: Mapping[str, int], tmaps: Mapping[str, bytes]) -> None:
        """Write this launch's pointers and tensor maps (the ints were written once)."""
        if self.pointer_names:
            self.set_pointers([pointers[n] for n in self.pointer_names])
        for i, name in enumerate(self.tmap_names):
            self.set_tmap(i, tmaps[name], name)

    def set_pointers(self, values: Sequence[int]) -> None:
        """The pointer arguments' values, in the order of :attr:`pointer_names`."""
        try:
            struct.pack_into(self._ptr_fmt, self._view, self._base + self._ptr_off, *values)
        except struct.error as exc:
            raise ValueError(f"kernel pointer arguments {list(values)!r}: {exc}") from None

    def set_tmap(self, i: int, raw: bytes, name: str = "") -> None:
        """The ``i``-th tensor map argument's 128 bytes (in the order of :attr:`tmap_names`)."""
        if len(raw) != TMAP_BYTES:
            raise TensorMapError(f"tensor map {name or i!r} has {len(raw)} bytes, not {TMAP_BYTES}")
        at = self._base + i * TMAP_BYTES
        self._view[at:at + TMAP_BYTES] = raw

    def arg_bytes(self, i: int) -> bytes:
        """The bytes argument ``i`` points at (what the driver will copy)."""
        return ctypes.string_at(self._array[i], ARG_BYTES[self.kinds[i]])

    def param_buffer(self, layout: Optional[Sequence[tuple[int, int]]] = None) -> bytes:
        """The arguments as one parameter block, for launchers that take a buffer
        (``CU_LAUNCH_PARAM_BUFFER_POINTER``, pycuda's only way) rather than the ``void**`` array.

        ``layout``: each argument's (offset, size) as the driver reports them for the kernel
        (``cuFuncGetParamInfo``). It must be used where known: on the H200 with CUDA 13 an sm_90a
        kernel with tensor maps by value had its first parameter at offset 48, and a block laid
        out from 0 left C unwritten at small shapes (``bench/pycuda_launch_check.py``). Without
        it: in order, each at its natural alignment (pointers 8, ints 4, tensor maps 64)."""
        layout = self.natural_layout() if layout is None else layout
        self.check_layout(layout)
        out = bytearray(max((at + size for at, size in layout), default=0))
        for i, (at, size) in enumerate(layout):
            out[at:at + size] = ctypes.string_at(self._array[i], size)
        return bytes(out)

    def natural_layout(self) -> list[tuple[int, int]]:
        """(offset, size) of each argument in order, each at its natural alignment from 0."""
        out, end = [], 0
        for kind in self.kinds:
            end = -(-end // ARG_ALIGN[kind]) * ARG_ALIGN[kind]
            out.append((end, ARG_BYTES[kind]))
            end += ARG_BYTES[kind]
        return out

    def check_layout(self, layout: Sequence[tuple[int, int]]) -> None:
        """Raise ValueError unless the kernel's parameters (``(offset, size)`` each, as the driver
        reports them) are as many as the plan's arguments and each has the size of what the plan
        passes there: a pointer where the kernel takes an int is read as garbage otherwise."""
        if len(layout) != len(self.kinds):
            raise ValueError(f"the kernel takes {len(layout)} parameters, the plan passes {len(self.kinds)}")
        for i, (_, size) in enumerate(layout):
            have = ARG_BYTES[self.kinds[i]]
            if size != have:
                raise ValueError(f"kernel parameter {i} has {size} bytes, the plan passes a {self.kinds[i]} "
                                 f"of {have}")

    def __len__(self) -> int:
        return len(self.kinds)


class TmapCache:
    """Encoded tensor maps by (geometry, base address), shared by every candidate of a worker.

    An encoding is a pure function of its arguments (dtype fp16, rank 2, the geometry, the
    address, fixed interleave/promotion/fill), so a cached one is the bytes a fresh
    ``cuTensorMapEncodeTiled`` would give. The timing rotation's buffers are reused by every
    candidate of a shape (4096 sets at tiny shapes): each address is encoded once per worker
    instead of once per candidate. Holds at most ``limit`` maps (then starts over)."""

    def __init__(self, limit: int = 1 << 16, encode: Optional[Callable[[TensorMapSpec, Shape, int], bytes]] = None) -> None:
        self.limit = limit
        self.encode = encode
        self._by_geometry: dict[TmapGeometry, dict[int, bytes]] = {}
        self._size = 0
        self.hits = self.misses = 0

    def table(self, spec: TensorMapSpec, shape: Shape) -> Callable[[int], bytes]:
        """``get(address) -> bytes`` for ``spec`` at ``shape``; raises :class:`TensorMapError` if
        the geometry is illegal (checked here, once per bind)."""
        geometry = tmap_geometry(spec, shape)
        inner = self._by_geometry.setdefault(geometry, {})
        encode = self.encode or encode_tensor_map

        def get(address: int) -> bytes:
            raw = inner.get(address)
            if raw is None:
                raw = encode(spec, shape, address)  # alignment checked on every miss
                self.misses += 1
                if self._size >= self.limit:
                    for other in self._by_geometry.values():
                        other.clear()
                    self._size = 0
                inner[address] = raw
                self._size += 1
            else:
                self.hits += 1
            return raw
        return get
