"""The harness: CPU-checkable parts (parameter packing, tensor-map geometry, tolerances, the
correctness cascade on CPU tensors with Python stand-ins for kernels) and, GPU-marked, the
whole evaluator on real kernels: good passes, broken is incorrect, illegal address is a
runtime_error and a hang a timeout, and the pool keeps going."""
from __future__ import annotations

import ctypes

import pytest

from evaluators.run._builtin_kernels import BUGS, naive_candidate, naive_plan
from evaluators.run._loader import LoaderUnavailable, get_loader
from evaluators.run._tmap import ParamPack, TensorMapError, tmap_geometry
from populations import Shape, Status, TensorMapSpec


# -- CPU: plan -> kernel parameters ------------------------------------------------------------
def test_param_pack_follows_the_plan_order_and_sizes():
    launches, ws = naive_plan().resolve(Shape.parse("100x60x36:NN"))
    ptrs = {"A": 0x7F0000001000, "B": 0x7F0000002000, "C": 0x7F0000003000, "workspace": 0x10}
    pack = ParamPack(launches[0].args, ptrs, {})
    assert ws == 0 and pack.kinds == ["ptr", "ptr", "ptr", "int", "int", "int"]
    assert [int.from_bytes(pack.arg_bytes(i), "little") for i in range(3)] == [ptrs["A"], ptrs["B"], ptrs["C"]]
    assert [int.from_bytes(pack.arg_bytes(i), "little", signed=True) for i in range(3, 6)] == [100, 60, 36]
    assert launches[0].grid == (4, 7, 1)
    arr = (ctypes.c_void_p * 6).from_address(pack.address)
    assert arr[3] == ctypes.addressof(ctypes.c_int32.from_address(arr[3]))


def test_tensor_maps_are_passed_by_value_64_byte_aligned():
    raw = bytes(range(128))
    pack = ParamPack(("A", ("tmap", "tmA"), -5), {"A": 0x1000}, {"tmA": raw})
    arr = (ctypes.c_void_p * 3).from_address(pack.address)
    assert arr[1] % 64 == 0 and pack.arg_bytes(1) == raw
    assert int.from_bytes(pack.arg_bytes(2), "little", signed=True) == -5
    with pytest.raises(OverflowError):
        ParamPack((2**31,), {}, {})


def test_tensor_map_geometry_is_the_matrix_as_stored():
    tn, nn = Shape.parse("256x512x1024:TN"), Shape.parse("256x512x1024:NN")
    g = tmap_geometry(TensorMapSpec("B", (128, 64), 128), tn)
    assert g.global_dim == (1024, 512) and g.global_strides == (2048,) and g.box_dim == (64, 128)
    assert tmap_geometry(TensorMapSpec("B", (64, 64), 128), nn).global_dim == (512, 1024)
    assert tmap_geometry(TensorMapSpec("C", (64, 64), 128), tn).global_strides == (1024,)
    with pytest.raises(TensorMapError, match="multiple of 16"):
        tmap_geometry(TensorMapSpec("A", (64, 64), 128), Shape.parse("64x64x17"))
    with pytest.raises(TensorMapError, match="swizzle"):
        tmap_geometry(TensorMapSpec("A", (64, 128), 128), tn)


def test_pycuda_backend_reports_itself_unavailable_when_not_installed():
    try:
        import pycuda.driver  # noqa: F401
    except Exception:
        with pytest.raises(LoaderUnavailable, match="pycuda"):
            get_loader("pycuda")
    else:
        pytest.skip("pycuda is importable here")
    with pytest.raises(LoaderUnavailable, match="unknown"):
        get_loader("opencl")


def test_evo_eval_reads_the_plan_from_a_leading_comment(tmp_path):
    from evo.cli._cmd_eval import load_plan

    plan = naive_plan()
    src = "\n/* evo-plan: " + __import__("json").dumps(plan.to_dict()) + " */\nextern \"C\" __global__ void k() {}"
    assert load_plan(src, None) == plan
    (tmp_path / "p.json").write_text(__import__("json").dumps(plan.to_dict()))
    assert load_plan("no comment", str(tmp_path / "p.json")) == plan
    with pytest.raises(ValueError, match="evo-plan"):
        load_plan("__global__ void k() {}", None)


# -- CPU: tolerances and the cascade with Python stand-ins for kernels ------------------------------
try:  # torch is the gpu extra's; without it these tests skip one by one (the ones above still run)
    import torch
    from evaluators.correctness import (Cascade, Operands, ragged_instances, reference,
                                         tolerance_exact, tolerance_random, tolerance_strict, ulp16)
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install '.[gpu]')")


@needs_torch
def test_ulp16_and_the_tolerance_formulas():
    x = torch.tensor([1.0, 1.5, 2048.0, 65504.0, 1e-6, 0.0])
    assert ulp16(x).tolist() == [2**-10, 2**-10, 2.0, 32.0, 2**-24, 2**-24]
    ref, t = torch.tensor([100.0]), torch.tensor([64.0])
    assert tolerance_random(ref, t).item() == pytest.approx(2**-4 + 2 * 2**-10 * 64)
    assert tolerance_exact(ref, torch.tensor([1e4]), 4096).item() == pytest.approx(2**-4 + 8 * 64 * 2**-23 * 1e4)
    # the exponent-bit ulp16 is frexp's 2**(e - 11) on every finite value, and inf stays unpassable
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20000, dtype=torch.float64, generator=g) * 10 ** torch.empty(20000, dtype=torch.float64).uniform_(
        -9, 6, generator=g)
    _, e = torch.frexp(x.abs().float().clamp(min=2.0 ** -14))
    assert torch.equal(ulp16(x), torch.ldexp(torch.ones(20000), e - 11))
    assert ulp16(torch.tensor([float("inf")])).item() < float("inf")
    # the strict tolerance is exactly the smaller of the two (one ulp16 pass, not two)
    rss, sabs = torch.rand(20000, generator=g) * 40, torch.rand(20000, generator=g) * 4000
    rows = torch.rand(20000, generator=g) < 0.3  # the hidden test's rows: the exact tolerance alone
    for k in (8, 777, 4096):
        strict = torch.minimum(tolerance_random(x, rss), tolerance_exact(x, sabs, k))
        assert torch.equal(tolerance_strict(x, rss, sabs, k), strict)
        assert torch.equal(tolerance_strict(x, rss, sabs, k, rows), torch.where(rows, tolerance_exact(x, sabs, k), strict))


@needs_torch
def test_fp32_accumulation_passes_and_fp16_accumulation_fails_the_random_tolerance():
    g = torch.Generator().manual_seed(0)
    for k in (256, 1024):
        a = torch.empty(32, k, dtype=torch.float16).uniform_(-1, 1, generator=g)
        b = torch.empty(k, 32, dtype=torch.float16).uniform_(-1, 1, generator=g)
        ref, rss = reference(a, b, exact_terms=False)
        tol = tolerance_random(ref, rss)
        good = (a.float() @ b.float()).half()
        assert bool(((good.double() - ref).abs() <= tol).all())
        acc = torch.zeros(32, 32, dtype=torch.float16)
        for i in range(k):
            acc = (acc.float() + a[:, i:i + 1].float() * b[i:i + 1, :].float()).half()
        assert not bool(((acc.double() - ref).abs() <= tol).all())


def _matmul(ops, *, acc16=False, skip_last=False):
    a, b = ops.A.data.float(), ops.b_kn().float()
    if skip_last:
        a, b = a[:, :-1], b[:-1]
    if acc16:
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
        for i in range(a.shape[1]):
            acc = (acc.float() + a[:, i:i + 1] * b[i:i + 1, :]).half()
        return acc
    return (a @ b).half()


class PointerCache:
    def __init__(self):
        self.seen = {}

    def __call__(self, ops):
        key = ops.A.ptr
        if key not in self.seen:
            self.seen[key] = _matmul(ops)
        ops.C.data.copy_(self.seen[key])


def _write_past_c(ops):
    ops.C.data.copy_(_matmul(ops))
    ops.C.full[ops.C.band + ops.C.data.numel() + 3] = 0.0


def _modify_a(ops):
    ops.C.data.copy_(_matmul(ops))
    ops.A.data[0, 0] = 0.5


def _leave_last_row(ops):
    ops.C.data[:-1].copy_(_matmul(ops)[:-1])


def _zero_fast_path(ops):  # "skips" rows of A that are all zero without writing C
    out = _matmul(ops)
    zero_rows = (ops.A.data == 0).all(dim=1)
    ops.C.data[~zero_rows] = out[~zero_rows]


STANDINS = {
    "good": (lambda ops: ops.C.data.copy_(_matmul(ops)), None),
    "fp16 accumulation": (lambda ops: ops.C.data.copy_(_matmul(ops, acc16=True)), "random inputs"),
    "skips the last k": (lambda ops: ops.C.data.copy_(_matmul(ops, skip_last=True)), "random inputs"),
    "caches by pointer": (PointerCache, "re-filled"),  # a class: a fresh cache per test
    "writes past C": (_write_past_c, "wrote outside C"),
    "modifies A": (_modify_a, "modified input"),
    "leaves a row": (_leave_last_row, "left NaN|left holding the poison"),
    "zero-row fast path": (_zero_fast_path, "special values"),
}


@needs_torch
@pytest.mark.parametrize("name", sorted(STANDINS))
@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_the_cascade_catches_each_bug_by_name(name, layout):
    fn, expect = STANDINS[name]
    fn = fn() if isinstance(fn, type) else fn
    shape = Shape(48, 40, 96, layout)
    gen = torch.Generator().manual_seed(7)
    ops = Operands.allocate(shape, 0, False, torch.device("cpu"), gen)
    cas = Cascade(ops, fn, lambda: None, gen)
    if expect is None:
        cas.full(generic=False)
        assert cas.max_error <= 0.06 and len(cas.checks) == 8  # the cancellation probe on both poisons
    else:
        with pytest.raises(Exception, match=expect):
            cas.full(generic=False)


@needs_torch
def test_probes_catch_fp16_accumulation_where_random_data_cannot():
    gen = torch.Generator().manual_seed(3)
    ops = Operands.allocate(Shape(16, 16, 8), 0, False, torch.device("cpu"), gen)
    cas = Cascade(ops, lambda o: o.C.data.copy_(_matmul(o, acc16=True)), lambda: None, gen)
    with pytest.raises(Exception, match="random inputs"):
        cas.random()  # K=8: within the random tolerance, but random outputs are judged exactly too
    with pytest.raises(Exception, match="cancellation"):
        cas.cancellation()  # and the cancellation probe sees the lost small terms
    big = Operands.allocate(Shape(4, 4, 4096), 0, False, torch.device("cpu"), gen)
    with pytest.raises(Exception, match="all-ones"):
        Cascade(big, lambda o: o.C.data.copy_(_matmul(o, acc16=True)), lambda: None, gen).all_ones()
    with pytest.raises(Exception, match="large-value"):
        Cascade(big, lambda o: o.C.data.copy_(_matmul(o, acc16=True)), lambda: None, gen).large_values()


@needs_torch
def test_ragged_instances_respect_tma_pitch_and_cover_large_residues():
    import random

    base = Shape.parse("4096x4096x4096:NN")
    fixed = ragged_instances(base, set())
    assert str(fixed[0]) == "1x1x1:NN:f32" and fixed[-1].k >= 4096
    assert fixed == ragged_instances(base, set())  # deterministic by seed
    from evaluators.correctness import class_cover
    pitched = ragged_instances(base, {"K", "N"}, random.Random(4)) + class_cover(base, {"K", "N"}, random.Random(4))
    assert all(s.n % 8 == 0 and s.k % 8 == 0 for s in pitched)
    assert {(s.m % 8 == 0) for s in pitched} == {True, False}  # M has no pitch: both classes stay
    drawn = ragged_instances(base, set(), random.Random(5))[-2]
    assert all(17 <= d % 64 <= 63 for d in (drawn.m, drawn.n, drawn.k))


def _rotation(n_sets=5, m=24, n=16, k=40, layout="TN"):
    g = torch.Generator().manual_seed(1)
    a3 = torch.empty(n_sets, m, k, dtype=torch.float16).uniform_(-1, 1, generator=g)
    b3 = torch.empty(n_sets, *((n, k) if layout == "TN" else (k, n)), dtype=torch.float16).uniform_(-1, 1, generator=g)
    c3 = torch.full((n_sets, m, n), float("nan"), dtype=torch.float16)
    return a3, b3, c3, g


def _set_product(a3, b3, c3, i, layout):
    b = b3[i].float().t() if layout == "TN" else b3[i].float()
    c3[i] = (a3[i].float() @ b).half()


@needs_torch
@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_recheck_after_timing_passes_an_honest_kernel_and_restores_a(layout):
    from evaluators.correctness import recheck_sets

    a3, b3, c3, g = _rotation(layout=layout)
    before, b_before = a3.clone(), b3.clone()
    recheck_sets(a3, b3, c3, layout, lambda i: _set_product(a3, b3, c3, i, layout), lambda: None, g)
    assert torch.equal(a3, before) and torch.equal(b3, b_before)


@needs_torch
def test_recheck_after_timing_catches_state_kept_across_calls():
    from evaluators.correctness import CheckFailed, recheck_sets

    a3, b3, c3, g = _rotation()
    for i in range(len(a3)):  # the timed calls
        _set_product(a3, b3, c3, i, "TN")
    memo = {i: c3[i].clone() for i in range(len(a3))}  # a per-set (workspace) cache of the outputs
    with pytest.raises(CheckFailed, match="rotation set 0"):
        recheck_sets(a3, b3, c3, "TN", lambda i: c3[i].copy_(memo[i]), lambda: None, g)

    def trusts_c(i):  # skips when C already holds finite values (the C-trusting no-op)
        if not bool(torch.isfinite(c3[i]).all()):
            _set_product(a3, b3, c3, i, "TN")
    a3, b3, c3, g = _rotation()
    with pytest.raises(CheckFailed, match="stale"):
        recheck_sets(a3, b3, c3, "TN", trusts_c, lambda: None, g)

    calls = {"n": 0}

    def skips_second_call_in_a_row(i):  # the 'hot' skip: a back-to-back call on one set does nothing
        calls["n"] += 1
        if calls.get("last") != i:
            _set_product(a3, b3, c3, i, "TN")
        calls["last"] = i
    a3, b3, c3, g = _rotation()
    with pytest.raises(CheckFailed, match="pass 3"):
        recheck_sets(a3, b3, c3, "TN", skips_second_call_in_a_row, lambda: None, g)


@needs_torch
def test_recheck_catches_prepacked_b_and_strided_content_hashes():
    from evaluators.correctness import CheckFailed, recheck_sets

    a3, b3, c3, g = _rotation()
    packed = {}

    def prepacked_b(i):  # B converted once per set (keyed by its pointer), reused after
        if i not in packed:
            packed[i] = b3[i].float().clone()
        c3[i] = (a3[i].float() @ packed[i].t()).half()
    for i in range(len(a3)):
        prepacked_b(i)
    with pytest.raises(CheckFailed):
        recheck_sets(a3, b3, c3, "TN", prepacked_b, lambda: None, g)

    a3, b3, c3, g = _rotation()
    memo = {}

    def strided_hash_tiles(i):  # per 8x8 tile of C: memo keyed by every 8th element of its A and B rows
        for r in range(0, a3.shape[1], 8):
            for c in range(0, b3.shape[1], 8):
                key = (i, r, c, a3[i, r:r + 8].flatten()[::8].numpy().tobytes(),
                       b3[i, c:c + 8].flatten()[::8].numpy().tobytes())
                if key not in memo:
                    memo[key] = (a3[i, r:r + 8].float() @ b3[i, c:c + 8].float().t()).half()
                c3[i, r:r + 8, c:c + 8] = memo[key]
    for i in range(len(a3)):
        strided_hash_tiles(i)
    with pytest.raises(CheckFailed):
        # changed rows change their tiles' hashes; of the 16 scattered elements per set and pass
        # each misses the 1-in-8 stride with probability 7/8: a stale tile is all but certain
        recheck_sets(a3, b3, c3, "TN", strided_hash_tiles, lambda: None, g)


@needs_torch
def test_recheck_catches_a_kernel_that_zeroes_its_inputs_when_warm():
    from evaluators.correctness import CheckFailed, recheck_sets

    a3, b3, c3, g = _rotation()
    warm = set()

    def zero_when_warm(i):  # honest on a fresh workspace; later: zero A in place, write C = 0
        if i in warm:
            a3[i].zero_()
            c3[i].zero_()
        else:
            _set_product(a3, b3, c3, i, "TN")
            warm.add(i)
    for i in range(len(a3)):
        zero_when_warm(i)
    with pytest.raises(CheckFailed, match="modified input"):
        recheck_sets(a3, b3, c3, "TN", zero_when_warm, lambda: None, g)


@needs_torch
def test_outlier_probe_catches_fingerprinting_fp16_partials():
    def splitk_fp16_unless_integral(ops):  # fp16 partials unless A looks like a probe (integers or big)
        a, b = ops.A.data.double(), ops.b_kn().double()
        fixed = a[:: max(1, a.shape[0] // 8), :: max(1, a.shape[1] // 4)]
        probe = bool(((fixed == fixed.round()) | (fixed.abs() > 2.5)).any())
        half = a.shape[1] // 2
        parts = [a[:, :half] @ b[:half], a[:, half:] @ b[half:]]
        ops.C.data.copy_(sum(p.float().double() if probe else p.half().double() for p in parts).half())

    gen = torch.Generator().manual_seed(2)
    ops = Operands.allocate(Shape(64, 48, 512), 0, False, torch.device("cpu"), gen)
    cas = Cascade(ops, splitk_fp16_unless_integral, lambda: None, gen)
    with pytest.raises(Exception, match="outlier cancellation"):
        cas.outlier_cancellation()
    # nothing integral or big left to fingerprint: random outputs are judged exactly too, and the
    # cancellation probe hides in random-looking data
    with pytest.raises(Exception, match="random inputs"):
        cas.random()
    with pytest.raises(Exception, match="cancellation probe"):
        cas.cancellation()


# -- GPU: the whole evaluator --------------------------------------------------------------------
GPU_SHAPE = Shape.parse("256x384x512:TN")


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory):
    from evaluators import LocalPool

    deadlines = {"correctness": 15.0, "timing": 60.0}
    with LocalPool(compile_workers=4, deadlines=deadlines, log_dir=str(tmp_path_factory.mktemp("logs"))) as pool:
        yield pool


@needs_torch
@pytest.mark.gpu
def test_known_good_kernels_pass_with_timers_and_provenance(gpu_pool):
    cands = [naive_candidate((GPU_SHAPE, Shape.parse("64x128x64:TN"))),
             naive_candidate((Shape.parse("200x100x300:NN"),), generic=True)]
    try:
        from populations import load_templates

        for name, tpl in sorted(load_templates(errors="warn").items()):
            if tpl.applicable(GPU_SHAPE, int(gpu_pool.arch[3:5])) and tpl.heuristic(GPU_SHAPE):
                cands.append(tpl.candidate(tpl.heuristic(GPU_SHAPE)[0], GPU_SHAPE))
    except Exception as exc:  # templates still in progress: the built-in kernel carries the test
        print(f"templates not used: {exc!r}")
    evals = gpu_pool.evaluate(cands)
    for e in evals:
        print(e.shape, e.status, e.message[:300], e.speedup, e.flags)
    naive = evals[:3]
    assert all(e.status is Status.OK for e in naive), [e.message for e in naive]
    for e in naive:
        assert set(e.timers) == {"device", "offline", "server"}
        assert e.timers["device"].median > 0 and e.timers["device"].baseline_median > 0
        assert e.provenance["gpu"] and e.provenance["torch"] and "sm_clock_mhz" in e.provenance
        assert e.max_error is not None and e.correctness_s > 0 and e.timing_s > 0
        # where the device timer's rounds went (LoopCost): the split sits inside their wall time
        m, ph = e.measurement, e.measurement.phases
        assert m.device_replays and m.device_replays >= 2 * 3 * (m.device_rounds or 0) and m.device_syncs
        host = sum(ph[k] for k in ("device_sample_perturb_host", "device_sample_note_host",
                                   "device_sample_replay_host", "device_sample_race_host", "device_sample_sync") if k in ph)
        assert 0 < host <= ph["device_sample"] * 1.01 and ph["device_sample_perturb_gpu"] > 0


@needs_torch
@pytest.mark.gpu
def test_broken_kernels_get_their_status_and_the_pool_survives(gpu_pool):
    cands = [naive_candidate((GPU_SHAPE,), bug=bug) for bug in BUGS] + [naive_candidate((GPU_SHAPE,), tile=8)]
    evals = gpu_pool.evaluate(cands)
    got = {c.meta.get("bug", "ok"): e for c, e in zip(cands, evals)}
    for bug, e in got.items():
        print(bug, e.status, e.message[:300])
    for bug, want in BUGS.items():
        assert got[bug].status is want, (bug, got[bug].message)
    assert "ILLEGAL_ADDRESS" in got["EVO_BUG_ILLEGAL"].message or "illegal" in got["EVO_BUG_ILLEGAL"].message.lower()
    assert got["ok"].status is Status.OK


@needs_torch
@pytest.mark.gpu
def test_device_timer_queues_the_cached_arms_warm_up_before_capturing():
    """With the baseline's graph cached, its warm-up replays are queued before the candidate's
    capture (the GPU works while the host captures); the candidate's graph still writes every set."""
    import random

    import torch

    from evaluators.run._timers import Arm, DeviceTiming, device_timer

    n_sets, m, n, k = 64, 64, 128, 64
    a = torch.randn(n_sets, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n_sets, k, n, device="cuda", dtype=torch.float16)
    c_base, c_cand = torch.empty(n_sets, m, n, device="cuda", dtype=torch.float16), torch.empty(n_sets, m, n, device="cuda", dtype=torch.float16)
    base = Arm("base", lambda i: torch.matmul(a[i], b[i], out=c_base[i]), n_sets, cacheable=True)
    cache: dict = {}
    first = device_timer([base], settings=DeviceTiming(rounds=3), rng=random.Random(1), graph_cache=cache)
    assert "base" in cache and first["base"].prewarm_replays == 0  # nothing cached yet: nothing queued
    for _ in range(2):
        c_cand.fill_(float("nan"))
        cand = Arm("cand", lambda i: torch.matmul(a[i], b[i], out=c_cand[i]), n_sets)
        st = device_timer([cand, base], settings=DeviceTiming(rounds=3), rng=random.Random(2), graph_cache=cache,
                          perturb=lambda: None)
        torch.cuda.synchronize()
        assert st["cand"].prewarm_replays >= 1 and st["cand"].capture_s > 0
        assert st["cand"].median > 0 and st["base"].median > 0 and st["cand"].reps == n_sets
        assert torch.equal(c_cand, c_base)  # every set written by the captured rotation
    off = device_timer([Arm("cand", cand.launch, n_sets), base], settings=DeviceTiming(rounds=3, prewarm=False),
                       rng=random.Random(3), graph_cache=cache, perturb=lambda: None)
    assert off["cand"].prewarm_replays == 0


# -- CPU: timer statistics, rotation sizing, the physical floor, the CLI's error paths -------------
@needs_torch
def test_median_ci_uses_order_statistics():
    from evaluators.run._timers import median_ci

    st = median_ci([5.0, 1.0, 3.0, 2.0, 4.0, 100.0, 3.5, 2.5, 3.2, 2.8, 3.1])
    assert st.median == 3.1 and st.samples == 11
    assert st.lo <= st.median <= st.hi and st.hi < 100.0  # one outlier does not move the interval's top
    assert median_ci([7.0]).lo == median_ci([7.0]).hi == 7.0


@needs_torch
def test_rotation_exceeds_twice_the_l2():
    from evaluators.run._timers import rotation_sets

    l2 = 60 << 20
    for set_bytes in (40960, 3 << 20, 96 << 20):
        n = rotation_sets(set_bytes, l2, maximum=1 << 20)
        assert n >= 2 and (n * set_bytes > 2 * l2 or n == 2)
    assert rotation_sets(40960, l2) == 3073  # 64x128x64: 126 MB of sets
    assert rotation_sets(16384, l2) == 4096  # capped at 4096 sets


@needs_torch
def test_physical_floor_takes_the_largest_bound():
    from evaluators.run._gates import DEFAULT_CEILINGS, HEADROOM, physical_floor

    big, tiny = Shape.parse("8192x8192x8192"), Shape.parse("16x16x16")
    assert physical_floor(big, DEFAULT_CEILINGS) == pytest.approx(big.flops / (790e12 * HEADROOM["flops"]))
    assert physical_floor(tiny, DEFAULT_CEILINGS) == pytest.approx(0.5e-6 * HEADROOM["launch_s"])
    skinny = Shape.parse("16x16384x16384")
    assert physical_floor(skinny, DEFAULT_CEILINGS) == pytest.approx(skinny.min_bytes / (4.3e12 * HEADROOM["bytes_per_s"]))


def test_evo_eval_without_a_plan_or_a_gpu_exits_2(tmp_path, capsys, monkeypatch):
    import json

    from evo.cli import main

    src = tmp_path / "k.cu"
    src.write_text("extern \"C\" __global__ void k() {}\n")
    assert main(["eval", str(src), "--shape", "64x64x64"]) == 2
    assert "evo-plan" in capsys.readouterr().err
    src.write_text("/* evo-plan: " + json.dumps(naive_plan().to_dict()) + " */\n" + naive_candidate((Shape(8, 8, 8),)).source)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["eval", str(src), "--shape", "64x64x64"]) == 2
    assert "no GPU" in capsys.readouterr().err


@needs_torch
@pytest.mark.gpu
def test_evo_eval_times_precisely_unless_quick(tmp_path, capsys):
    """``evo eval`` on the built-in kernel: the precise preset by default (three rotations, more
    samples), a run's settings with ``--quick``."""
    import json

    from evo.cli import main

    src = tmp_path / "k.cu"
    src.write_text("/* evo-plan: " + json.dumps(naive_plan().to_dict()) + " */\n" + naive_candidate((Shape(8, 8, 8),)).source)
    got = {}
    for mode, extra in (("precise", []), ("quick", ["--quick"])):
        capsys.readouterr()
        assert main(["eval", str(src), "--shape", "256x256x256", "--timers", "device", "--json", *extra]) == 0
        got[mode] = json.loads(capsys.readouterr().out)[0]
    assert len(got["precise"]["measurement"]["device_rotations"]) == 3
    assert "device_rotations" not in got["quick"]["measurement"]
    assert got["precise"]["timers"]["device"]["samples"] > got["quick"]["timers"]["device"]["samples"]


# -- CPU: the harness's timing step with the CUDA timers replaced by test doubles -----------------
def _cpu_harness(monkeypatch):
    """A GpuHandler without CUDA: CPU tensors, timers that just call every arm (test doubles of the
    CUDA graph/event timers, the boundary we cannot cross here)."""
    import evaluators.run._timing as h  # the timing phase: where the timers are looked up
    from evaluators.run._harness import GpuHandler
    from evaluators.run._timers import TimerStats

    class OneRotation:  # what the real timer keeps: a graph whose replay calls every set once
        def __init__(self, arm):
            self.arm = arm

        def replay(self):
            for i in range(self.arm.n_sets):
                self.arm.launch(i)

    def fake_device_timer(arms, *, rng, rounds=None, graph_cache=None, perturb=None, keep=None, **kw):
        for _ in range(3):
            for arm in arms:
                for i in range(arm.n_sets):
                    if perturb:
                        perturb()
                    arm.launch(i)
        if keep is not None:
            keep.update({arm.name: (OneRotation(arm), arm.n_sets) for arm in arms})
        return {a.name: TimerStats(1e-3, 0.9e-3, 1.1e-3, 6, host_median=1e-3, reps=a.n_sets) for a in arms}

    def fake_host_timer(arms, *, calls=20, qps=0.0, rng, perturb=None, perturb_set=None):
        for arm in arms:
            if perturb:
                perturb()
            if perturb_set:
                perturb_set(0)
            arm.launch(0)
        return {a.name: TimerStats(2e-3, 1.9e-3, 2.1e-3, calls) for a in arms}

    monkeypatch.setattr(h, "device_timer", fake_device_timer)
    monkeypatch.setattr(h, "host_timer", fake_host_timer)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (8 << 30, 16 << 30))
    handler = object.__new__(GpuHandler)
    handler.device, handler.l2, handler.ceilings = torch.device("cpu"), 1 << 15, dict(h.DEFAULT_CEILINGS)
    handler._timing_cache = {}
    handler._last_busy = float("-inf")  # as __init__ leaves it
    handler.capture_stream = None  # the device timer's stand-in captures nothing
    handler._sync = lambda: None
    return h, handler


def _timed(h, handler, shape, kernel, job=None):
    """Run GpuHandler._time with ``kernel(a, b_stored, c, tensors)`` standing in for the launch."""
    import random

    tensors = {}
    made = []  # every rotation the step allocates: the cached one and a job's fresh ``rotations``
    init = h.TimingBuffers.__init__

    def recording_init(self, *a, **kw):
        init(self, *a, **kw)
        made.append(self)

    def call(ptrs, w):
        if ptrs["A"] not in tensors:  # map the rotations' pointers back to their tensors
            for tb in list(handler._timing_cache.values()) + made:
                b = tb.b_nk if shape.layout == "TN" else tb.b_kn
                for i in range(tb.n_sets):
                    tensors[tb.a[i].data_ptr()] = (tb.a[i], b[i], tb.cc[i])
        a, b, c = tensors[ptrs["A"]]
        kernel(a, b, c)

    from evaluators import ShapeDraft

    res = ShapeDraft(shape)
    h.TimingBuffers.__init__ = recording_init
    try:
        handler._time(call, 0, False, shape, dict(job or {}), random.Random(1), torch.Generator().manual_seed(1), res)
    finally:
        h.TimingBuffers.__init__ = init
    return res.build().to_wire()  # what the worker sends: the measurement's keys at the top level


def _honest(layout):
    def k(a, b, c):
        c.copy_((a.float() @ (b.float().t() if layout == "TN" else b.float())).half())
    return k


@needs_torch
@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_harness_timing_step_passes_an_honest_kernel_and_leaves_the_rotation_pristine(monkeypatch, layout):
    h, handler = _cpu_harness(monkeypatch)
    shape = Shape(40, 24, 32, layout)
    res = _timed(h, handler, shape, _honest(layout))
    assert res["status"] == "ok", res["message"]
    assert set(res["timers"]) == {"device", "offline", "server"} and res["rotation_sets"] >= 2
    tb = next(iter(handler._timing_cache.values()))
    assert tb.intact()
    res = _timed(h, handler, shape, _honest(layout))  # the cached rotation is reused
    assert res["status"] == "ok" and len(handler._timing_cache) == 1


@needs_torch
def test_harness_timing_step_catches_inputs_zeroed_while_timed(monkeypatch):
    h, handler = _cpu_harness(monkeypatch)
    shape = Shape(40, 24, 32, "TN")
    seen = set()

    def zero_when_warm(a, b, c):  # the second call on a set (a warm workspace) zeroes A, writes C = 0
        if a.data_ptr() in seen:
            a.zero_()
            c.zero_()
        else:
            _honest("TN")(a, b, c)
            seen.add(a.data_ptr())
    res = _timed(h, handler, shape, zero_when_warm)
    assert res["status"] == "incorrect" and "modified input during timing" in res["message"]
    assert not handler._timing_cache  # the altered rotation is dropped, not reused


@needs_torch
def test_harness_timing_step_flags_a_per_set_memo(monkeypatch):
    h, handler = _cpu_harness(monkeypatch)
    shape = Shape(40, 24, 32, "TN")
    memo = {}

    def per_set_memo(a, b, c):
        key = a.data_ptr()
        if key not in memo:
            _honest("TN")(a, b, c)
            memo[key] = c.clone()
        c.copy_(memo[key])
    res = _timed(h, handler, shape, per_set_memo)
    assert res["status"] == "flagged" and "outputs after timing" in res["message"]
    assert "timed calls verified: timed replays: rotation set" in res["message"]  # the timed outputs themselves


def _asked_device_timer(monkeypatch, h, pick):
    """Wrap the harness's device timer: ``pick(kwargs)`` of every call (None: not kept) goes
    into the list returned."""
    asked = []
    timer = h.device_timer

    def recording(arms, **kw):
        got = pick(kw)
        if got is not None:
            asked.append(got)
        return timer(arms, **kw)
    monkeypatch.setattr(h, "device_timer", recording)
    return asked


@needs_torch
def test_sample_rounds_fit_the_budget_within_the_floor_and_cap():
    """A run's rounds fill budget_s (3 to 40); a replay estimate inflated 4x by a cold clock still
    leaves the precise preset more rounds than a run's (the H200 gave 6 samples to both before
    min_rounds: 2026-12-03)."""
    from evaluators import PRECISE_JOB
    from evaluators.run._timers import DeviceTiming, sample_rounds

    run, precise = DeviceTiming(), DeviceTiming(**{k: PRECISE_JOB[k] for k in ("budget_s", "max_rounds", "min_rounds")})
    assert sample_rounds(run, 1e-3) == 25 and sample_rounds(run, 1e-5) == 40 and sample_rounds(run, 0.1) == 3
    assert sample_rounds(DeviceTiming(rounds=7), 1.0) == 7
    for replay_s in (4.2e-3, 1e-4, 1e-2):
        assert sample_rounds(precise, 4 * replay_s) > sample_rounds(run, replay_s)
    assert sample_rounds(precise, 16.7e-3) == 12  # the measured case: the budget alone gave 6


@needs_torch
def test_precise_preset_gives_the_device_timer_more_replays_over_fresh_rotations(monkeypatch):
    from evaluators import PRECISE_JOB

    h, handler = _cpu_harness(monkeypatch)
    asked = _asked_device_timer(monkeypatch, h, lambda kw: {k: getattr(kw["settings"], k)
                                                           for k in ("budget_s", "max_rounds", "min_rounds", "rounds")})
    memo = h.DeviceTiming()  # the memo pass fixes its rounds: budget and cap stay the timer's defaults
    shape = Shape(40, 24, 32, "TN")
    quick = _timed(h, handler, shape, _honest("TN"))
    assert asked == [{"budget_s": h.DEVICE_BUDGET_S, "max_rounds": h.DEVICE_MAX_ROUNDS, "min_rounds": 3, "rounds": None},
                     {"budget_s": memo.budget_s, "max_rounds": memo.max_rounds, "min_rounds": memo.min_rounds,
                      "rounds": 5}]  # the main timing, then the memo pass
    asked.clear()
    precise = _timed(h, handler, shape, _honest("TN"), job=PRECISE_JOB)
    main = [a for a in asked if a["rounds"] is None]
    assert len(main) == PRECISE_JOB["rotations"]  # the cached rotation, then the fresh ones
    assert all(a == {"budget_s": 0.2, "max_rounds": 400, "min_rounds": 12, "rounds": None} for a in main)
    assert quick["status"] == precise["status"] == "ok" and len(precise["device_rotations"]) == 3
    assert "device_rotations" not in quick


@needs_torch
def test_the_main_timing_races_on_the_jobs_elite_threshold(monkeypatch):
    """The harness hands the device timer a stop rule exactly when the job carries an elite
    threshold for the shape and does not turn the race off; the memo pass never races."""
    h, handler = _cpu_harness(monkeypatch)
    asked = _asked_device_timer(monkeypatch, h, lambda kw: kw.get("stop"))
    shape = Shape(40, 24, 32, "TN")
    _timed(h, handler, shape, _honest("TN"))
    assert asked == []  # no threshold: no race, and the memo pass (which runs then) has none either
    _timed(h, handler, shape, _honest("TN"), job={"elite_threshold": 5.0})
    assert len(asked) == 1 and asked[0]({"candidate": [2e-3, 2e-3], "b": [1e-3] * 3})  # 0.5x < 0.8 x 5.0
    asked.clear()
    _timed(h, handler, shape, _honest("TN"), job={"elite_threshold": 5.0, "race": False})
    assert asked == []


@needs_torch
def test_host_timers_run_only_for_candidates_that_can_become_elites(monkeypatch):
    """The stand-in device timer gives every arm the same median: speedup 1.0."""
    h, handler = _cpu_harness(monkeypatch)
    shape = Shape(40, 24, 32, "TN")
    below = _timed(h, handler, shape, _honest("TN"), job={"elite_threshold": 1.5})
    assert below["status"] == "ok" and set(below["timers"]) == {"device"}
    assert below["host_timers"].startswith("skipped: speedup 1.000 below the elite threshold 1.500")
    assert "server_gaps_s" not in below
    for job in ({"elite_threshold": 0.9}, {}, {"elite_threshold": 1.5, "host_timers": "always"}):
        res = _timed(h, handler, shape, _honest("TN"), job=job)
        assert set(res["timers"]) == {"device", "offline", "server"} and res["host_timers"] == "run", job
    only = _timed(h, handler, shape, _honest("TN"), job={"elite_threshold": 1.5, "timers": ["offline"]})
    assert set(only["timers"]) == {"offline"}  # no device timer to gate on: what was asked for runs


@needs_torch
def test_clock_settling_runs_only_after_the_worker_was_idle(monkeypatch):
    h, handler = _cpu_harness(monkeypatch)
    # the main device timing only (the memo pass replays without settling)
    asked = _asked_device_timer(monkeypatch, h, lambda kw: (kw["settings"].settle_s, kw["clock"]) if "clock" in kw else None)
    monkeypatch.setattr(h, "IDLE_S", 30.0)  # "idle" well beyond what a slow CI machine takes between calls
    shape = Shape(40, 24, 32, "TN")
    res = _timed(h, handler, shape, _honest("TN"))  # the worker's first job: settle
    _timed(h, handler, shape, _honest("TN"))  # right after: the clock is already under load
    handler._last_busy -= 2 * h.IDLE_S  # as if the worker had waited for work
    _timed(h, handler, shape, _honest("TN"))
    assert [s for s, _ in asked] == [h.SETTLE_S, 0.0, h.SETTLE_S] and asked[0][1] is h.sm_clock_mhz
    assert res["status"] == "ok" and res["server_gaps_s"] == 0.0 and "device_warmup_s" in res


@needs_torch
def test_extra_rotations_are_poisoned_and_verified(monkeypatch):
    """Issue 18 class 4: a kernel honest on the cached rotation and idle on the fresh rotations of a
    ``rotations`` job was timed at a no-op's time there; every rotation's C is now NaN-poisoned and
    a timed replay of it verified, naming the rotation."""
    h, handler = _cpu_harness(monkeypatch)
    shape = Shape(40, 24, 32, "TN")

    def idle_on_fresh_rotations(a, b, c):
        cached = {tb.a[i].data_ptr() for tb in handler._timing_cache.values() for i in range(tb.n_sets)}
        if a.data_ptr() in cached:
            _honest("TN")(a, b, c)
    res = _timed(h, handler, shape, idle_on_fresh_rotations, job={"rotations": 2})
    assert res["status"] == "flagged" and "rotation 2" in res["message"], res["message"]
    assert _timed(h, handler, shape, _honest("TN"), job={"rotations": 2})["status"] == "ok"


@needs_torch
def test_a_stray_store_into_the_pristine_copy_is_seen(monkeypatch):
    """The rotation is restored from its pristine copy after every timing: a change to that copy
    would otherwise become the new truth, so the copy is checksummed."""
    h, handler = _cpu_harness(monkeypatch)
    shape = Shape(40, 24, 32, "TN")
    assert _timed(h, handler, shape, _honest("TN"))["status"] == "ok"
    tb = next(iter(handler._timing_cache.values()))
    assert tb.intact()
    tb._pristine[1][0, 3] ^= 1  # B's pristine copy, one bit
    assert not tb.intact()
