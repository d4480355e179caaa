"""Compiling candidates for real (NVRTC and nvcc on this machine, no GPU needed).

Covers: stats parsed from ptxas, compile errors with the log, the on-disk cache (hit, miss on
a flag/arch/back-end change, a torn entry), the deadline and the memory cap of the isolated
child, the resource policy, sm_90a-only candidates on sm_80, the nvcc fallback and the pool.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from populations import Candidate, Launch, LaunchPlan, Shape, Status, TensorMapSpec
from evaluators import (CompilePool, CubinCache, arch_for_capability, compile_candidate, default_backend,
                        parse_ptxas)
from evaluators.compile._toolkit import nvcc_path, nvrtc_available

pytestmark = pytest.mark.skipif(not nvrtc_available() or nvcc_path() is None, reason="needs NVRTC and nvcc")

MMA = r'''
#include <cuda_fp16.h>
// One warp computes one 16x8 tile of C with a single m16n8k16 mma.sync per K step (TN layout).
extern "C" __global__ void evo_mma(const __half* __restrict__ A, const __half* __restrict__ B, __half* C,
                                   int M, int N, int K) {
  __shared__ __half sa[16 * 16], sb[8 * 16];
  const int lane = threadIdx.x, m0 = blockIdx.y * 16, n0 = blockIdx.x * 8;
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int i = lane; i < 256; i += 32) {
      int r = i / 16, c = i % 16;
      sa[i] = (m0 + r < M && k0 + c < K) ? A[(m0 + r) * K + k0 + c] : __float2half(0.f);
      if (i < 128) sb[i] = (n0 + r < N && k0 + c < K) ? B[(n0 + r) * K + k0 + c] : __float2half(0.f);
    }
    __syncwarp();
    const int g = lane / 4, t = lane % 4;
    unsigned a[4], b[2];
    a[0] = *(const unsigned*)&sa[g * 16 + t * 2];
    a[1] = *(const unsigned*)&sa[(g + 8) * 16 + t * 2];
    a[2] = *(const unsigned*)&sa[g * 16 + t * 2 + 8];
    a[3] = *(const unsigned*)&sa[(g + 8) * 16 + t * 2 + 8];
    b[0] = *(const unsigned*)&sb[g * 16 + t * 2];
    b[1] = *(const unsigned*)&sb[g * 16 + t * 2 + 8];
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    __syncwarp();
  }
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    int r = m0 + g + (i / 2) * 8, c = n0 + t * 2 + (i % 2);
    if (r < M && c < N) C[r * N + c] = __float2half(d[i]);
  }
}
'''
SHAPE = Shape(128, 256, 64)
ARGS = ("A", "B", "C", "M", "N", "K")


def cand(source: str = MMA, kernel: str = "evo_mma", smem: int | str = 0, block=(32, 1, 1), **plan_kw) -> Candidate:
    p = LaunchPlan(launches=(Launch(kernel, ("cdiv(N, 8)", "cdiv(M, 16)", 1), block, ARGS, smem),), **plan_kw)
    return Candidate(source, p, (SHAPE,))


def test_compile_ok_with_stats(tmp_path: Path) -> None:
    r = compile_candidate(cand(), "sm_90a", cache_dir=tmp_path)
    assert r.ok and r.status is Status.OK and r.backend == "nvrtc" and r.arch == "sm_90a" and not r.cached
    assert r.cubin[:4] == b"\x7fELF"
    (k,) = r.kernels
    assert k.name == "evo_mma" and 8 <= k.registers <= 255 and k.smem_static == 768 and k.spill_stores == 0
    assert "Used" in r.message and r.telemetry["scan"]["mma_sync"]


def test_compile_error_reports_log(tmp_path: Path) -> None:
    bad = MMA.replace("float d[4]", "flaot d[4]")
    r = compile_candidate(cand(bad), "sm_90a", cache_dir=tmp_path)
    assert not r.ok and r.status is Status.COMPILE_ERROR and not r.cubin
    assert "flaot" in r.message and "error" in r.message


def test_scan_rejects_before_compiling(tmp_path: Path) -> None:
    r = compile_candidate(cand("__device__ int g_state;\n" + MMA), "sm_90a", cache_dir=tmp_path)
    assert r.status is Status.REJECTED and "g_state" in r.message
    assert not any(tmp_path.rglob("*.msgpack"))


def test_cache_hit_and_misses(tmp_path: Path) -> None:
    c = cand()
    first = compile_candidate(c, "sm_80", cache_dir=tmp_path)
    again = compile_candidate(c, "sm_80", cache_dir=tmp_path)
    assert first.ok and not first.cached and again.cached and again.cubin == first.cubin
    assert again.kernels == first.kernels and again.seconds < first.seconds
    other_arch = compile_candidate(c, "sm_90a", cache_dir=tmp_path)
    other_flags = compile_candidate(c, "sm_80", cache_dir=tmp_path, extra_flags=("-DEVO_UNUSED=1",))
    assert not other_arch.cached and not other_flags.cached and other_arch.cubin != first.cubin
    assert len(list(tmp_path.rglob("*.msgpack"))) == 3
    # a torn entry is a miss, replaced by a good one
    for path in tmp_path.rglob("*.msgpack"):
        path.write_bytes(path.read_bytes()[:10])
    torn = compile_candidate(c, "sm_80", cache_dir=tmp_path)
    assert torn.ok and not torn.cached and compile_candidate(c, "sm_80", cache_dir=tmp_path).cached


def test_compile_errors_are_cached_too(tmp_path: Path) -> None:
    bad = cand(MMA.replace("float d[4]", "flaot d[4]"))
    compile_candidate(bad, "sm_90a", cache_dir=tmp_path)
    r = compile_candidate(bad, "sm_90a", cache_dir=tmp_path)
    assert r.cached and r.status is Status.COMPILE_ERROR and "flaot" in r.message


BOMB = r'''
// Each level inlines two copies of the level below: 2^14 copies, minutes of compile.
template <int N> __device__ __forceinline__ float f(float x) { return f<N - 1>(x * 1.0001f + 1.f) + f<N - 1>(x * 0.999f - 1.f); }
template <> __device__ __forceinline__ float f<0>(float x) { return x; }
extern "C" __global__ void evo_mma(const __half* A, const __half* B, __half* C, int M, int N, int K) {
  C[threadIdx.x] = __float2half(f<14>(__half2float(A[threadIdx.x])));
}
'''


@pytest.mark.parametrize("backend,zygote", [("nvrtc", "1"), ("nvcc", "1"), ("nvrtc", "0")])
def test_timeout_kills_compile_bomb(tmp_path: Path, backend: str, zygote: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVO_COMPILE_ZYGOTE", zygote)
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    system_tmp = Path(tempfile.gettempdir())
    before = set(system_tmp.glob("evo-nvcc-*"))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    t0 = time.monotonic()
    r = compile_candidate(cand("#include <cuda_fp16.h>\n" + BOMB), "sm_90a", cache_dir=tmp_path, timeout_s=2,
                          backend=backend)
    elapsed = time.monotonic() - t0
    assert r.status is Status.COMPILE_ERROR and "timeout after 2s" in r.message
    assert elapsed < 8, elapsed
    assert not any(tmp_path.rglob("*.msgpack")), "timeouts must not be cached"
    # the child led its own process group (nvcc's cicc/ptxas included): nothing of it survives
    assert _group_gone(r.telemetry["child_pid"])
    # a killed nvcc child's intermediates went with it (the parent owns its scratch folder)
    assert list(scratch_root.iterdir()) == [] and set(system_tmp.glob("evo-nvcc-*")) <= before


def _group_gone(pgid: int, wait_s: float = 5.0) -> bool:
    """True once no process (zombies of killed grandchildren included) is left in the group."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_memory_cap(tmp_path: Path) -> None:
    r = compile_candidate(cand(), "sm_90a", cache_dir=tmp_path, mem_mb=64)
    # the one retry (a fresh child under twice the cap, 128 MiB) dies too: refused, nothing cached
    assert r.status is Status.COMPILE_ERROR and "out of memory" in r.message and "compiled again" in r.message
    assert r.telemetry["failure"] == "oom" and r.telemetry["retried"] and not any(tmp_path.rglob("*.msgpack"))


@pytest.mark.parametrize("zygote", [True, False])
def test_a_dead_compile_child_gets_one_fresh_child_before_it_counts(zygote: bool) -> None:
    """A child that dies (here: starved of address space, 64 MiB) is not yet the candidate's
    verdict: one freshly spawned child compiles it again (here under the default cap) and its
    outcome stands, the first death noted in the log. On the GPU machine an honest template kernel
    died so once in each 120-candidate throughput run (SIGSEGV under 4 GiB); it compiles here."""
    from evaluators.compile._compile import flags_for, nvrtc_library
    from evaluators.compile._isolate import DEFAULT_MEM_MB, run_compile_isolated

    out = run_compile_isolated("nvrtc", MMA, flags_for("nvrtc", "sm_90a", ()), timeout_s=60, mem_mb=64,
                               library=nvrtc_library(), zygote=zygote, retry_mem_mb=DEFAULT_MEM_MB)
    assert out.ok and out.cubin and not out.failure and out.retried, out.log[-500:]
    assert f"compiled again in a fresh child under {DEFAULT_MEM_MB} MiB" in out.log and "64" in out.log
    # a child that lives (whatever its verdict) is never compiled twice
    once = run_compile_isolated("nvrtc", MMA.replace("float d[4]", "float d[4] = oops"),
                                flags_for("nvrtc", "sm_90a", ()), timeout_s=60, library=nvrtc_library(),
                                zygote=zygote)
    assert not once.ok and not once.failure and not once.retried


def test_local_memory_blowup_refused(tmp_path: Path) -> None:
    src = MMA.replace("float d[4] = {0.f, 0.f, 0.f, 0.f};",
                      "float d[4] = {0.f, 0.f, 0.f, 0.f}; float big[8192];\n"
                      "  for (int i = 0; i < 8192; ++i) big[i] = __half2float(A[i * 7 % (K + 1)]);\n"
                      "  d[0] = big[(lane * 97) % 8192];")
    r = compile_candidate(cand(src), "sm_90a", cache_dir=tmp_path)
    assert r.status is Status.COMPILE_ERROR and "resource policy" in r.message and "stack/local" in r.message
    assert r.kernels and r.kernels[0].stack_frame >= 32768 and not r.cubin


def test_static_plus_dynamic_smem_refused(tmp_path: Path) -> None:
    r = compile_candidate(cand(smem=232448 - 100), "sm_90a", cache_dir=tmp_path)
    assert r.status is Status.COMPILE_ERROR and "768 B static" in r.message


REGS = r'''
#include <cuda_fp16.h>
// 128 live accumulators per thread: ~136 registers, too many for a 1024-thread block.
extern "C" __global__ void evo_mma(const __half* __restrict__ A, const __half* __restrict__ B, __half* C, int M, int N, int K) {
  float v[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) v[i] = __half2float(A[threadIdx.x + i * 1024]);
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int i = 0; i < 128; ++i) v[i] = v[i] * v[(i + 1) % 128] + __half2float(B[k]);
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += v[i];
  C[threadIdx.x] = __float2half(s);
}
'''


def test_registers_per_block_refused(tmp_path: Path) -> None:
    r = compile_candidate(cand(REGS, block=(1024, 1, 1)), "sm_90a", cache_dir=tmp_path)
    assert r.status is Status.COMPILE_ERROR and "registers per block" in r.message
    assert r.kernels[0].registers * 1024 > 65536
    assert compile_candidate(cand(REGS, block=(256, 1, 1)), "sm_90a", cache_dir=tmp_path).ok


def test_sm90_only_refused_on_sm80(tmp_path: Path) -> None:
    tmap_src = ('struct alignas(64) Tmap { unsigned char b[128]; };\n'
                + MMA.replace("const __half* __restrict__ A,", "const __grid_constant__ Tmap tmA, const __half* __restrict__ A,"))
    p = LaunchPlan(launches=(Launch("evo_mma", (1, 1, 1), (32, 1, 1), ("tmap:a",) + ARGS),),
                   tensor_maps={"a": TensorMapSpec("A", (16, 16))})
    c = Candidate(tmap_src, p, (SHAPE,))
    r = compile_candidate(c, "sm_80", cache_dir=tmp_path)
    assert r.status is Status.REJECTED and "needs sm_90a" in r.message and "tensor maps" in r.message
    assert compile_candidate(c, "sm_90a", cache_dir=tmp_path).ok
    declared = Candidate(MMA, cand().plan, (SHAPE,), meta={"arch_features": ["sm_90a"]})
    assert compile_candidate(declared, "sm_80", cache_dir=tmp_path).status is Status.REJECTED
    wgmma = cand(MMA.replace('asm volatile("mma.sync', 'asm volatile("wgmma.fence.sync.aligned;");\n    asm volatile("mma.sync'))
    r = compile_candidate(wgmma, "sm_80", cache_dir=tmp_path)
    assert r.status is Status.COMPILE_ERROR and "uses sm_90a features (wgmma)" in r.message


def test_nvcc_backend(tmp_path: Path) -> None:
    r = compile_candidate(cand(), "sm_90a", cache_dir=tmp_path, backend="nvcc")
    assert r.ok and r.backend == "nvcc" and r.cubin[:4] == b"\x7fELF"
    (k,) = r.kernels
    nvrtc = compile_candidate(cand(), "sm_90a", cache_dir=tmp_path, backend="nvrtc")
    assert k.name == "evo_mma" and k.smem_static == nvrtc.kernels[0].smem_static
    bad = compile_candidate(cand(MMA.replace("float d[4]", "flaot d[4]")), "sm_90a", cache_dir=tmp_path, backend="nvcc")
    assert bad.status is Status.COMPILE_ERROR and "flaot" in bad.message and str(tmp_path) not in bad.message


def test_nvcc_is_the_fallback_without_nvrtc() -> None:
    code = ("import sys; sys.modules['cuda.bindings.nvrtc'] = None\n"
            "from evaluators import default_backend; print(default_backend())")
    env = {k: v for k, v in os.environ.items() if k != "EVO_COMPILE_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1],
                         env=env, timeout=60)
    assert out.stdout.strip() == "nvcc", out.stderr
    assert default_backend() in ("nvrtc", os.environ.get("EVO_COMPILE_BACKEND"))


def test_arch_for_capability() -> None:
    assert arch_for_capability((9, 0)) == "sm_90a"
    assert arch_for_capability((8, 0)) == arch_for_capability((8, 9)) == "sm_80"
    with pytest.raises(ValueError):
        arch_for_capability((7, 5))


def test_parse_ptxas_both_formats() -> None:
    nvcc_log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    256 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 33 registers, used 1 barriers, 20000 bytes cumulative stack size, 128 bytes smem, 368 bytes cmem[0]
ptxas info    : Function properties for _Z1gPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"""
    rep = parse_ptxas(nvcc_log)
    (k,) = rep.kernels
    assert (k.name, k.registers, k.stack_frame, k.spill_stores, k.spill_loads, k.smem_static, k.cmem) == \
        ("k", 33, 256, 8, 4, 128, 368)
    assert rep.frames["k"] == 20000 and rep.frames["_Z1gPfi"] == 0


def test_pool_two_workers(tmp_path: Path) -> None:
    good = cand()
    bad = cand(MMA.replace("float d[4]", "flaot d[4]"))
    rejected = cand("__managed__ int x;\n" + MMA)
    bomb = cand("#include <cuda_fp16.h>\n" + BOMB)
    with CompilePool(workers=2, cache_dir=tmp_path) as pool:
        futures = [pool.submit(bomb, "sm_90a", timeout_s=2), pool.submit(good, "sm_90a"),
                   pool.submit(bad, "sm_90a"), pool.submit(rejected, "sm_90a")]
        results = [f.result(timeout=120) for f in futures]
        assert [r.status for r in results] == [Status.COMPILE_ERROR, Status.OK, Status.COMPILE_ERROR, Status.REJECTED]
        assert "timeout" in results[0].message
        assert pool.map([good], "sm_80")[0].ok  # the pool is still usable after the bomb


def test_child_without_library_path_uses_the_bindings() -> None:
    """Where the parent cannot locate libnvrtc, the child compiles through cuda.bindings.nvrtc."""
    from evaluators.compile._backends import flags_for
    from evaluators.compile._isolate import run_compile_isolated

    out = run_compile_isolated("nvrtc", MMA, flags_for("nvrtc", "sm_80"), timeout_s=60, library=None)
    assert out.ok and out.cubin[:4] == b"\x7fELF" and "Used" in out.log
    bad = run_compile_isolated("nvrtc", MMA.replace("float d[4]", "flaot d[4]"), flags_for("nvrtc", "sm_80"),
                               timeout_s=60, library=None)
    assert not bad.ok and "flaot" in bad.log and "NVRTC_ERROR_COMPILATION" in bad.log


def test_fork_server_concurrency_and_restart() -> None:
    """Threads share one fork server; if it dies, the next compile restarts it (or spawns)."""
    from concurrent.futures import ThreadPoolExecutor

    from evaluators.compile import _zygote
    from evaluators.compile._backends import flags_for
    from evaluators.compile._isolate import run_compile_isolated
    from evaluators.compile._toolkit import nvrtc_library

    flags, lib = flags_for("nvrtc", "sm_80"), nvrtc_library()
    sources = [MMA.replace("evo_mma", f"evo_mma{i}") for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda s: run_compile_isolated("nvrtc", s, flags, timeout_s=60, library=lib, zygote=True),
                           sources))
    assert all(o.ok for o in outs) and len({o.pid for o in outs}) == 4
    assert all(f"evo_mma{i}" in o.log for i, o in enumerate(outs))
    server = _zygote.zygote_for(lib, flags)
    server.proc.kill()
    server.proc.wait()
    again = run_compile_isolated("nvrtc", MMA, flags, timeout_s=60, library=lib, zygote=True)
    assert again.ok and _zygote.zygote_for(lib, flags) is not server


def test_cache_prune_keeps_recent_entries(tmp_path: Path) -> None:
    from evaluators.compile._cache import CacheEntry

    cache = CubinCache(tmp_path)
    for i in range(5):
        cache.put(f"{i:02d}" + "ab" * 31, CacheEntry(True, bytes(1000), "log", 0.1))
        os.utime(cache._path(f"{i:02d}" + "ab" * 31), (1000 + i, 1000 + i))
    assert cache.get("00" + "ab" * 31) is not None  # a hit makes the oldest entry the newest
    assert cache.prune(max_bytes=cache.size() - 1500) == 2
    assert cache.get("00" + "ab" * 31) is not None and cache.get("01" + "ab" * 31) is None
    assert cache.get("02" + "ab" * 31) is None and cache.get("04" + "ab" * 31) is not None


def test_pool_survives_a_killed_worker(tmp_path: Path) -> None:
    """A pool worker killed mid-compile (the OOM killer, say) costs that result, not the pool."""
    import signal

    with CompilePool(workers=1, cache_dir=tmp_path) as pool:
        slow = pool.submit(cand("#include <cuda_fp16.h>\n" + BOMB), "sm_90a", timeout_s=60)
        deadline = time.monotonic() + 60
        while not pool._executor._processes and time.monotonic() < deadline:  # the worker starts lazily
            time.sleep(0.05)
        time.sleep(1.0)  # let it reach the compile
        for pid in list(pool._executor._processes):
            os.kill(pid, signal.SIGKILL)
        r = slow.result(timeout=60)
        assert r.status is Status.COMPILE_ERROR and "compile worker died" in r.message
        assert pool.submit(cand(), "sm_90a").result(timeout=120).ok


def test_scan_verdicts_are_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second compile of the same candidate (a cache hit) does not scan again; another arch does."""
    import evaluators.compile._compile as comp

    calls = []
    real = comp.scan
    monkeypatch.setattr(comp, "scan", lambda c, arch=None: calls.append(arch) or real(c, arch=arch))
    c = cand(MMA + "\n// scan memo test\n")
    assert compile_candidate(c, "sm_90a", cache_dir=tmp_path).ok
    assert compile_candidate(c, "sm_90a", cache_dir=tmp_path).cached
    assert calls == ["sm_90a"]
    compile_candidate(c, "sm_80", cache_dir=tmp_path)
    assert calls == ["sm_90a", "sm_80"]
