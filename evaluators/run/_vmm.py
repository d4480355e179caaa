"""Device buffers in their own virtual-address reservations, fenced by unmapped gaps (issue 5).

A candidate that stores far outside its operands (the red team's ``oob_write_far``: one word 1
GiB past C) lands wherever the address happens to be mapped: in another buffer of the harness,
in torch's cache, or nowhere, so whether it is caught was luck. Here every buffer the candidate
can reach (the correctness operands, the timing rotation, its workspaces) gets its own
reservation ``[gap | mapped block | gap]`` made with the driver's virtual memory calls
(``cuMemAddressReserve`` + ``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``): a store up to
``gap_bytes`` (default 2 GiB) past either end of a block faults (``CUDA_ERROR_ILLEGAL_ADDRESS``,
status ``runtime_error``, the worker restarts), and inside the block every byte that is not data
is a canary (see :class:`evaluators.correctness.Guarded`), so a near store is ``incorrect``.

Blocks come back to a free list when torch drops the last tensor over them (the tensor keeps its
owner alive through ``__cuda_array_interface__``) and are reused last-in first-out by size, so a
fixed allocation order gives the same addresses job after job. Blocks are unmapped only in
:meth:`VmmAllocator.trim`, after a synchronise, at a point the harness chooses (never inside a
deleter, which could run during a graph capture).

:func:`make_allocator` falls back to plain ``torch.empty`` (:class:`TorchAllocator`, no gaps)
with a logged warning when the driver refuses; the harness then keeps its 64 MiB canaries.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Optional

__all__ = ["VmmAllocator", "TorchAllocator", "VmmUnavailable", "make_allocator", "DEFAULT_GAP_BYTES"]

log = logging.getLogger("evo.evaluators.vmm")

#: Unmapped bytes on each side of every block: a store this far past a buffer still faults.
DEFAULT_GAP_BYTES = 2 << 30
#: Idle blocks kept mapped for reuse before :meth:`VmmAllocator.trim` unmaps the oldest.
DEFAULT_KEEP_BYTES = 16 << 30


class VmmUnavailable(RuntimeError):
    """The driver's virtual memory management calls are not usable here."""


class _Block:
    __slots__ = ("base", "reserved", "ptr", "size", "handle")

    def __init__(self, base: int, reserved: int, ptr: int, size: int, handle: Any) -> None:
        self.base, self.reserved, self.ptr, self.size, self.handle = base, reserved, ptr, size, handle


class _Owner:
    """What a torch tensor over a block keeps alive; gives the block back when dropped."""

    def __init__(self, alloc: "VmmAllocator", block: _Block) -> None:
        self._alloc, self._block = alloc, block
        self.__cuda_array_interface__ = {"shape": (block.size,), "typestr": "|u1", "data": (block.ptr, False),
                                         "strides": None, "version": 2}

    def __del__(self) -> None:
        try:
            self._alloc._give_back(self._block)
        except Exception:  # interpreter shutdown: the process exit frees everything
            pass


class TorchAllocator:
    """Plain ``torch.empty`` bytes: no gaps (the fallback, and CPU tensors in tests)."""

    name = "torch"
    gap_bytes = 0

    def __init__(self, device: Any = "cuda") -> None:
        self.device = device

    def bytes(self, nbytes: int) -> Any:
        import torch

        return torch.empty(max(1, nbytes), dtype=torch.uint8, device=self.device)

    def trim(self, keep_bytes: Optional[int] = None) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"allocator": self.name}


class VmmAllocator:
    """Blocks in their own reservations with ``gap_bytes`` unmapped on both sides (see the module
    docstring). ``bytes(n)`` returns a uint8 torch tensor over a whole block (at least ``n`` bytes,
    rounded up to the allocation granularity, typically 2 MiB)."""

    name = "vmm"

    def __init__(self, device_ordinal: int = 0, gap_bytes: int = DEFAULT_GAP_BYTES,
                 keep_bytes: int = DEFAULT_KEEP_BYTES) -> None:
        try:
            from cuda.bindings import driver
        except ImportError as exc:
            raise VmmUnavailable(f"cuda.bindings is not installed: {exc}") from None
        import torch

        self.drv = driver
        self.torch = torch
        self.device = torch.device("cuda", device_ordinal)
        torch.cuda.init()
        torch.cuda.set_device(self.device)
        torch.empty(1, device=self.device)  # the primary context is current in this thread
        d = driver
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device_ordinal
        self.prop = prop
        access = d.CUmemAccessDesc()
        access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device_ordinal
        access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.access = access
        self.granularity = int(self._check("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity(
            prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
        self.gap_bytes = -(-gap_bytes // self.granularity) * self.granularity
        self.keep_bytes = keep_bytes
        self._free: dict[int, list[_Block]] = {}
        self._idle: list[_Block] = []  # oldest first, for trim
        self._lock = threading.Lock()
        self.created = self.reused = self.released = 0
        self.mapped_bytes = 0
        # self-test: a block round-trips data through torch, and its owner comes back to the list
        t = self.bytes(1)
        t.fill_(0x5A)
        if int(t[:4096].sum()) != 0x5A * 4096:
            raise VmmUnavailable("a mapped block did not read back what torch wrote")
        del t

    def _check(self, call: str, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise VmmUnavailable(f"{call}: {getattr(err, 'name', err)}")
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)

    def _create(self, size: int) -> _Block:
        d = self.drv
        reserved = size + 2 * self.gap_bytes
        base = int(self._check("cuMemAddressReserve", d.cuMemAddressReserve(reserved, self.granularity, 0, 0)))
        ptr = base + self.gap_bytes
        handle = None
        try:
            handle = self._check("cuMemCreate", d.cuMemCreate(size, self.prop, 0))
            self._check("cuMemMap", d.cuMemMap(d.CUdeviceptr(ptr), size, 0, handle, 0))
            try:
                self._check("cuMemSetAccess", d.cuMemSetAccess(d.CUdeviceptr(ptr), size, [self.access], 1))
            except Exception:
                d.cuMemUnmap(d.CUdeviceptr(ptr), size)
                raise
        except Exception:
            if handle is not None:
                d.cuMemRelease(handle)
            d.cuMemAddressFree(d.CUdeviceptr(base), reserved)
            raise
        self.created += 1
        self.mapped_bytes += size
        return _Block(base, reserved, ptr, size, handle)

    def bytes(self, nbytes: int) -> Any:
        """A uint8 tensor over a whole block of at least ``nbytes`` (LIFO reuse of a free block of
        the same rounded size, else a new reservation)."""
        size = -(-max(1, nbytes) // self.granularity) * self.granularity
        with self._lock:
            stack = self._free.get(size)
            block = stack.pop() if stack else None
            if block is not None:
                self._idle.remove(block)
                self.reused += 1
        if block is None:
            block = self._create(size)
        return self.torch.as_tensor(_Owner(self, block), device=self.device)

    def _give_back(self, block: _Block) -> None:
        with self._lock:
            self._free.setdefault(block.size, []).append(block)
            self._idle.append(block)

    def trim(self, keep_bytes: Optional[int] = None) -> None:
        """Unmap idle blocks (oldest first) until at most ``keep_bytes`` idle bytes stay mapped.
        Synchronises the device first: call it between jobs, never during a capture."""
        keep = self.keep_bytes if keep_bytes is None else keep_bytes
        with self._lock:
            idle = sum(b.size for b in self._idle)
            drop = []
            while self._idle and idle > keep:
                b = self._idle.pop(0)
                self._free[b.size].remove(b)
                idle -= b.size
                drop.append(b)
        if not drop:
            return
        self.torch.cuda.synchronize()
        d = self.drv
        for b in drop:
            d.cuMemUnmap(d.CUdeviceptr(b.ptr), b.size)
            d.cuMemRelease(b.handle)
            d.cuMemAddressFree(d.CUdeviceptr(b.base), b.reserved)
            self.mapped_bytes -= b.size
            self.released += 1

    def stats(self) -> dict[str, Any]:
        return {"allocator": self.name, "gap_bytes": self.gap_bytes, "granularity": self.granularity,
                "created": self.created, "reused": self.reused, "released": self.released,
                "mapped_bytes": self.mapped_bytes}


def make_allocator(kind: str, device_ordinal: int = 0, gap_bytes: int = DEFAULT_GAP_BYTES) -> Any:
    """``"vmm"``: a :class:`VmmAllocator`, or the torch one with a logged warning when the driver
    refuses; ``"torch"``: plain allocations."""
    if kind == "vmm":
        try:
            return VmmAllocator(device_ordinal, gap_bytes)
        except Exception as exc:
            log.warning("VA-reserved buffers unavailable (%s); falling back to plain allocations: stores far "
                        "outside a buffer are no longer sure to fault", exc)
            print(f"evo worker WARNING: VA-reserved buffers unavailable ({exc}); plain allocations", flush=True)
    elif kind != "torch":
        raise ValueError(f"unknown allocator {kind!r}: use 'vmm' or 'torch'")
    import torch

    return TorchAllocator(torch.device("cuda", device_ordinal))
