"""The streamk90 family (stream-K over the Hopper TMA + wgmma mainloop): applicability, knob refusals,
plans, the shared scheduler against its Python model, real compiles and a device check.

The scheduler is _prelude/streamk_sched.cuh, the streamk family's; its model and host comparison
live in test_template_streamk.py and run here on streamk90's rendered source (the text the
candidate carries). Compiles go through the evaluators' ``CompilePool`` (static scan, NVRTC for
sm_90a, ptxas resource policy) and must not spill. The GPU test (``-m gpu``) runs first picks and
ragged/tiny shapes through the whole evaluator, whose workspace fills (0xFF, 0x7F bytes, two runs)
the flags must survive.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from populations import Shape, Template, load_templates
from template_compile import compile_and_check, first_pick_jobs
from test_template_streamk import LLM_SAMPLE, POOR_WAVE, check_kernel_schedule

#: bench/RESULTS.md section 22's mid shapes (bench/streamk_check.py MID).
MID = ["128x8192x2048", "12288x64x12288", "64x4096x4096", "512x896x4864", "256x14336x4096", "64x3072x8192"]
#: Ragged shapes TMA can describe (K % 8 == 0; N % 8 == 0 in NN) and K down to one 64-deep block.
RAGGED = ["77x5000x1000", "300x4104x1032:NN", "200x129x4104", "65x8191x2056", "1000x72x3000:NN", "33x3000x776",
          "130x4100x56", "1x1x8", "7x13x24:NN"]


@pytest.fixture(scope="module")
def sk() -> Template:
    return load_templates(errors="warn")["streamk90"]


# ---- the schedule ---------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit) for a host build")
@pytest.mark.parametrize("dp", (0, 1, 2))
def test_kernel_schedule_matches_the_model(sk: Template, dp: int, tmp_path: Path) -> None:
    check_kernel_schedule(sk, dp, tmp_path)


def test_kernel_uses_the_shared_scheduler_and_roles(sk: Template) -> None:
    source, _ = sk.render({}, Shape.parse("512x4096x4096"))
    assert source.count("struct StreamkWalk") == 1 and "_prelude/streamk_sched.cuh" in source
    body = sk.source_text
    # producer and consumers walk the same units; peers publish, owners wait in CTA order
    assert body.count("walk.next(t, k0, k1)") == 2
    assert "sk_publish(flags + g)" in body and "sk_wait(flags + p)" in body and "flags[p] = 0u" in body
    assert "#include" not in body and "__host__" not in source


# ---- template metadata, refusals, plans ---------------------------------------------------
def test_applies_to_mid_shapes_and_poor_last_waves(sk: Template) -> None:
    assert sk.family == "B" and sk.min_arch == 90 and sk.arch_features == ("sm_90a",)
    assert set(sk.layouts) == {"TN", "NN"}
    for text in LLM_SAMPLE + POOR_WAVE + MID:
        assert sk.applicable(Shape.parse(text), 90), text
        assert not sk.applicable(Shape.parse(text), 80), text
    for text in ("4096x4096x4096", "1x4096x4096", "16x4096x4096", "512x4096x256", "64x768x768"):
        assert not sk.applicable(Shape.parse(text), 90), text
    for text in ("512x4096x1033", "300x4100x1032:NN"):  # ragged pitches: staged (populations/_staging.py)
        shape = Shape.parse(text)
        assert sk.applicable(shape, 90) and all(p["STAGE"] != "none" for p in sk.heuristic(shape, 90)), text
    assert {"tiling", "loops", "schedule", "splitk"} <= {k.axis for k in sk.space.knobs.values()}


REFUSED = [({"BM": 128, "BN": 256, "CONSUMERS": 2}, "512x4096x4096", "spill"),
           ({"BM": 64, "BN": 256, "CONSUMERS": 1, "STAGES": 2}, "512x4096x4096", "spill"),
           ({"BM": 64, "CONSUMERS": 2}, "512x4096x4096", "multiple of 64"),
           ({"BM": 128, "BN": 192, "STAGES": 6}, "512x4096x4096", "227 KiB"),
           ({}, "512x4096x1001", "K % 8"),
           ({}, "512x4100x1024:NN", "stage B"),
           ({"SMS": 108}, None, "not one of"),
           ({"DP": 3}, None, "not one of")]


@pytest.mark.parametrize("knobs,shape,reason", REFUSED, ids=[r[2] for r in REFUSED])
def test_invalid_combinations_refused_with_reason(sk: Template, knobs: dict, shape: str | None, reason: str) -> None:
    reasons = sk.check(knobs, Shape.parse(shape) if shape else None, 90)
    assert any(reason in r for r in reasons), reasons


def grid_ws(knobs: dict, shape: Shape) -> int:
    tiles = -(-shape.m // knobs["BM"]) * -(-shape.n // knobs["BN"])
    return min(knobs["SMS"], tiles * -(-shape.k // 64)) * (knobs["BM"] * knobs["BN"] * 4 + 4)


def test_plan_is_one_persistent_launch_with_slots_and_flags(sk: Template) -> None:
    rng = random.Random(7)
    for text in MID + LLM_SAMPLE[::4] + RAGGED:
        shape = Shape.parse(text)
        for knobs in sk.heuristic(shape, 90) + sk.sample(rng, shape, 4, arch=90):
            for specialize in (False, True):
                _, plan = sk.render(knobs, shape, specialize=specialize)
                launches, ws = plan.resolve(shape)
                staged = plan.staged_copies(shape)  # a ragged pitch: the pre-pass copy comes first
                assert [ln.kernel.startswith("evo_stage") for ln in launches] == [True] * (len(launches) - 1) + [False]
                launch = launches[-1]
                ws -= sum(c.nbytes for c in staged) + (staged[0].offset - grid_ws(knobs, shape) if staged else 0)
                tiles = -(-shape.m // knobs["BM"]) * -(-shape.n // knobs["BN"])
                grid = min(knobs["SMS"], tiles * -(-shape.k // 64))
                assert launch.kernel == "evo_streamk90" and launch.grid == (grid, 1, 1)
                assert launch.block == (128 * (knobs["CONSUMERS"] + 1), 1, 1) and launch.smem <= 232448
                assert launch.args == (("tmap", "tmA"), ("tmap", "tmB"), "C", "workspace", shape.m, shape.n, shape.k)
                assert ws == grid * (knobs["BM"] * knobs["BN"] * 4 + 4) < 2 ** 32
                assert not plan.zero_workspace  # the kernel clears its own flags
                assert plan.tensor_maps["tmA"].box == (knobs["BM"], 64) and plan.tensor_maps["tmB"].box == (64, 64)


def test_first_picks(sk: Template) -> None:
    first = lambda text: sk.heuristic(Shape.parse(text), 90)[0]  # noqa: E731
    assert (first("64x4096x4096")["BM"], first("64x4096x4096")["CONSUMERS"], first("64x4096x4096")["DP"]) == (64, 1, 0)
    assert (first("12288x64x12288")["BN"], first("12288x64x12288")["DP"]) == (64, 0)
    assert (first("128x8192x2048")["BM"], first("128x8192x2048")["DP"]) == (128, 0)
    assert first("512x4096x14336")["DP"] == 1
    for text in MID + LLM_SAMPLE + POOR_WAVE:
        picks = sk.heuristic(Shape.parse(text), 90)
        assert len(picks) >= 2 and all(k["SMS"] == 132 for k in picks[:2]), text


def test_seeding_offers_it_on_the_mid_shapes(sk: Template) -> None:
    from evo.search._seeding import seed_population

    templates = list(load_templates(errors="warn").values())
    for text in MID:
        pop = seed_population(Shape.parse(text), templates, 4, random.Random(0))
        ours = [c for c in pop if c.template == "streamk90"]
        assert len(ours) == 4 and ours[0].knobs == sk.heuristic(Shape.parse(text), "sm_90a")[0], text


# ---- compiles -------------------------------------------------------------------------------
def test_first_picks_compile_without_spills(sk: Template) -> None:
    jobs = first_pick_jobs({"streamk90": sk}, MID + LLM_SAMPLE + POOR_WAVE + RAGGED, samples=8,
                           sample_shape="300x4104x4104", archs=("sm_90a",))
    assert len(jobs) >= 16
    compile_and_check(jobs, archs=("sm_90a",))


def test_device_check_plans_valid_variants(sk: Template) -> None:
    """bench/streamk_check.py: every MID shape gets streamk90's picks and a DP x tile sweep, all valid."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import streamk_check as chk

    for text in chk.MID:
        s = Shape.parse(text)
        vs = chk.streamk90_variants(sk, s)
        assert vs[0][0] == "pick0" and len(vs) >= 5 and not any(sk.check(k, s, 90) for _, k in vs)
        assert {k["DP"] for _, k in vs} == {0, 1, 2}


# ---- device -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_candidates_are_correct_on_the_gpu(sk: Template, tmp_path: Path) -> None:
    """First picks and DP variants through the whole evaluator (fp32 reference, hostile workspace
    fills, two runs) at ragged shapes, K down to one block, both layouts, and tiles split over many
    CTAs (every tile streamed) or none (data-parallel waves)."""
    pytest.importorskip("torch")
    from evaluators import LocalPool
    from populations import Status

    cases = []
    for text in RAGGED + ["128x8192x2048", "12288x64x12288:NN", "512x896x4864", "64x3072x8192:NN"]:
        s = Shape.parse(text)
        picks = sk.heuristic(s, 90) or [sk.space.defaults()]
        for knobs in picks[:2] + [dict(picks[0], DP=dp) for dp in (0, 1, 2) if dp != picks[0]["DP"]]:
            if not sk.check(knobs, s, 90):
                cases.append((text, knobs))
    cands = [sk.candidate(k, Shape.parse(s)) for s, k in cases]
    with LocalPool(compile_workers=4, timers=("device",), log_dir=str(tmp_path)) as pool:
        evals = pool.evaluate(cands)
    bad = [(s, k, e.status.value, e.message[:300]) for (s, k), e in zip(cases, evals) if e.status is not Status.OK]
    assert not bad, bad
