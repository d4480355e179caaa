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
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from populations import Shape, TensorMapSpec

__all__ = ["TensorMapError", "TmapGeometry", "matrix_dims", "tmap_geometry", "encode_tensor_map", "ParamPack"]

TMAP_BYTES = 128
TMAP_ALIGN = 64


class TensorMapError(ValueError):
    """A tensor map the hardware cannot describe for this shape (alignment, box size)."""


def matrix_dims(matrix: str, shape: Shape) -> tuple[int, int]:
    """(rows, cols) of A, B or C as stored for ``shape``."""
    if matrix == "A":
        return shape.m, shape.k
    if matrix == "B":
        return (shape.n, shape.k) if shape.layout == "TN" else (shape.k, shape.n)
    if matrix == "C":
        return shape.m, shape.n
    raise TensorMapError(f"no matrix {matrix!r}")


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
    pitch = cols * 2
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
    """

    def __init__(self, args: Sequence[Any], pointers: Mapping[str, int], tmaps: Mapping[str, bytes]) -> None:
        self._keep: list[Any] = []
        self.kinds: list[str] = []
        for arg in args:
            if isinstance(arg, str):
                value = ctypes.c_uint64(int(pointers[arg]))
                self.kinds.append("ptr")
                self._keep.append(value)
            elif isinstance(arg, tuple) and arg[0] == "tmap":
                raw = tmaps[arg[1]]
                if len(raw) != TMAP_BYTES:
                    raise TensorMapError(f"tensor map {arg[1]!r} has {len(raw)} bytes, not {TMAP_BYTES}")
                store = ctypes.create_string_buffer(TMAP_BYTES + TMAP_ALIGN)
                offset = (-ctypes.addressof(store)) % TMAP_ALIGN
                ctypes.memmove(ctypes.addressof(store) + offset, raw, TMAP_BYTES)
                self.kinds.append("tmap")
                self._keep.append((store, offset))
            elif isinstance(arg, int) and not isinstance(arg, bool):
                if not -(2**31) <= arg < 2**31:
                    raise OverflowError(f"argument {arg} does not fit in int32")
                self.kinds.append("int")
                self._keep.append(ctypes.c_int32(arg))
            else:
                raise TypeError(f"cannot pass kernel argument {arg!r}")
        self._array = (ctypes.c_void_p * max(1, len(self._keep)))()
        for i, item in enumerate(self._keep):
            if isinstance(item, tuple):
                self._array[i] = ctypes.addressof(item[0]) + item[1]
            else:
                self._array[i] = ctypes.addressof(item)

    @property
    def address(self) -> int:
        """The ``void**`` to hand to cuLaunchKernel."""
        return ctypes.addressof(self._array)

    def arg_bytes(self, i: int) -> bytes:
        """The bytes argument ``i`` points at (what the driver will copy)."""
        size = {"ptr": 8, "int": 4, "tmap": TMAP_BYTES}[self.kinds[i]]
        return ctypes.string_at(self._array[i], size)

    def __len__(self) -> int:
        return len(self.kinds)
