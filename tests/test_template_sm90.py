"""The sm90_wgmma template (family B): knob space, plan, and real sm_90a compiles on the CPU.

Compiles use NVRTC in-process (the same library the compile pool uses) for a seeded sample of
valid knob sets, and the evaluators' ``compile_candidate`` for the defaults. SASS must contain
HGMMA (wgmma) and UTMALDG (TMA) when a ``cuobjdump`` is available (the toolkit's, or the one in
the ``nvidia-cuda-cuobjdump`` wheel); otherwise that assertion is skipped with the reason.
"""
from __future__ import annotations

import os
import re
import random
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from populations import Shape
from populations._knobs import TemplateError
from populations import load_template
from populations._template import TEMPLATES_DIR
from evaluators.compile import cuda_tool
from evaluators.run._loader import nvrtc_cubin

FOLDER = TEMPLATES_DIR / "sm90_wgmma"
BIG = Shape(4096, 4096, 4096, "TN", "f32")


@pytest.fixture(scope="module")
def tpl():
    return load_template(FOLDER)


def nvrtc_compile(source: str) -> bytes:
    """cubin for sm_90a through the evaluator's NVRTC helper (RuntimeError carrying the log)."""
    return nvrtc_cubin(source, "sm_90a")


def cuobjdump(cubin: bytes, flag: str) -> str:
    """cuobjdump's output for ``cubin`` (``--dump-sass``, ``--dump-resource-usage``)."""
    tool = cuda_tool("cuobjdump")
    if tool is None:
        pytest.skip("no cuobjdump here (neither the toolkit's nor the nvidia-cuda-cuobjdump wheel's)")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        env = dict(os.environ, PATH=f"{Path(tool).parent}:{os.environ.get('PATH', '')}")
        out = subprocess.run([tool, flag, str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def sass(cubin: bytes) -> str:
    return cuobjdump(cubin, "--dump-sass")


def resource_regs(cubin: bytes, kernel: str = "evo_wgmma") -> int:
    """The GEMM kernel's register count as the cubin records it (cuobjdump --dump-resource-usage;
    the split-K reduce, where there is one, is another function of the module)."""
    text = cuobjdump(cubin, "--dump-resource-usage")
    regs = re.findall(rf"Function {kernel}\w*:\s*REG:(\d+)", text)
    assert len(regs) == 1, text
    return int(regs[0])


def assert_register_pool_fits(text: str, cubin: bytes, consumers: int, producers: int = 1) -> None:
    """setmaxnreg's split fits the registers the CTA was launched with: each producer warpgroup's
    DEALLOC plus each consumer warpgroup's TRY_ALLOC, 128 threads each, at most (consumers +
    producers) x 128 x the kernel's register count. Past it the consumers' TRY_ALLOC loops for registers no
    warp gives back: the kernel hangs (RAGGED's first split, 64 + 2 x 224 against 3 x 168, did on
    an H100)."""
    dealloc = [int(v, 16) for v in re.findall(r"USETMAXREG\.DEALLOC\.CTAPOOL (0x[0-9a-f]+)", text)]
    alloc = [int(v, 16) for v in re.findall(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, (0x[0-9a-f]+)", text)]
    assert dealloc and alloc, "no setmaxnreg split in the SASS"
    regs = resource_regs(cubin)
    assert producers * max(dealloc) + consumers * max(alloc) <= (consumers + producers) * regs, (dealloc, alloc, regs)


# ------------------------------------------------------------------------------ space
def test_loads_as_family_b_for_hopper_only(tpl):
    assert tpl.family == "B" and tpl.arch_features == ("sm_90a",)
    assert set(tpl.layouts) == {"TN", "NN"}
    assert tpl.applicable(BIG, 90) and not tpl.applicable(BIG, 80)
    assert tpl.compile_arch(90) == "sm_90a"
    assert "#include" not in tpl.source_text  # contracts §1: device code only, no headers


@pytest.mark.parametrize("knobs, words", [
    ({"BM": 256, "BN": 256}, "accumulators"),
    ({"BM": 64, "CONSUMERS": 2}, "multiple of 64 rows"),
    ({"BM": 128, "BN": 256, "STAGES": 5, "EPI": "direct"}, "227 KiB"),
    ({"BN": 100}, "not one of"),
    ({"SWAP": True, "SPLIT_K": 2, "EPI": "tsmem"}, "EPI direct"),
    ({"SCHED": "pingpong", "CONSUMERS": 1, "BM": 64}, "two consumer"),
    ({"SCHED": "pingpong", "PERSISTENT": False, "BN": 128}, "persistent"),
    ({"SCHED": "pingpong", "BM": 128, "BN": 256}, "accumulators"),
    ({"EPI": "smem", "STAGES": 4}, "227 KiB"),
    ({"SPLIT_K": 2}, "EPI direct"),
    ({"SPLIT_K": 5, "EPI": "direct"}, "not one of"),
    ({"SPLIT_K": 128, "EPI": "direct"}, "not one of"),
])
def test_invalid_knob_sets_are_refused_with_reasons(tpl, knobs, words):
    reasons = tpl.check(knobs, BIG)
    assert reasons and any(words in r for r in reasons), reasons
    with pytest.raises(TemplateError):
        tpl.render(knobs, BIG)


@pytest.mark.parametrize("m, n, k, layouts, staged", [
    (1000, 1000, 1001, ("TN", "NN"), None),  # A always; B in TN (pitch K), not in NN (pitch N = 1000)
    (129, 257, 64, ("NN",), "B"),
])
def test_ragged_pitches_must_be_staged(tpl, m, n, k, layouts, staged):
    """TMA cannot describe a row pitch that is not a multiple of 16 bytes: unstaged knob sets are
    refused with the reason, and the first picks stage exactly the ragged operands."""
    for layout in layouts:
        shape = Shape(m, n, k, layout, "f32")
        reasons = tpl.check({}, shape)
        assert any("stage" in r and "16 bytes" in r for r in reasons), reasons
        want = staged or ("AB" if layout == "TN" else "A")
        picks = tpl.heuristic(shape)
        assert tpl.applicable(shape, 90) and picks and {p["STAGE"] for p in picks} == {want}
        for bad in {"none", "A", "B", "AB"} - {want}:
            assert tpl.check({"STAGE": bad}, shape), bad  # a ragged operand left, or an aligned one copied
        cand = tpl.candidate(picks[0], shape)
        assert set(cand.plan.staging) == set(want)
        assert {s.matrix for s in cand.plan.tensor_maps.values() if s.staged} == set(want)


@pytest.mark.parametrize("shape, knobs", [
    ("1000x3000x1001", {"RAGGED": 1, "BM": 128, "BN": 128, "STAGES": 2, "EPI": "direct"}),
    ("358x14070x32735", {"RAGGED": 1, "SWAP": True, "EPI": "tsmem", "BM": 128, "BN": 72, "STAGES": 3}),
])
def test_a_ragged_k_is_read_in_place_without_tensor_maps(tpl, shape, knobs):
    """RAGGED reads a ragged K (TN) in place: valid unstaged, its plan launches the pointer entry
    (evo_wgmma_ragged; A and B swapped with SWAP) with no tensor map and no staged copy, and its
    shared memory counts the raw ring."""
    sh = Shape.parse(shape)
    assert not tpl.check(knobs, sh)
    plan = tpl.candidate(knobs, sh).plan
    (launch,) = plan.launches
    assert launch.kernel == "evo_wgmma_ragged" and not plan.tensor_maps and not plan.staging
    assert launch.args[:2] == (("B", "A") if knobs.get("SWAP") else ("A", "B"))
    env = tpl.space.env(tpl.space.complete(knobs), sh)
    rows = knobs["BM"] + knobs["BN"]
    assert env["RAW_BYTES"] == 2 * rows * 272 and env["SMEM"] == env["RAW_BYTES"] + (
        knobs["STAGES"] * rows * 128 + env["EPI_BYTES"] + 1024 + 16 * knobs["STAGES"])


@pytest.mark.parametrize("knobs, shape, words", [
    ({"RAGGED": 1, "STAGE": "AB"}, "1000x3000x1001", "in place"),         # in place takes no copies
    ({"RAGGED": 1}, "1000x3000x1000", "K % 8 == 0"),                       # aligned K: TMA reads it
    ({"RAGGED": 1, "CLUSTER_M": 2, "BN": 128}, "1000x3000x1001", "no cluster"),
    ({"RAGGED": 1, "BN": 128}, "1000x3000x1001:NN", "no NN"),
    ({"RSTAGES": 3, "STAGE": "AB"}, "1000x3000x1001", "RSTAGES"),         # RAGGED's knob alone
])
def test_ragged_in_place_refuses_what_it_cannot_do(tpl, knobs, shape, words):
    reasons = tpl.check({"BM": 128, "BN": 256, "STAGES": 2, **knobs}, Shape.parse(shape))
    assert any(words in r for r in reasons), reasons


@pytest.mark.parametrize("shape, bm, bn", [("22x6490x2881", 64, 24), ("200x14070x32735", 128, 72),
                                           ("227x25573x2795", 128, 80), ("100x1350x5345", 128, 32)])
def test_ragged_k_picks_stage_first_then_read_in_place(tpl, shape, bm, bn):
    """For M 17-256 with wide weights and a ragged K the staged picks of the other rules lead and an
    in-place pick follows them (swapped, at most 96 wide past M 64, the ring as deep as fits beside
    the raw ring, <= 4): the first in-place producer ran at 0.2-0.3x of the staged kernels
    (RESULTS section 27 (i)). Past M 256 the staged picks alone."""
    sh = Shape.parse(shape)
    first, *rest = tpl.heuristic(sh)
    assert first["RAGGED"] == 0 and first["STAGE"] == "AB"
    inplace = [p for p in rest if p["RAGGED"]]
    assert len(inplace) == 1
    p = inplace[0]
    assert (p["STAGE"], p["SWAP"], p["BM"], p["BN"]) == ("none", True, bm, bn)
    assert 2 <= p["STAGES"] <= 4 and not tpl.check(p, sh)
    assert all(q["STAGE"] == "AB" for q in rest if not q["RAGGED"])
    aligned = Shape(sh.m, sh.n, sh.k + 8 - sh.k % 8, "TN", "f32")
    assert all(p["RAGGED"] == 0 and p["STAGE"] == "none" for p in tpl.heuristic(aligned))
    wider = Shape(sh.m + 300, sh.n, sh.k, "TN", "f32")
    assert all(p["RAGGED"] == 0 and p["STAGE"] == "AB" for p in tpl.heuristic(wider))


@pytest.mark.parametrize("knobs, shape", [
    ({"RAGGED": 1, "SWAP": True, "EPI": "tsmem", "BM": 128, "BN": 72, "STAGES": 3}, "358x14070x32735"),
    ({"RAGGED": 1, "SWAP": True, "EPI": "tsmem", "BM": 64, "BN": 40, "CONSUMERS": 1, "STAGES": 4, "RSTAGES": 3},
     "40x3000x1001"),
    ({"RAGGED": 1, "BM": 128, "BN": 64, "SCHED": "pingpong", "STAGES": 2, "EPI": "smem"}, "1000x3000x1002"),
    ({"RAGGED": 1, "BM": 64, "BN": 64, "CONSUMERS": 1, "STAGES": 2, "RSTAGES": 4, "SPLIT_K": 8, "EPI": "direct"},
     "100x300x10001"),
    ({"RAGGED": 1, "RPRODUCERS": 2, "BM": 128, "BN": 128, "STAGES": 2, "EPI": "direct"}, "2000x3000x1001"),
    ({"RAGGED": 1, "RPRODUCERS": 2, "SWAP": True, "EPI": "tsmem", "BM": 128, "BN": 96, "STAGES": 2}, "191x12959x1082"),
    ({"RAGGED": 1, "RPRODUCERS": 2, "SWAP": True, "EPI": "tsmem", "BM": 64, "BN": 24, "CONSUMERS": 1, "STAGES": 4},
     "22x6490x2882"),
])
def test_ragged_in_place_compiles_to_cp_async_copies_without_local_memory(tpl, knobs, shape):
    """The in-place producer's SASS: cp.async copies (LDGSTS) into the raw ring, no tensor-map
    loads, the wgmmas, neither the producers (64-96 registers after setmaxnreg, one warpgroup or
    two) nor the consumers spill, and the split fits the registers the CTA is launched with."""
    source, _ = tpl.render(knobs, Shape.parse(shape))
    cubin = nvrtc_compile(source)
    text = sass(cubin)
    assert "LDGSTS.E.128" in text and "UTMALDG" not in text and "HGMMA.64x" in text and "USETMAXREG" in text
    assert "STL" not in text and "LDL" not in text
    assert_register_pool_fits(text, cubin, knobs.get("CONSUMERS", 2), knobs.get("RPRODUCERS", 1))


def test_odd_n_is_accepted_in_tn_only(tpl):
    """TN reads B (N x K) with TMA over K, and C is written with guarded stores: any N works
    unstaged; NN's B (K x N) needs N % 8 == 0 for the TMA row pitch, or staging."""
    tn, nn = Shape(129, 257, 64, "TN", "f32"), Shape(129, 257, 64, "NN", "f32")
    assert tpl.applicable(tn, 90) and tpl.heuristic(tn, 90) and not tpl.check({}, tn)
    assert tpl.check({}, nn) and not tpl.check({"STAGE": "B"}, nn)
    assert not tpl.check({}, None)  # layout unknown: the layout's constraint waits for a shape


def test_split_k_plan_adds_workspace_and_reduce(tpl):
    shape = Shape(256, 256, 4096, "TN", "f32")
    knobs = {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "EPI": "direct", "SPLIT_K": 16}
    _, plan = tpl.render(knobs, shape)
    (main, reduce), ws = plan.resolve(shape)
    assert ws == 16 * 256 * 256 * 4 and not plan.zero_workspace  # every slice is written in full
    assert main.grid == (min(4 * 2 * 16, 132), 1, 1)               # persistent over tiles x K shares
    assert main.args == (("tmap", "tmA"), ("tmap", "tmB"), "C", "workspace", 256, 256, 4096)
    assert reduce.kernel == "evo_splitk_reduce" and reduce.args == ("workspace", "C", 256, 256)
    assert reduce.grid[0] * 256 * 4 >= 256 * 256                  # four outputs per thread cover C
    _, plan = tpl.render(dict(knobs, PERSISTENT=False, SPLIT_K=3), shape)
    (main, _), _ = plan.resolve(shape)
    assert main.grid == (4 * 2 * 3, 1, 1)
    _, plan = tpl.render(dict(knobs, SPLIT_K=1), shape)
    (main,), ws = plan.resolve(shape)
    assert ws == 0 and main.args[3] == "workspace"
    assert any("at least one BK-deep" in r for r in tpl.check(dict(knobs, SPLIT_K=8), Shape(64, 64, 448, "TN", "f32")))


@pytest.mark.parametrize("shape, tiles", [("64x64x16384", 1), ("256x256x4096", 8), ("1024x256x16384", 32),
                                          ("128x128x1024", 2)])
def test_heuristic_splits_k_to_fill_the_sms(tpl, shape, tiles):
    """Few tiles and deep K: the first pick splits K so tiles x SPLIT_K is <= 132 and >= 64 or
    each share is down to 4 K blocks."""
    s = Shape.parse(shape)
    first = tpl.heuristic(s, 90)[0]
    units = tiles * first["SPLIT_K"]
    assert first["SPLIT_K"] > 1 and first["EPI"] == "direct"
    assert -(-s.m // first["BM"]) * -(-s.n // first["BN"]) == tiles
    assert units <= 132 and (units >= 64 or s.k // 64 // first["SPLIT_K"] <= 7), (first, units)
    assert all(p["SPLIT_K"] == 1 for p in tpl.heuristic(BIG, 90))
    # next, the same tile with a smaller split (fewer partials) before any unsplit pick, which at a
    # few tiles would leave most SMs idle
    splits = [p["SPLIT_K"] for p in tpl.heuristic(s, 90)]
    unsplit = splits.index(1)
    assert all(x > 1 for x in splits[:unsplit])
    if first["SPLIT_K"] >= 4 and 2 * splits[0] <= 132 // tiles:
        assert splits[1] == splits[0] // 2, splits


def test_swapped_split_k_stores_partials_in_cs_layout(tpl):
    """SWAP with split-K: the swapped kernel's grid over (N tiles x 1 M tile) x SPLIT_K units, its fp32
    partials stored transposed (store_partial_t) into SPLIT_K slices of C's M x N, then the
    unswapped reduce over M x N; the PTX holds the kernel and the reduce."""
    shape = Shape.parse("176x4608x19456")
    knobs = {"SWAP": True, "BM": 128, "BN": 176, "SPLIT_K": 3, "STAGES": 5, "EPI": "direct"}
    source, plan = tpl.render(knobs, shape)
    (gemm, reduce), ws = plan.resolve(shape)
    assert gemm.grid == (36 * 3, 1, 1) and ws == 3 * 176 * 4608 * 4
    assert reduce.kernel == "evo_splitk_reduce"
    body = source[source.index("#if SPLIT_K > 1 && SWAP"):]
    assert body.index("store_partial_t(Wz") < body.index("#elif SPLIT_K > 1")


def test_plan_grid_smem_and_tensor_maps(tpl):
    shape = Shape(8192, 8192, 1024, "TN", "f32")
    _, plan = tpl.render({"BM": 128, "BN": 256, "STAGES": 4, "PERSISTENT": True, "EPI": "direct"}, shape)
    (launch,), ws = plan.resolve(shape)
    assert ws == 0 and launch.grid == (132, 1, 1) and launch.block == (384, 1, 1)
    assert launch.smem == 4 * 384 * 128 + 1024 + 64 and launch.smem <= 232448
    # the shared-memory epilogue stages the whole tile, rows padded by 16 bytes
    _, plan = tpl.render({"BM": 128, "BN": 256, "STAGES": 3, "EPI": "smem"}, shape)
    (launch,), _ = plan.resolve(shape)
    assert launch.smem == 3 * 384 * 128 + 128 * (512 + 16) + 1024 + 48
    assert launch.args == (("tmap", "tmA"), ("tmap", "tmB"), "C", "workspace", 8192, 8192, 1024)
    assert plan.tensor_maps["tmA"].box == (128, 64) and plan.tensor_maps["tmB"].box == (64, 64)
    assert all(t.swizzle == 128 for t in plan.tensor_maps.values())
    _, plan = tpl.render({"BM": 128, "BN": 256, "PERSISTENT": False}, shape)
    (launch,), _ = plan.resolve(shape)
    assert launch.grid == (64 * 32, 1, 1)
    small = Shape(256, 512, 64, "NN", "f32")
    _, plan = tpl.render({"BM": 128, "BN": 128, "CONSUMERS": 1}, small)
    (launch,), _ = plan.resolve(small)
    assert launch.grid == (8, 1, 1) and launch.block == (256, 1, 1)
    # clusters of two CTAs cover vertically adjacent tiles: grids are even, persistent ones <= 132
    _, plan = tpl.render({"CLUSTER_M": 2, "PERSISTENT": False}, Shape(300, 1024, 64, "TN", "f32"))
    (launch,), _ = plan.resolve(Shape(300, 1024, 64, "TN", "f32"))
    assert launch.grid == (2 * 2 * 4, 1, 1)  # 3 tile-rows -> 2 cluster rows, 4 tile-columns
    _, plan = tpl.render({"CLUSTER_M": 2}, shape)
    (launch,), _ = plan.resolve(shape)
    assert launch.grid == (132, 1, 1)


def test_heuristic_picks_are_valid(tpl):
    for shape in (BIG, Shape(512, 512, 4096, "NN", "f32"), Shape(3000, 1000, 512, "TN", "f32"),
                  Shape(77, 4096, 4096, "TN", "f32")):
        picks = tpl.heuristic(shape)
        assert picks and all(not tpl.check(p, shape) for p in picks)
    big = tpl.heuristic(BIG)[0]  # the measured best on large shapes (bench/RESULTS.md)
    assert (big["BM"], big["BN"], big["STAGES"], big["EPI"], big["SCHED"]) == (128, 256, 3, "smem", "coop")
    assert tpl.heuristic(Shape(77, 4096, 1024, "TN", "f32"))[0]["CONSUMERS"] == 1
    assert tpl.heuristic(Shape(3000, 1000, 512, "TN", "f32"))[0]["SCHED"] == "pingpong"


def test_sample_returns_distinct_valid_sets(tpl):
    sets = tpl.sample(random.Random(7), BIG, 40)
    assert len(sets) == 40
    assert len({tuple(sorted(s.items())) for s in sets}) == 40
    assert all(not tpl.check(s, BIG) for s in sets)


def test_sample_finds_valid_sets_where_few_uniform_draws_are(tpl):
    """In NN about 1 uniform draw in 2,000 is valid (BN admits 4 widths of 32, the cluster knobs 3
    pairs of 4, SWAP and the staging knobs one value each): the sampler redraws the knobs that a
    violated constraint names, so seeding and the random operator get 16 sets in the same tries."""
    nn = Shape(777, 1536, 2880, "NN", "f32")
    rng = random.Random(3)
    uniform = sum(tpl.space.is_valid(tpl.space.random(rng), nn) for _ in range(2000))
    assert uniform <= 8  # the statistic the redraws change: pure rejection gets about one
    sets = tpl.sample(random.Random(3), nn, 16)
    assert len(sets) == 16 and all(not tpl.check(s, nn) for s in sets)
    assert len({s["BN"] for s in sets}) >= 3 and {s["STAGES"] for s in sets} != {3}  # spread, not one corner


def test_swap_and_fitted_widths_are_tn_only_and_swap_the_plan(tpl):
    """A BN that is not a multiple of 64 and SWAP need K-major B (TN); SWAP's plan passes B's map as
    the kernel's A and A's as its B, with the problem's N and M as the kernel's M and N."""
    nn = Shape(200, 11008, 4096, "NN", "f32")
    assert any("TN" in r for r in tpl.check({"BN": 104, "EPI": "direct"}, nn))
    assert any("SWAP" in r for r in tpl.check({"SWAP": True, "BN": 104, "EPI": "direct"}, nn))
    shape = Shape(200, 11008, 4096, "TN", "f32")
    cand = tpl.candidate({"SWAP": True, "BN": 104, "BM": 128, "STAGES": 4}, shape)
    (launch,) = cand.plan.launches
    assert launch.args[:2] == ("tmap:tmBs", "tmap:tmAs") and launch.args[4:6] == ("N", "M")  # generic: bound at resolve
    maps = cand.plan.tensor_maps
    assert set(maps) == {"tmAs", "tmBs"} and maps["tmBs"].matrix == "B" and maps["tmBs"].box == (128, 64)
    assert maps["tmAs"].matrix == "A" and maps["tmAs"].box == (104, 64)
    (resolved,), _ = cand.plan.resolve(shape)
    assert resolved.grid == (132, 1, 1)  # 86 tiles over N x 2 over M, persistent on 132 SMs
    plain = tpl.candidate({"BN": 128}, BIG)
    assert set(plain.plan.tensor_maps) == {"tmA", "tmB"} and plain.plan.tensor_maps["tmB"].box == (64, 64)


def test_a_cluster_multicasts_b_in_slices_where_its_boxes_do_not_split(tpl):
    """CLUSTER_M 2 shares B between two CTAs: whole 64-row boxes where BN is a multiple of 128,
    otherwise (TN) one slice of BN / 2 rows per CTA, so the swapped kernel's narrow, M-fitted widths
    get cuBLAS's 2 x 1 cluster too; where BN / 2 is not a multiple of 8 rows (a slice would start
    mid swizzle atom) the whole BN-row box, multicast by the CTAs in turn. NN's B boxes are k-rows:
    no slices there."""
    shape = Shape(777, 1536, 2880, "TN", "f32")
    cand = tpl.candidate({"SWAP": True, "CLUSTER_M": 2, "BN": 80, "BM": 128, "STAGES": 7}, shape)
    assert cand.plan.tensor_maps["tmAs"].box == (40, 64) and cand.plan.tensor_maps["tmBs"].box == (128, 64)
    (resolved,), _ = cand.plan.resolve(shape)
    assert resolved.grid == (120, 1, 1)  # 6 cluster tiles over N x 10 over M, two CTAs each
    turns = tpl.candidate({"SWAP": True, "CLUSTER_M": 2, "BN": 72, "BM": 128, "STAGES": 8}, shape)
    assert turns.plan.tensor_maps["tmAs"].box == (72, 64)  # cuBLAS's swapped 128 x 72 in a 2 x 1 cluster
    (resolved,), _ = turns.plan.resolve(shape)
    assert resolved.grid == (132, 1, 1)  # 6 cluster tiles over N x 11 over M, two CTAs each
    assert tpl.candidate({"CLUSTER_M": 2, "BN": 192}, BIG).plan.tensor_maps["tmB"].box == (96, 64)
    assert tpl.candidate({"CLUSTER_M": 2, "BN": 256, "STAGES": 3}, BIG).plan.tensor_maps["tmB"].box == (64, 64)
    assert tpl.candidate({"CLUSTER_M": 2, "BN": 104, "BM": 128, "STAGES": 4}, BIG).plan.tensor_maps["tmB"].box == (104, 64)
    nn = Shape(4096, 4096, 4096, "NN", "f32")
    assert any("64 x CLUSTER_M" in r for r in tpl.check({"CLUSTER_M": 2, "BN": 192, "EPI": "direct"}, nn))
    assert any("64 x CLUSTER_M" in r for r in tpl.check({"CLUSTER_M": 2, "BN": 64, "EPI": "direct"}, nn))


def test_a_cluster_along_n_multicasts_halves_of_a(tpl):
    """CLUSTER_N 2: horizontally adjacent tiles share A, each CTA loading BM / 2 rows (whole
    swizzle atoms for every BM); with SWAP that is the weights' tile. One cluster, two CTAs."""
    shape = Shape(777, 1536, 2880, "TN", "f32")
    swapped = tpl.candidate({"SWAP": True, "CLUSTER_N": 2, "BN": 72, "BM": 128, "STAGES": 8}, shape)
    assert swapped.plan.tensor_maps["tmBs"].box == (64, 64) and swapped.plan.tensor_maps["tmAs"].box == (72, 64)
    (resolved,), _ = swapped.plan.resolve(shape)
    assert resolved.grid == (132, 1, 1)  # 12 tiles of the weights x 6 cluster tiles over M (11 of 72): 144 CTAs, persistent on 132
    nn = Shape(777, 1536, 2880, "NN", "f32")
    plain = tpl.candidate({"CLUSTER_N": 2, "BN": 128, "BM": 64, "CONSUMERS": 1, "STAGES": 6}, nn)
    assert plain.plan.tensor_maps["tmA"].box == (32, 64)
    (resolved,), _ = plain.plan.resolve(nn)
    assert resolved.grid == (132, 1, 1)
    unclustered = tpl.candidate({"BN": 128, "BM": 64, "CONSUMERS": 1, "STAGES": 6}, nn)
    assert unclustered.plan.tensor_maps["tmA"].box == (64, 64)
    assert any("not both" in r for r in tpl.check({"CLUSTER_M": 2, "CLUSTER_N": 2, "BN": 128}, shape))


def test_a_four_cta_cluster_shares_quarters_or_takes_turns(tpl):
    """CLUSTER_M or CLUSTER_N 4 (cuBLAS's thin tiles with deep rings run in 4-CTA clusters on small
    mid rows): each CTA loads a quarter of the shared panel where a quarter is whole 8-row swizzle
    atoms, else the whole box every fourth K block; four CTAs a cluster tile; never both axes."""
    tn = Shape(115, 1408, 1280, "TN", "f32")
    quarters = tpl.candidate({"SWAP": True, "CLUSTER_M": 4, "BN": 64, "BM": 64, "CONSUMERS": 1, "STAGES": 12,
                              "EPI": "tsmem"}, tn)
    assert quarters.plan.tensor_maps["tmAs"].box == (16, 64)  # the swapped kernel's B: 64 rows, 16 a CTA
    (resolved,), _ = quarters.plan.resolve(tn)
    assert resolved.grid == (48, 1, 1)  # 22 tiles of the weights in 6 cluster tiles x 2 over M, 4 CTAs each
    turns = tpl.candidate({"SWAP": True, "CLUSTER_M": 4, "BN": 40, "BM": 64, "CONSUMERS": 1, "STAGES": 12,
                           "EPI": "tsmem"}, tn)
    assert turns.plan.tensor_maps["tmAs"].box == (40, 64)  # 10 rows a quarter: the whole box in turns
    a_side = tpl.candidate({"CLUSTER_N": 4, "BN": 128, "BM": 64, "CONSUMERS": 1, "STAGES": 6},
                           Shape(777, 1536, 2880, "NN", "f32"))
    assert a_side.plan.tensor_maps["tmA"].box == (16, 64)
    nn = Shape(4096, 4096, 4096, "NN", "f32")
    assert tpl.check({"CLUSTER_M": 4, "BN": 256, "BM": 128, "STAGES": 3, "EPI": "direct"}, nn) == []
    assert any("64 x CLUSTER_M" in r for r in tpl.check({"CLUSTER_M": 4, "BN": 128, "EPI": "direct"}, nn))
    assert any("one-dimensional" in r for r in tpl.check({"CLUSTER_M": 4, "CLUSTER_N": 2, "BN": 256}, nn))


@pytest.mark.parametrize("knobs, shape", [
    ({"SWAP": True, "CLUSTER_M": 4, "BN": 64, "BM": 64, "CONSUMERS": 1, "STAGES": 12, "EPI": "tsmem"}, "115x1408x1280"),
    ({"SWAP": True, "CLUSTER_M": 4, "BN": 40, "BM": 64, "CONSUMERS": 1, "STAGES": 12, "EPI": "tsmem"}, "115x1408x1280"),
    ({"SWAP": True, "CLUSTER_N": 4, "BN": 64, "BM": 64, "CONSUMERS": 1, "STAGES": 12, "EPI": "tsmem"}, "56x3008x4224"),
    ({"CLUSTER_M": 4, "BN": 256, "BM": 128, "STAGES": 3, "EPI": "direct"}, "4096x4096x4096:NN"),
    ({"SWAP": True, "CLUSTER_M": 2, "BN": 72, "BM": 128, "STAGES": 8}, "777x1536x2880"),  # B in turns: the whole box
    ({"SWAP": True, "CLUSTER_M": 2, "BN": 80, "BM": 128, "STAGES": 7}, "777x1536x2880"),  # B in slices of 40 rows
    ({"SWAP": True, "CLUSTER_N": 2, "BN": 72, "BM": 128, "STAGES": 8}, "777x1536x2880"),  # A (the weights) in halves
    ({"CLUSTER_N": 2, "BN": 128, "BM": 64, "CONSUMERS": 1, "STAGES": 6}, "777x1536x2880:NN"),
])
def test_cluster_multicast_compiles_with_slices_or_turns(tpl, knobs, shape):
    """Every way of sharing an operand in a cluster compiles to multicast TMA loads and one wgmma
    of the tile's width, with no local memory."""
    source, _ = tpl.render(knobs, Shape.parse(shape))
    text = sass(nvrtc_compile(source))
    assert f"HGMMA.64x{knobs['BN']}x16.F32" in text and "UTMALDG.2D.MULTICAST" in text
    assert "STL" not in text and "LDL" not in text


def test_swap_first_picks_fit_the_tile_width_to_m(tpl):
    """The swap rules cut M into tiles whose count fills whole waves of 132 SMs with N's tiles,
    each a multiple of 8 wide: at 777x1536 with 128-row tiles (12 over N) 11 tiles of 72 rows,
    cuBLAS's own choice there, with 64-row ones (24 over N) 5 of 160; at 421x6544 5 of 88, two
    waves. Few rows (M <= 64) take the swapped 64-row tile first, M in one tile."""
    def widths(s: str) -> list[tuple[int, int]]:
        return [(k["BM"], k["BN"]) for k in tpl.heuristic(Shape.parse(s), 90) if k["SWAP"]]
    assert widths("777x1536x2880")[:2] == [(64, 160), (128, 72)]
    assert (128, 88) in widths("421x6544x9136")
    assert widths("4096x4096x4096") == [] and widths("200x11008x4096:NN") == []
    first = tpl.heuristic(Shape.parse("33x8192x2048"), 90)[0]
    assert (first["SWAP"], first["BM"], first["BN"], first["STAGES"]) == (True, 64, 40, 12)
    for s in ("17x1024x1024", "64x4096x4096", "300x2048x512", "1000x30000x1000"):
        m = Shape.parse(s).m
        assert all(w % 8 == 0 and min(32, -(-m // 8) * 8) <= w <= 256 for _, w in widths(s)), (s, widths(s))


@pytest.mark.parametrize("shape, first", [
    # few weight tiles, deep K: swapped, M in one tile (two past 256, each <= 232 wide), K split
    ("176x4608x19456", (True, 128, 176, 3, "direct")),
    ("72x1984x7720", (True, 128, 72, 8, "direct")),
    ("369x1072x17488", (True, 128, 192, 6, "direct")),
    ("460x1500x8192", (True, 128, 232, 4, "direct")),
    # two tiles 256 wide would leave a 4-stage ring: the swapped 64-row tile instead
    ("512x2048x4096", (True, 64, 128, 1, "tsmem")),
    # the swapped 64-row tiles fill the wave (124 and 128 units): they lead, unsplit
    ("129x3968x3008", (True, 64, 72, 1, "tsmem")),
    ("77x4096x4096", (True, 64, 40, 1, "tsmem")),
    # past M 256: they lead where they keep more SMs busy (120 units against 100 tiles) ...
    ("640x2560x10240", (True, 64, 216, 1, "tsmem")),
    # ... not where both keep 128 busy and the 128-row tiles waste no rows
    ("512x4096x4096", (False, 128, 128, 1, "smem")),
    # M 129-192 with wide weights: swapped, M in one tile
    ("145x10608x4488", (True, 128, 152, 1, "tsmem")),
    ("187x15696x2080", (True, 128, 192, 1, "tsmem")),
    ("200x11008x4096", (False, 128, 192, 1, "smem")),
    # M 257-1024, N past 66 64-row tiles, 22% of M wasted by 128-row tiles: swapped one-wave tile
    ("421x6544x9136", (True, 128, 216, 1, "tsmem")),
    # small K: no split below K 1024, the staged small tile first
    ("278x560x640", (False, 64, 128, 1, "smem")),
])
def test_mid_first_picks_follow_what_fills_the_sms(tpl, shape, first):
    """RESULTS 27 (j): the first pick's (SWAP, BM, BN, SPLIT_K, EPI) per rule."""
    k = tpl.heuristic(Shape.parse(shape), 90)[0]
    assert (k["SWAP"], k["BM"], k["BN"], k["SPLIT_K"], k["EPI"]) == first, k
    assert not tpl.check(k, Shape.parse(shape), 90)


@pytest.mark.parametrize("shape, first", [
    # small K (<= 6 K blocks), few of N's 64-row tiles: swapped one-consumer tile, one wave, 4 stages
    ("83x896x128", (True, 64, 32, 4)),
    ("1253x384x128", (True, 64, 64, 4)),
    ("1838x904x256", (True, 64, 232, 4)),
    ("250x1408x384", (True, 64, 48, 12)),      # from K 257 the deepest ring
    # more of them: two consumers, two waves, 4 stages
    ("253x11136x192", (True, 128, 88, 4)),
    ("1211x3056x184", (True, 128, 112, 4)),
    ("420x10096x80", (True, 128, 144, 4)),
    # N's 128-row tiles alone past a wave: M in tiles of <= 120, the deepest ring
    ("350x19520x384", (True, 128, 120, 6)),
    ("131x29459x112", (True, 128, 136, 5)),    # M <= 192 stays in one tile (the M 129-192 rule)
    # not these rules: NN, a ragged K, K past 384, N under 256
    ("253x11136x192:NN", (False, 128, 192, 4)),
    ("278x560x640", (False, 64, 128, 8)),
    ("703x80x224", (False, 64, 128, 8)),
])
def test_small_k_first_picks_are_swapped_with_the_transposed_staging(tpl, shape, first):
    """RESULTS 27 (l): at K <= 384 the swapped tiles with EPI tsmem lead; (SWAP, BM, BN, STAGES)."""
    k = tpl.heuristic(Shape.parse(shape), 90)[0]
    assert (k["SWAP"], k["BM"], k["BN"], k["STAGES"]) == first, k
    assert k["EPI"] == ("tsmem" if k["SWAP"] else k["EPI"]) and not tpl.check(k, Shape.parse(shape), 90)


@pytest.mark.parametrize("shape, bm, first, second", [
    ("200x11008x4096", 128, 192, 128),   # 2 x 58 = 116 tiles of 192 (one wave) against 2 x 86 = 172 of 128
    ("384x5120x5120", 128, 128, 192),    # 3 x 40 = 120 of 128 against 3 x 27 = 81 of 192
    ("512x6144x4096", 128, 192, 128),    # 4 x 32 = 128 of 192 against 4 x 48 = 192 of 128
    ("96x12288x4096", 64, 192, 128),     # 2 x 64 = 128 of 192 against 2 x 96 = 192 of 128
    ("128x8192x2048", 64, 128, 192),     # 2 x 64 = 128 of 128 against 2 x 43 = 86 of 192
])
def test_mid_widths_follow_the_last_waves_fill(tpl, shape, bm, first, second):
    """The mid rules take first the width (128 or 192) whose tiles fill their last wave of 132 SMs
    better, the other one later."""
    widths = [k["BN"] for k in tpl.heuristic(Shape.parse(shape), 90)
              if not k["SWAP"] and k["BM"] == bm and k["BN"] in (128, 192) and k["EPI"] == "smem"]
    assert widths[:2] == [first, second], widths


def test_derived_rings_are_the_deepest_that_fit(tpl):
    """A rule's derived STAGES is the deepest ring within 227 KiB beside the epilogue staging: one
    more stage would not fit (or the knob's values end)."""
    for s in ("777x1536x2880", "33x8192x2048", "200x11008x4096", "96x12288x4096", "300x2048x512"):
        shape = Shape.parse(s)
        for k in tpl.heuristic(shape, 90):
            deeper = [v for v in tpl.space.knobs["STAGES"].values if v > k["STAGES"]]
            if deeper and k["EPI"] == "smem" and k["SPLIT_K"] == 1 and k["STAGES"] >= 5:  # the fixed rings are 3, 4 and 7 (direct)
                assert tpl.check(dict(k, STAGES=deeper[0]), shape, 90), (s, k)


# ------------------------------------------------------------------------------ compiles
def _compile_one(source: str) -> str:
    try:
        cubin = nvrtc_compile(source)
    except RuntimeError as exc:  # NVRTC failed: its log becomes the reported error
        return str(exc)
    return "" if cubin[:4] == b"\x7fELF" else "not an ELF cubin"


def test_seeded_sample_compiles_for_sm90a(tpl):
    """Every knob set of a seeded sample (36 TN, up to 16 NN) compiles with NVRTC for sm_90a."""
    pytest.importorskip("cuda.bindings.nvrtc")
    # each layout's own sample: tile widths fitted to a dimension and SWAP are TN-only, so NN's
    # valid sets are rarer and rejection sampling finds fewer of them in its tries
    # (32 in TN: EPI tsmem needs SWAP, so it is the rarest value; 16 draws missed it once RAGGED's
    # knobs joined the space, 28 once RPRODUCERS did, 32 once the 4-CTA clusters did)
    tn, nn = (tpl.sample(random.Random(2026), Shape(4096, 4096, 4096, lay, "f32"), n) for lay, n in (("TN", 36), ("NN", 16)))
    assert len(tn) == 36 and len(nn) >= 8
    sets, layouts = tn + nn, ["TN"] * len(tn) + ["NN"] * len(nn)
    sources = [tpl.render(k, Shape(4096, 4096, 4096, lay, "f32"))[0] for k, lay in zip(sets, layouts)]
    # every schedule, epilogue and cluster value is among them
    for knob in ("SCHED", "EPI", "CLUSTER_M", "CONSUMERS", "PERSISTENT", "RASTER"):
        assert len({k[knob] for k in sets}) == len(tpl.space.knobs[knob].values), knob
    assert sum(k["SPLIT_K"] > 1 for k in sets) >= 4
    with ProcessPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        errors = list(pool.map(_compile_one, sources))
    bad = [(lay, k, e[:1500]) for lay, k, e in zip(layouts, sets, errors) if e]
    assert not bad, bad


@pytest.mark.parametrize("knobs, shape, width", [
    ({"SWAP": True, "BN": 104, "BM": 128, "STAGES": 4}, "200x11008x4096", 104),
    ({"SWAP": True, "BN": 72, "BM": 256, "STAGES": 3, "EPI": "direct"}, "777x1536x2880", 72),
    ({"BN": 72, "BM": 128, "SCHED": "pingpong", "STAGES": 4}, "777x1536x2880", 72),
    ({"SWAP": True, "CLUSTER_M": 2, "BN": 80, "BM": 128, "STAGES": 7}, "777x1536x2880", 80),
])
def test_fitted_widths_compile_to_one_wgmma_of_that_width(tpl, knobs, shape, width):
    """wgmma_n_any (the register list spliced by BN8) gives one HGMMA.64xBN per slab and K step,
    B in one TMA box, accumulators in registers."""
    source, _ = tpl.render(knobs, Shape.parse(shape))
    text = sass(nvrtc_compile(source))
    assert f"HGMMA.64x{width}x16.F32" in text and "UTMALDG.2D" in text
    assert "STL" not in text and "LDL" not in text


@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_sass_has_wgmma_tma_and_no_local_memory(tpl, layout):
    source, _ = tpl.render({}, Shape(4096, 4096, 4096, layout, "f32"))
    cubin = nvrtc_compile(source)
    text = sass(cubin)
    assert "HGMMA.64x256x16.F32" in text  # wgmma m64n256k16, fp32 accumulators
    assert "UTMALDG.2D" in text           # TMA tile loads
    assert "USETMAXREG" in text           # setmaxnreg took effect (register cap at entry)
    assert "STL" not in text and "LDL" not in text  # accumulators stayed in registers
    assert_register_pool_fits(text, cubin, 2)


def test_compile_candidate_accepts_the_defaults(tpl, tmp_path):
    """The evaluators' own path (static scan, isolated compile, ptxas stats, resource policy)."""
    evaluators = pytest.importorskip("evaluators")
    cand = tpl.candidate({}, Shape(2048, 2048, 8192, "NN", "f32"))
    res = evaluators.compile_candidate(cand, "sm_90a", cache_dir=tmp_path)
    assert res.ok, res.message
    (stats,) = res.kernels
    assert stats.spill_stores == 0 and stats.stack_frame == 0


@pytest.mark.parametrize("knobs", [{"BN": 128, "BM": 128, "STAGES": 4},
                                   {"SWAP": True, "BN": 112, "BM": 128, "STAGES": 4}])
def test_staged_epilogue_stores_as_wide_as_each_pitch_allows(tpl, knobs):
    """The staged epilogue has a store of each width a row pitch allows (16 bytes for N % 8 == 0,
    then 8, 4 and 2 for the ragged pitches, each a contiguous run per warp), swapped or not, and
    the extra loops keep the accumulators out of local memory."""
    source, _ = tpl.render(knobs, Shape.parse("777x3001x1000"))
    text = sass(nvrtc_compile(source))
    for width in ("STG.E.128", "STG.E.64", "STG.E ", "STG.E.U16"):
        assert width in text, width
    assert "STL" not in text and "LDL" not in text


@pytest.mark.parametrize("knobs, shape", [
    ({"SWAP": True, "BN": 72, "BM": 128, "STAGES": 8, "EPI": "tsmem"}, "776x1536x2880"),
    ({"SWAP": True, "BN": 112, "BM": 256, "STAGES": 3, "EPI": "tsmem"}, "777x3001x1000"),
    ({"SWAP": True, "BN": 72, "BM": 128, "SCHED": "pingpong", "STAGES": 6, "EPI": "tsmem"}, "777x1536x2880"),
])
def test_transposed_staging_uses_stmatrix_and_row_stores(tpl, knobs, shape):
    """EPI tsmem: the swapped C^T tile goes to shared memory through stmatrix .trans (STSM), and
    out along C's rows: 16-byte stores where M % 8 == 0, and then the 8-, 4- and 2-byte runs of a
    ragged M, with the accumulators kept out of local memory."""
    source, _ = tpl.render(knobs, Shape.parse(shape))
    text = sass(nvrtc_compile(source))
    assert "STSM.16.MT88" in text  # stmatrix .trans (M88 without it)
    for width in ("STG.E.128", "STG.E.64", "STG.E ", "STG.E.U16"):
        assert width in text, width
    assert "STL" not in text and "LDL" not in text


def test_transposed_staging_needs_swap_and_is_sized_for_its_layout(tpl):
    """tsmem is refused without SWAP, and its staging (BN rows of WM elements + 16 bytes) enters
    the shared-memory budget: the deepest ring shrinks or grows with it."""
    shape = Shape.parse("777x1536x2880")
    assert any("needs SWAP" in r for r in tpl.check({"EPI": "tsmem"}, shape))
    base = {"SWAP": True, "BN": 72, "BM": 128, "STAGES": 8}
    assert not tpl.check({**base, "EPI": "tsmem"}, shape)
    env_s = tpl.space.env({**base, "EPI": "smem"}, shape)
    env_t = tpl.space.env({**base, "EPI": "tsmem"}, shape)
    assert env_s["EPI_BYTES"] == 2 * 64 * (72 * 2 + 16) and env_t["EPI_BYTES"] == 2 * 72 * (64 * 2 + 16)


def test_cluster_variant_multicasts_without_gpu_fences_in_the_loop(tpl):
    """CLUSTER_M 2: B arrives by TMA multicast; releasing a stage in the peer CTA must not cost a
    MEMBAR.ALL.GPU per K block (a .release.cluster arrive did; only the two cluster barriers at
    kernel start and end may fence)."""
    knobs = {"CLUSTER_M": 2, "SCHED": "pingpong", "BN": 128, "STAGES": 4}
    source, _ = tpl.render(knobs, Shape(4096, 4096, 4096, "TN", "f32"))
    text = sass(nvrtc_compile(source))
    assert "UTMALDG.2D.MULTICAST" in text
    assert text.count("MEMBAR.ALL.GPU") <= 2, text.count("MEMBAR.ALL.GPU")


# ------------------------------------------------------------------------------ device
@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_swap_and_fitted_width_candidates_are_correct_on_the_gpu(tmp_path):
    """SWAP (C^T stored transposed, smem and direct epilogues) and tile widths fitted to M, through
    the whole evaluator: ragged M and N, generic candidates (checked at every alignment class and
    past the claim) beside specialised ones, and the swap rules' first picks."""
    pytest.importorskip("torch")
    from evaluators import LocalPool
    from populations import Status

    tpl = load_template(FOLDER)
    cases = [("200x11008x4096", {"SWAP": True, "BN": 104, "BM": 128, "STAGES": 4}, False),
             ("777x1536x2880", {"SWAP": True, "BN": 72, "BM": 128, "STAGES": 4, "EPI": "direct"}, False),
             ("421x6547x1000", {"SWAP": True, "BN": 88, "BM": 256, "STAGES": 3}, False),
             ("333x2050x520", {"SWAP": True, "BN": 112, "BM": 128, "STAGES": 4}, True),
             ("777x1536x2880", {"BN": 72, "BM": 128, "SCHED": "pingpong", "STAGES": 4}, False),
             ("118x31264x1624", {"BN": 120, "BM": 128, "STAGES": 4}, True),
             # CLUSTER_M 2 with B in slices of BN / 2 rows (an odd tile count over the kernel's M
             # leaves the second CTA of the last cluster past the edge), swapped and not
             ("777x1536x2880", {"SWAP": True, "CLUSTER_M": 2, "BN": 80, "BM": 128, "STAGES": 7}, False),
             ("421x6547x1000", {"SWAP": True, "CLUSTER_M": 2, "BN": 48, "BM": 64, "CONSUMERS": 1,
                                "STAGES": 10}, True),
             ("1000x3000x2000", {"CLUSTER_M": 2, "BN": 192, "BM": 128, "STAGES": 4}, False)]
    cands = [tpl.candidate(k, Shape.parse(s), specialize=not g) for s, k, g in cases]
    for s in ("777x1536x2880", "118x31264x1624"):
        shape = Shape.parse(s)
        cands += [tpl.candidate(k, shape) for k in tpl.heuristic(shape, 90) if k["SWAP"]][:1]
    with LocalPool(compile_workers=4, timers=("device",), log_dir=str(tmp_path)) as pool:
        evals = pool.evaluate(cands)
    bad = [(str(c.shapes[0]), c.knobs, e.status.value, e.message[:300])
           for c, e in zip(cands, evals) if e.status is not Status.OK]
    assert not bad, bad


def _all_ok_on_the_gpu(tpl, cases, tmp_path) -> None:
    """Each ``(shape, knobs, generic)`` case as a candidate through the whole evaluator: all ``ok``."""
    from evaluators import LocalPool
    from populations import Status

    cands = [tpl.candidate(k, Shape.parse(s), specialize=not g) for s, k, g in cases]
    with LocalPool(compile_workers=4, timers=("device",), log_dir=str(tmp_path)) as pool:
        evals = pool.evaluate(cands)
    bad = [(str(c.shapes[0]), c.knobs, e.status.value, e.message[:300])
           for c, e in zip(cands, evals) if e.status is not Status.OK]
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_ragged_pitch_epilogues_are_correct_on_the_gpu(tmp_path):
    """The staged epilogue's stores where C's row pitch is not a multiple of 8 (8-, 4- and 2-byte
    runs for N % 4 == 0, N even, N odd), not swapped and swapped, and the split-K reduce's 8-byte
    stores where M x N is not a multiple of 4; generic candidates meet every alignment class."""
    pytest.importorskip("torch")
    tpl = load_template(FOLDER)
    cases = [("1000x3004x520", {"BN": 128, "BM": 128, "STAGES": 4}, False),
             ("1000x3002x520", {"BN": 128, "BM": 128, "SCHED": "pingpong", "STAGES": 4}, False),
             ("1000x3001x520", {"BN": 128, "BM": 128, "STAGES": 4}, True),
             ("700x3004x1000", {"SWAP": True, "BN": 88, "BM": 128, "STAGES": 4}, False),
             ("700x3002x1000", {"SWAP": True, "BN": 88, "BM": 256, "STAGES": 3}, False),
             ("333x3001x1000", {"SWAP": True, "BN": 112, "BM": 128, "STAGES": 4}, True),
             ("129x257x4104", {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 8, "EPI": "direct"},
              False)]
    _all_ok_on_the_gpu(tpl, cases, tmp_path)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_ragged_k_read_in_place_is_correct_on_the_gpu(tmp_path):
    """RAGGED (A and B read in place through the raw ring): K odd, K % 8 == 2, 4 and 6 (every row
    shift), one K block and less, swapped and not, one and two consumers, one and two producer
    warpgroups, pingpong, split-K with empty shares, raw rings of 2-4, the ragged C pitches, generic candidates (every alignment class
    and past the claim, K down to 2). Through the whole evaluator."""
    pytest.importorskip("torch")
    tpl = load_template(FOLDER)
    r = {"RAGGED": 1}
    t = {"RAGGED": 1, "SWAP": True, "EPI": "tsmem"}
    cases = [("358x14070x3273", {**t, "BM": 128, "BN": 72, "STAGES": 3}, False),
             ("22x6490x2882", {**t, "BM": 64, "BN": 24, "CONSUMERS": 1, "STAGES": 4}, False),
             ("333x3001x1004", {**t, "BM": 128, "BN": 56, "STAGES": 2, "RSTAGES": 3}, True),
             ("1000x3000x1001", {**r, "BM": 128, "BN": 128, "STAGES": 2, "EPI": "direct"}, False),
             ("1000x3001x1006", {**r, "BM": 128, "BN": 64, "SCHED": "pingpong", "STAGES": 2, "EPI": "smem"}, True),
             ("77x300x45", {**r, "BM": 64, "BN": 64, "CONSUMERS": 1, "STAGES": 2, "RSTAGES": 4}, True),
             ("100x300x10001", {**r, "BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 2, "SPLIT_K": 8,
                                "EPI": "direct"}, True),
             ("40x3000x1001", {**t, "BM": 64, "BN": 40, "CONSUMERS": 1, "STAGES": 4, "RSTAGES": 3}, True),
             ("2000x3000x1001", {**r, "BM": 128, "BN": 128, "STAGES": 2, "RSTAGES": 2, "EPI": "direct",
                                 "PERSISTENT": False}, False),
             # a second producer warpgroup: two consumers, generic; one consumer with a stage of 128 rows
             # (fewer rows than the 256 producer threads: 9726cc3's guard)
             ("333x3001x1004", {**t, "RPRODUCERS": 2, "BM": 128, "BN": 56, "STAGES": 2, "RSTAGES": 3}, True),
             ("77x300x45", {**r, "RPRODUCERS": 2, "BM": 64, "BN": 64, "CONSUMERS": 1, "STAGES": 2, "RSTAGES": 4}, True)]
    _all_ok_on_the_gpu(tpl, cases, tmp_path)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_swapped_split_k_is_correct_on_the_gpu(tmp_path):
    """SWAP with split-K (partials stored transposed into C's M x N slices, the unswapped reduce):
    M in one tile and in two, M % 8 != 0, a ragged N (odd), a ragged K through the staged copies,
    more shares than a tile's K blocks leave (empty shares), a generic candidate. Through the
    whole evaluator."""
    pytest.importorskip("torch")
    tpl = load_template(FOLDER)
    t = {"SWAP": True, "EPI": "direct", "BM": 128}
    cases = [("176x4608x19456", {**t, "BN": 176, "SPLIT_K": 3, "STAGES": 5}, False),
             ("33x1552x10024", {**t, "BN": 40, "SPLIT_K": 8, "STAGES": 10}, False),
             ("300x1001x4096", {**t, "BN": 152, "SPLIT_K": 4, "STAGES": 5}, True),
             ("27x1103x4944", {**t, "BN": 32, "SPLIT_K": 12, "STAGES": 8}, False),
             ("100x3867x4089", {**t, "BN": 104, "SPLIT_K": 4, "STAGES": 6, "STAGE": "AB"}, False),
             ("100x3867x4089", {**t, "BN": 104, "SPLIT_K": 4, "STAGES": 2, "RAGGED": 1, "RPRODUCERS": 2}, False),
             ("20x700x640", {**t, "BN": 24, "SPLIT_K": 8, "STAGES": 4}, True)]
    _all_ok_on_the_gpu(tpl, cases, tmp_path)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_transposed_staging_is_correct_on_the_gpu(tmp_path):
    """EPI tsmem (stmatrix .trans staging of the swapped tile): M % 8 == 0 and the ragged M runs
    (M % 4, M even, M odd), coop with one and two consumers and pingpong, a cluster, a generic
    candidate (every alignment class and past the claim). Through the whole evaluator."""
    pytest.importorskip("torch")
    tpl = load_template(FOLDER)
    t = {"SWAP": True, "EPI": "tsmem"}
    cases = [("776x1536x2880", {**t, "BN": 72, "BM": 128, "STAGES": 8}, False),
             ("778x1536x2880", {**t, "BN": 72, "BM": 128, "SCHED": "pingpong", "STAGES": 6}, False),
             ("700x3004x1000", {**t, "BN": 88, "BM": 256, "STAGES": 3}, False),
             ("333x3001x1000", {**t, "BN": 112, "BM": 128, "STAGES": 4}, True),
             ("421x6544x9136", {**t, "BN": 48, "BM": 64, "CONSUMERS": 1, "STAGES": 10}, False),
             ("777x1536x2880", {**t, "CLUSTER_M": 2, "BN": 72, "BM": 128, "STAGES": 8}, False)]
    _all_ok_on_the_gpu(tpl, cases, tmp_path)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_clusters_share_operands_correctly_on_the_gpu(tmp_path):
    """B multicast by a cluster's CTAs in turns (B_ALT: BN / 2 not a multiple of 8 rows): an odd
    count of K blocks (K 2880: 45), swapped and not, a ragged C pitch on a generic candidate, a
    cluster tile whose second CTA is past M, one CTA per tile, and split-K (each K share starts
    its own turns); A's halves multicast along N (CLUSTER_N): swapped with the second CTA's tiles
    wholly past N, pingpong on a ragged pitch, NN with one consumer, split-K. Through the whole
    evaluator."""
    pytest.importorskip("torch")
    tpl = load_template(FOLDER)
    cases = [("777x1536x2880", {"SWAP": True, "CLUSTER_M": 2, "BN": 72, "BM": 128, "STAGES": 8}, False),
             ("333x3001x1000", {"SWAP": True, "CLUSTER_M": 2, "BN": 88, "BM": 128, "STAGES": 4}, True),
             ("1100x2000x2880", {"CLUSTER_M": 2, "BN": 104, "BM": 128, "STAGES": 4, "PERSISTENT": False}, False),
             ("300x1000x4104", {"CLUSTER_M": 2, "BN": 40, "BM": 64, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 3,
                                "EPI": "direct"}, False),
             ("777x1536x2880", {"SWAP": True, "CLUSTER_N": 2, "BN": 72, "BM": 128, "STAGES": 8}, False),
             ("1000x3001x520", {"CLUSTER_N": 2, "BN": 128, "BM": 128, "SCHED": "pingpong", "STAGES": 4}, True),
             ("777x1536x2880:NN", {"CLUSTER_N": 2, "BN": 128, "BM": 64, "CONSUMERS": 1, "STAGES": 6}, False),
             ("300x1000x4104", {"CLUSTER_N": 2, "BN": 40, "BM": 64, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 3,
                                "EPI": "direct"}, False)]
    _all_ok_on_the_gpu(tpl, cases, tmp_path)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_four_cta_clusters_share_operands_correctly_on_the_gpu(tmp_path):
    """CLUSTER_M / CLUSTER_N 4: B in quarters (16 rows) and in turns (BN 40), swapped, with cluster
    tiles whose last CTAs are past the matrix (22 weight tiles in 6 cluster tiles), a generic
    candidate at a ragged pitch; A in quarters along N, NN whole boxes four ways, split-K (each K
    share starts its own turns). Through the whole evaluator."""
    pytest.importorskip("torch")
    tpl = load_template(FOLDER)
    t = {"BM": 64, "CONSUMERS": 1, "STAGES": 12}
    cases = [("115x1408x1280", {**t, "SWAP": True, "CLUSTER_M": 4, "BN": 64, "EPI": "tsmem"}, False),
             ("115x1408x1280", {**t, "SWAP": True, "CLUSTER_M": 4, "BN": 40, "EPI": "tsmem"}, True),
             ("56x3008x4224", {**t, "SWAP": True, "CLUSTER_N": 4, "BN": 64, "EPI": "tsmem"}, False),
             ("1000x2000x4096:NN", {"CLUSTER_M": 4, "BN": 256, "BM": 128, "STAGES": 3, "EPI": "direct"}, False),
             ("300x1000x4104", {**t, "CLUSTER_M": 4, "BN": 64, "STAGES": 7, "SPLIT_K": 3, "EPI": "direct"}, False)]
    _all_ok_on_the_gpu(tpl, cases, tmp_path)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_split_k_candidates_are_correct_on_the_gpu(tmp_path):
    """Split-K candidates of every schedule through the whole evaluator. Generic candidates are
    also checked at small ragged instances (1x1x8, 7x13x24...) where SPLIT_K exceeds the K
    blocks and some units are empty: their partial tiles must be written as zeros (a first
    version left them unwritten: 53 of 53 split-K candidates incorrect on the H200)."""
    pytest.importorskip("torch")
    from evaluators import LocalPool
    from populations import Status

    tpl = load_template(FOLDER)
    cases = [("64x64x16384", {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 64}),
             ("256x256x4096", {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 16}),
             # the reduce's 8-lane path: SPLIT_K not a multiple of 8, M * N % 4 != 0 (C's last 1-3
             # elements), and a C of one partial block
             ("103x125x16768", {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 12}),
             ("118x96x16384", {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 24}),
             ("5x7x9000", {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 8}),
             ("129x257x520", {"BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 7, "SPLIT_K": 3}),
             ("77x4096x4096:NN", {"BM": 128, "BN": 128, "SCHED": "pingpong", "STAGES": 4, "SPLIT_K": 3}),
             ("512x512x4096", {"BM": 128, "BN": 256, "CLUSTER_M": 2, "STAGES": 3, "SPLIT_K": 4}),
             ("1000x1000x1000", {"BM": 128, "BN": 128, "PERSISTENT": False, "STAGES": 4, "SPLIT_K": 2})]
    cands = [tpl.candidate(dict(k, EPI="direct"), Shape.parse(s)) for s, k in cases]
    with LocalPool(compile_workers=4, timers=("device",), log_dir=str(tmp_path)) as pool:
        evals = pool.evaluate(cands)
    bad = [(s, e.status.value, e.message[:300]) for (s, _), e in zip(cases, evals) if e.status is not Status.OK]
    assert not bad, bad
