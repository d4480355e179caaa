"""The harness's launch path on CPU: one reused parameter pack per launch, tensor maps cached
across candidates by (geometry, address), the bound driver launcher. The driver is the boundary
we cannot cross here: a stand-in records what cuLaunchKernel would have copied (test double)."""
from __future__ import annotations

import ctypes
import struct
import types

import pytest

from evaluators.run._tmap import TMAP_BYTES, ParamPack, TensorMapError, TmapCache, tmap_geometry
from populations import LaunchPlan, Shape, TensorMapSpec

torch = pytest.importorskip("torch")


def _copied(params: int, kinds: list[str]) -> list[bytes]:
    """What the driver copies at launch: each argument's bytes through the void** array."""
    arr = (ctypes.c_void_p * len(kinds)).from_address(params)
    size = {"ptr": 8, "int": 4, "tmap": TMAP_BYTES}
    return [ctypes.string_at(arr[i], size[k]) for i, k in enumerate(kinds)]


def test_a_reused_pack_carries_each_calls_arguments_and_keeps_its_array():
    args = (("tmap", "tmA"), "C", 7, ("tmap", "tmB"), "A", -3)
    pack = ParamPack(args)
    address, slots = pack.address, list((ctypes.c_void_p * 6).from_address(pack.address))
    for call in range(3):
        ptrs = {"A": 0x7F00_0000_0000 + call, "C": 0x7E00_0000_0000 + 256 * call}
        maps = {"tmA": bytes([call]) * 128, "tmB": bytes([call + 9]) * 128}
        pack.fill(ptrs, maps)
        assert pack.address == address and list((ctypes.c_void_p * 6).from_address(address)) == slots
        got = _copied(pack.address, pack.kinds)
        assert got[0] == maps["tmA"] and got[3] == maps["tmB"]
        assert struct.unpack("<Q", got[1])[0] == ptrs["C"] and struct.unpack("<Q", got[4])[0] == ptrs["A"]
        assert struct.unpack("<i", got[2])[0] == 7 and struct.unpack("<i", got[5])[0] == -3
        assert slots[0] % 64 == 0 and slots[3] % 64 == 0  # CUtensorMap needs 64-byte alignment
    assert ParamPack(args, ptrs, maps).arg_bytes(1) == pack.arg_bytes(1)  # one-shot use as before


def test_pack_refuses_wrong_tmap_sizes_and_pointers_that_are_not_addresses():
    pack = ParamPack((("tmap", "t"), "A"))
    with pytest.raises(TensorMapError, match="127 bytes"):
        pack.fill({"A": 16}, {"t": bytes(127)})
    with pytest.raises(ValueError, match="pointer"):
        pack.set_pointers([-1])
    with pytest.raises(KeyError):
        pack.fill({}, {"t": bytes(128)})
    with pytest.raises(TypeError):
        ParamPack((1.5,))


def test_tensor_maps_are_encoded_once_per_geometry_and_address():
    calls: list[tuple] = []

    def encode(spec, shape, address):  # stands in for cuTensorMapEncodeTiled (needs the driver)
        if address % 16:
            raise TensorMapError("not 16-byte aligned")
        calls.append((spec, shape, address))
        return struct.pack("<QQ", address, hash(tmap_geometry(spec, shape)) & (2**64 - 1)) + bytes(112)

    cache = TmapCache(limit=8, encode=encode)
    s1, s2 = Shape.parse("64x128x64:TN"), Shape.parse("64x256x64:TN")
    a = TensorMapSpec("A", (64, 64), 128)
    first, again = cache.table(a, s1), cache.table(a, s1)  # a second candidate of the same shape
    assert first(4096) == again(4096) and len(calls) == 1 and cache.hits == 1
    cache.table(TensorMapSpec("A", (64, 64), 128), s2)(4096)  # same A geometry at another N: shared
    assert len(calls) == 1
    cache.table(TensorMapSpec("A", (64, 32), 64), s1)(4096)  # another box: its own encoding
    assert len(calls) == 2
    with pytest.raises(TensorMapError):
        first(4100)  # a misaligned address is refused every time, never cached
    with pytest.raises(TensorMapError):
        first(4100)
    for addr in range(0, 16 * 20, 16):  # past the limit the cache starts over, still right
        assert first(addr)[:8] == struct.pack("<Q", addr)
    assert cache._size <= 8
    with pytest.raises(TensorMapError, match="multiple of 16"):
        cache.table(a, Shape.parse("64x64x17"))


class _Loader:
    """Test double of the driver loader: records the argument bytes each launch would copy."""

    name = "recording"

    def __init__(self) -> None:
        self.launched: list[tuple] = []

    def load(self, cubin):
        return "module"

    def function(self, module, name, smem):
        return name

    def launcher(self, fn, grid, block, smem):
        def go(stream, params):
            kinds = self.kinds[fn]
            self.launched.append((fn, grid, stream, _copied(params.address, kinds)))
        return go

    def param_layout(self, name):  # this double's functions are their names
        sizes = {"tmap": 128, "ptr": 8, "int": 4}
        out, at = [], 0
        for kind in self.kinds[name]:
            at = -(-at // min(sizes[kind], 64)) * min(sizes[kind], 64)
            out.append((at, sizes[kind]))
            at += sizes[kind]
        return out

    def unload(self, module):
        pass


def test_bound_calls_launch_every_set_with_its_own_pointers_and_maps(monkeypatch):
    import evaluators.run._kernels as h

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0x5000 + index, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    plan = LaunchPlan.from_dict({
        "launches": [{"kernel": "k1", "grid": ["cdiv(M, 64)", "cdiv(N, 64)", 1], "block": [128, 1, 1], "smem": 0,
                      "args": ["tmap:tA", "C", "M", "N", "K"]},
                     {"kernel": "k2", "grid": [1, 1, 1], "block": [32, 1, 1], "smem": 0, "args": ["C", "workspace"]}],
        "workspace": "0", "tensor_maps": {"tA": {"matrix": "A", "box": [64, 64], "swizzle": 128}}})
    encoded: list[int] = []

    def encode(spec, shape, address):
        encoded.append(address)
        return struct.pack("<Q", address) + bytes(120)
    cache = TmapCache(encode=encode)
    shape = Shape.parse("128x64x64:TN")
    sets = [{"A": 0x10000 * (i + 1), "B": 0x20000 * (i + 1), "C": 0x30000 * (i + 1), "workspace": 0x40 * (i + 1)}
            for i in range(5)]
    for candidate in range(2):
        loader = _Loader()
        loader.kinds = {"k1": ["tmap", "ptr", "int", "int", "int"], "k2": ["ptr", "ptr"]}
        call, ws, n = h.CandidateKernels(loader, b"", plan, cache).bind(shape)
        assert n == 2 and ws == 0
        for p in sets:
            call(p, None)
        assert len(loader.launched) == 10
        for i, p in enumerate(sets):
            (f1, g1, s1, a1), (f2, _, s2, a2) = loader.launched[2 * i], loader.launched[2 * i + 1]
            assert (f1, f2, g1, s1, s2) == ("k1", "k2", (2, 1, 1), 0x5000, 0x5000)
            assert a1[0][:8] == struct.pack("<Q", p["A"]) and a1[1] == struct.pack("<Q", p["C"])
            assert [struct.unpack("<i", x)[0] for x in a1[2:]] == [128, 64, 64]
            assert a2 == [struct.pack("<Q", p["C"]), struct.pack("<Q", p["workspace"])]
    assert encoded == [p["A"] for p in sets]  # the second candidate reused every map


def test_a_smaller_shared_memory_size_never_lowers_a_kernels_opt_in(monkeypatch):
    """Every dynamic shared-memory size of one kernel shares one driver function: binding a shape
    with a smaller size after one with a larger size asks the loader for the larger opt-in again,
    so the launch bound first stays valid (the loader sets the function's maximum each time)."""
    import evaluators.run._kernels as h

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    plan = LaunchPlan.from_dict({"launches": [{"kernel": "k1", "grid": [1, 1, 1], "block": [128, 1, 1],
                                               "smem": "1024 * K", "args": ["C"]}], "workspace": "0"})
    asked: list[tuple[str, int]] = []

    class Recording(_Loader):
        def function(self, module, name, smem):
            asked.append((name, smem))
            return name
    loader = Recording()
    loader.kinds = {"k1": ["ptr"]}
    kernels = h.CandidateKernels(loader, b"", plan, TmapCache())
    for k in (64, 100, 50, 100):  # 64 KiB, 100 KiB, 50 KiB, then 100 KiB again (bound already)
        kernels.bind(Shape(8, 8, k, "TN"))
    assert asked == [("k1", 64 * 1024), ("k1", 100 * 1024), ("k1", 100 * 1024)]


def test_driver_launcher_binds_the_launch_and_raises_the_drivers_error():
    from cuda.bindings import driver as real

    from evaluators.run._loader import CudaError, DriverLoader

    seen: list[tuple] = []
    codes = [real.CUresult.CUDA_SUCCESS, real.CUresult.CUDA_SUCCESS, real.CUresult.CUDA_ERROR_INVALID_VALUE]

    def launch(*a):  # stands in for cuda.bindings' cuLaunchKernel (needs libcuda)
        seen.append(a)
        return (codes[len(seen) - 1],)
    loader = DriverLoader()
    loader.drv = types.SimpleNamespace(cuLaunchKernel=launch, CUstream=real.CUstream, CUresult=real.CUresult,
                                       cuGetErrorString=lambda err: (real.CUresult.CUDA_SUCCESS, b"invalid argument"))
    go = loader.launcher("fn", (3, 2, 1), (128, 1, 1), 4096)
    go(0x1234, types.SimpleNamespace(address=0xABC0))
    go(0x1234, types.SimpleNamespace(address=0xABD0))
    assert [a[:8] for a in seen] == [("fn", 3, 2, 1, 128, 1, 1, 4096)] * 2
    assert int(seen[0][8]) == 0x1234 and seen[0][8] is seen[1][8]  # the stream handle is built once
    assert [a[9:] for a in seen] == [(0xABC0, 0), (0xABD0, 0)]
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE") as err:
        go(0x1234, types.SimpleNamespace(address=0xABE0))
    assert not err.value.poisons


def test_bind_rejects_a_plan_whose_arguments_do_not_fit_the_kernel(monkeypatch):
    """The driver's parameter layout (a test double here) against the plan: an int where the
    kernel takes a pointer, or one argument too many, is a PlanError at bind, not a launch."""
    import evaluators.run._kernels as h
    from populations import PlanError

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    shape = Shape.parse("128x64x64:TN")

    def plan(args):
        return LaunchPlan.from_dict({"launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1],
                                                   "smem": 0, "args": args}], "workspace": "0"})
    loader = _Loader()
    loader.kinds = {"k": ["ptr", "ptr", "ptr", "int", "int", "int"]}
    call, _, _ = h.CandidateKernels(loader, b"", plan(["A", "B", "C", "M", "N", "K"])).bind(shape)
    for args, why in ((["A", "B", "M", "N", "K", "C"], "parameter 2 has 8 bytes, the plan passes a int of 4"),
                      (["A", "B", "C", "M", "N", "K", "K"], "takes 6 parameters, the plan passes 7")):
        with pytest.raises(PlanError, match=why):
            h.CandidateKernels(loader, b"", plan(args)).bind(shape)
    loader.param_layout = lambda fn: None  # a driver that cannot say: nothing to check
    h.CandidateKernels(loader, b"", plan(["A", "B", "M", "N", "K", "C"])).bind(shape)
