"""The pycuda loader. On CPU against a test double of ``pycuda.driver`` (a boundary we don't own:
pycuda builds from source only and needs a driver): the parameter block it launches with, the
streams it may launch on, and its errors named as the driver names them. GPU-marked, where
pycuda is installed (the device, from ``bench/pycuda_wheel_build.sh``'s wheel): the evaluator
runs with ``loader="pycuda"`` and gives the statuses the driver loader gives."""
from __future__ import annotations

import struct
import types

import pytest

from evaluators.run._loader import CudaError, LoaderUnavailable, PycudaLoader
from evaluators.run._tmap import ParamPack


def test_param_buffer_is_the_kernels_parameter_block():
    raw = bytes(range(128))
    pack = ParamPack(("A", 7, ("tmap", "tmA"), "C", -5), {"A": 0x1000, "C": 0x3000}, {"tmA": raw})
    buf = pack.param_buffer()  # no layout known: natural alignment from 0
    assert len(buf) == 204  # 8 + 4, padding to 64, 128, 8, 4
    assert struct.unpack_from("<Qi", buf, 0) == (0x1000, 7) and buf[12:64] == bytes(52)
    assert buf[64:192] == raw and struct.unpack_from("<Qi", buf, 192) == (0x3000, -5)
    pack.set_pointers([0x2000, 0x4000])  # the block follows the pack's current values
    assert struct.unpack_from("<Q", pack.param_buffer(), 0)[0] == 0x2000
    assert ParamPack((), {}, {}).param_buffer() == b""
    # the driver's layout (what cuFuncGetParamInfo gave for the sm90 template on the H200: from 48)
    driver = [(48, 8), (56, 4), (64, 128), (192, 8), (200, 4)]
    buf = pack.param_buffer(driver)
    assert len(buf) == 204 and buf[:48] == bytes(48) and struct.unpack_from("<Qi", buf, 48) == (0x2000, 7)
    assert buf[64:192] == raw and struct.unpack_from("<Qi", buf, 192) == (0x4000, -5)
    with pytest.raises(ValueError, match="takes 4 parameters, the plan passes 5"):
        pack.param_buffer(driver[:4])
    with pytest.raises(ValueError, match="parameter 1 has 8 bytes, the plan passes a int of 4"):
        pack.param_buffer([(0, 8), (8, 8), (64, 128), (192, 8), (200, 4)])


class _FakeCuda:
    """Test double of ``pycuda.driver``: records launches; a launch on a poisoned context fails
    as pycuda's does (its exception text is the routine, " failed: " and the driver's string)."""

    class Error(Exception):
        pass

    class LaunchError(Error):
        pass

    function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="MAX_DYNAMIC_SHARED")

    def __init__(self):
        self.launched, self.pushed, self.fail = [], [], None
        fake = self

        class Stream:
            def __init__(self, flags=0):
                self.flags, self.handle = flags, 0x7000 + len(fake.launched) + 1

        class Context:
            @staticmethod
            def synchronize():
                if fake.fail:
                    raise fake.LaunchError(f"cuCtxSynchronize failed: {fake.fail}")

        class Device:
            def __init__(self, ordinal):
                self.ordinal = ordinal

            def retain_primary_context(self):
                return types.SimpleNamespace(push=lambda: fake.pushed.append(self.ordinal))
        self.Stream, self.Context, self.Device = Stream, Context, Device

    def init(self):
        pass

    def module_from_buffer(self, cubin):
        fake = self

        class Function:
            attrs = {}

            def set_attribute(self, key, value):
                self.attrs[key] = value

            def _launch_kernel(self, grid, block, buf, smem, stream):
                if fake.fail:
                    raise fake.LaunchError(f"cuLaunchKernel failed: {fake.fail}")
                fake.launched.append((grid, block, buf, smem, stream))
        return types.SimpleNamespace(get_function=lambda name: Function())


class _Layouts:
    """Test double of the driver loader's parameter-layout query (needs a driver)."""

    def __init__(self):
        self.loaded, self.unloaded = [], []

    def load(self, cubin):
        self.loaded.append(cubin)
        return f"raw:{len(self.loaded)}"

    def function(self, module, name, smem):
        return name

    def param_layout(self, fn):
        return [(48, 8), (56, 4)] if fn == "k" else [(0, 4)]

    def unload(self, module):
        self.unloaded.append(module)


def _loader(names=None):
    cuda = _FakeCuda()
    loader = PycudaLoader(0, cuda=cuda, layouts=_Layouts())
    loader._names = names or {"an illegal memory access was encountered": "CUDA_ERROR_ILLEGAL_ADDRESS"}
    return loader, cuda


def test_pycuda_loader_launches_the_parameter_block_on_its_streams():
    loader, cuda = _loader()
    assert cuda.pushed == [0]  # the device's primary context (torch's) made pycuda's current one
    fn = loader.function(loader.load(b"cubin"), "k", 100 * 1024)
    assert fn[0].attrs == {"MAX_DYNAMIC_SHARED": 100 * 1024} and fn[1] == [(48, 8), (56, 4)]
    assert loader.param_layout(fn) == fn[1]  # asked once, in function(): bind reuses it
    pack = ParamPack(("A", 3), {"A": 0x1000}, {})
    go = loader.launcher(fn, (4, 2, 1), (128, 1, 1), 4096)
    go(0, pack)  # torch's default stream: the legacy one, pycuda's None
    handle = loader.capture_stream()
    go(handle, pack)
    (g, b, buf, smem, s0), (_, _, _, _, s1) = cuda.launched
    assert (g, b, smem, s0) == ((4, 2, 1), (128, 1, 1), 4096, None)
    assert buf == pack.param_buffer([(48, 8), (56, 4)]) and buf[48:56] == struct.pack("<Q", 0x1000)
    assert s1.handle == handle and s1.flags == 1  # its own non-blocking stream
    with pytest.raises(LoaderUnavailable, match="capture_stream"):
        go(0xDEAD, pack)  # a stream pycuda did not make: it cannot launch there
    module = loader.load(b"other")
    loader.unload(module)
    assert loader.layouts.loaded == [b"cubin", b"other"] and loader.layouts.unloaded == ["raw:2"]


def test_pycuda_errors_carry_the_drivers_name_and_poisoning():
    loader, cuda = _loader()
    fn = loader.function(loader.load(b"cubin"), "k", 0)
    cuda.fail = "an illegal memory access was encountered"
    with pytest.raises(CudaError) as err:
        loader.launcher(fn, (1, 1, 1), (32, 1, 1), 0)(0, ParamPack(("A", 1), {"A": 16}, {}))
    assert err.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and err.value.poisons
    got = loader.synchronize()
    assert isinstance(got, CudaError) and got.poisons and "illegal memory access" in str(got)
    cuda.fail = "something new"
    assert loader.synchronize().name == "PYCUDA_LAUNCHERROR" and not loader.synchronize().poisons
    cuda.fail = None
    assert loader.synchronize() is None


# -- GPU: the evaluator through pycuda (where it is installed) ----------------------------------
def _pycuda_or_skip():
    try:
        import pycuda.driver  # noqa: F401
    except Exception as exc:
        pytest.skip(f"pycuda is not importable here: {exc}")


@pytest.mark.gpu
def test_evaluator_with_the_pycuda_loader_gives_the_driver_loaders_statuses(tmp_path):
    _pycuda_or_skip()
    from evaluators import LocalPool
    from evaluators.run._builtin_kernels import naive_candidate
    from populations import Shape, Status, load_templates

    shape = Shape.parse("256x384x512:TN")
    cands = [naive_candidate((shape, Shape.parse("64x128x64:TN"))),
             naive_candidate((shape,), bug="EVO_BUG_ILLEGAL")]
    tpl = load_templates()["sm90_wgmma"]  # tensor maps by value: the 64-byte aligned part of the block
    cands.append(tpl.candidate(tpl.heuristic(shape)[0], shape))
    got = {}
    for loader in ("pycuda", "driver"):
        with LocalPool(compile_workers=4, worker_options={"loader": loader}, log_dir=str(tmp_path / loader),
                       deadlines={"correctness": 20.0, "timing": 60.0}) as pool:
            evals = pool.evaluate(cands)
            got[loader] = evals
            assert pool.supervisors[0].info["loader"] == loader
        for e in evals:
            print(loader, e.shape, e.status, e.speedup, e.message[:200])
    for loader, evals in got.items():
        assert [e.status for e in evals] == [Status.OK, Status.OK, Status.RUNTIME_ERROR, Status.OK], loader
        assert "ILLEGAL_ADDRESS" in evals[2].message or "illegal" in evals[2].message.lower()
    for p, d in zip(got["pycuda"], got["driver"]):  # same kernels, same GPU: the same time within noise
        if p.status is Status.OK:
            assert 0.8 < p.timers["device"].median / d.timers["device"].median < 1.25, (p.shape, p.candidate_id)
