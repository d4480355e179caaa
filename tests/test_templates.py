"""Seed-template machinery (populations._template/_knobs) and the sm80_mma and tiny families.

The machinery tests use small template folders written to tmp_path. The family tests load the
real folders, check plans at ragged shapes, refusals with reasons, render determinism, and
compile seeded samples of valid knob sets with the real compile path (evaluators'
``CompilePool``: static scan, NVRTC in isolated children, ptxas resource policy) for sm_80 and
sm_90a. ``-m slow`` sweeps 500+ knob sets.
"""
from __future__ import annotations

import random
import re
import textwrap
from pathlib import Path

import pytest

from populations import LaunchPlan, Shape, Template, TemplateError, load_template, load_templates
from populations._plan import MAX_SMEM

OURS = ("sm80_mma", "tiny")
RAGGED = ["1x1x1", "7x13x17", "129x257x65", "1000x1000x1000", "77x4096x4096", "8192x8192x8192", "64x8192x8192",
          "1x4096x3", "4095x1x4097"]

DEMO = '''
name = "demo"
family = "A"
description = "a test template"
min_arch = 80
layouts = ["TN", "NN"]
contracts = ["f32"]
source = "k.cu"

[knobs.BM]
values = [64, 128]
default = 128
axis = "tiling"

[knobs.WM]
values = [32, 64]
default = 64
axis = "tiling"

[knobs.SPLIT_K]
values = [1, 2, 4]
default = 1
axis = "splitk"

[knobs.EPI]
values = ["direct", "smem"]
default = "direct"
axis = "epilogue"

[knobs.FAST]
values = [false, true]
default = false
axis = "other"

[derived]
THREADS = "(BM // WM) * 32"
KT = "cdiv(K, 32)"
KT2 = "KT * 2"

[[constraints]]
expr = "BM % WM == 0"
reason = "BM must be a multiple of WM"

[[constraints]]
expr = "SPLIT_K <= KT"
reason = "each split needs a K tile"

[[constraints]]
expr = "not (EPI == EPI_smem and SPLIT_K > 1)"
reason = "smem epilogue only without split-K"

[[heuristic]]
when = "M * N <= 4096 and K >= 2048"
knobs = { BM = 64, SPLIT_K = 4 }

[[heuristic]]
when = "true"
knobs = { EPI = "smem" }

[plan]
workspace = "SPLIT_K * M * N * 4 if SPLIT_K > 1 else 0"

[[plan.launches]]
kernel = "evo_gemm"
grid = ["cdiv(N, BM)", "cdiv(M, BM)", "SPLIT_K"]
block = ["THREADS", 1, 1]
smem = "BM * 64 * min(KT2, 2)"
args = ["A", "B", "C", "workspace", "M", "N", "K", "lda", "ldb"]

[[plan.launches]]
kernel = "evo_reduce"
grid = ["cdiv(M * N, 256)", 1, 1]
block = [256, 1, 1]
args = ["workspace", "C", "M * N"]
when = "SPLIT_K > 1"
'''


def write_demo(root: Path, text: str = DEMO, name: str = "demo") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "template.toml").write_text(text)
    (folder / "k.cu").write_text('extern "C" __global__ void evo_gemm() {}\nextern "C" __global__ void evo_reduce() {}\n')
    return folder


@pytest.fixture()
def demo(tmp_path: Path) -> Template:
    return load_template(write_demo(tmp_path))


# ---- machinery ------------------------------------------------------------------------------
def test_render_header_and_generic_plan(demo: Template) -> None:
    shape = Shape.parse("100x200x300:NN")
    source, plan = demo.render({"BM": 64, "WM": 32, "SPLIT_K": 2}, shape)
    header = source.split('#line 1 "k.cu"')[0]
    for line in ("#define EVO_LAYOUT_NN 1", "#define BM 64", "#define SPLIT_K 2", "#define EPI_direct 0",
                 "#define EPI_smem 1", "#define EPI 0", "#define FAST 0", "#define THREADS 64"):
        assert line in header.splitlines()
    assert "EVO_M" not in header and "KT" not in header  # shape-dependent derived values are not folded
    assert source.endswith(demo.source_text)
    first = plan.launches[0]
    assert first.grid == ("cdiv(N, 64)", "cdiv(M, 64)", 2) and first.block == (64, 1, 1)
    assert "cdiv(K, 32)" in first.smem  # derived KT2 inlined as an expression of K
    assert [launch.kernel for launch in plan.launches] == ["evo_gemm", "evo_reduce"]
    launches, ws = plan.resolve(shape)
    assert launches[0].grid == (4, 2, 2) and launches[0].smem == 64 * 64 * 2 and ws == 2 * 100 * 200 * 4
    assert launches[0].args[-2:] == (300, 200)  # lda = K, ldb = N for NN


def test_specialize_folds_shape(demo: Template) -> None:
    shape = Shape.parse("100x200x300")
    source, plan = demo.render({"SPLIT_K": 1}, shape, specialize=True)
    assert {"#define EVO_M 100", "#define EVO_N 200", "#define EVO_K 300", "#define EVO_LAYOUT_TN 1"} <= set(source.splitlines())
    assert len(plan.launches) == 1  # the reduce launch exists only with SPLIT_K > 1
    launch = plan.launches[0]
    assert launch.grid == (2, 1, 1) and launch.smem == 128 * 64 * 2 and plan.workspace == 0
    assert launch.args == ("A", "B", "C", "workspace", "100", "200", "300", "300", "300")
    cand = demo.candidate({"SPLIT_K": 1}, shape, specialize=True)
    assert not cand.generic and cand.template == "demo" and cand.knobs["BM"] == 128 and cand.operator == "seed"


def test_render_is_deterministic(demo: Template) -> None:
    shape = Shape.parse("64x64x4096")
    a = demo.candidate({"BM": 64, "SPLIT_K": 4}, shape)
    b = demo.candidate({"SPLIT_K": 4, "BM": 64}, shape)
    assert a.id == b.id and a.source == b.source and a.plan == b.plan
    assert load_template(demo.path).candidate({"BM": 64, "SPLIT_K": 4}, shape).id == a.id


def test_check_reasons_and_refusal(demo: Template) -> None:
    assert demo.check({}) == []
    assert demo.check({"BM": 64, "WM": 64}) == []
    assert demo.check({"EPI": "smem", "SPLIT_K": 2}) == ["smem epilogue only without split-K"]
    assert demo.check({"BM": 96}) == ["BM=96 is not one of [64, 128]"]
    assert "unknown knob 'XX'" in demo.check({"XX": 1})[0]
    assert demo.check({"FAST": 1}) == ["FAST=1 is not one of [False, True]"]  # an int is not a bool
    # shape constraints are only checked with a shape
    assert demo.check({"SPLIT_K": 4}) == []
    assert demo.check({"SPLIT_K": 4}, Shape.parse("8x8x40")) == ["each split needs a K tile"]
    with pytest.raises(TemplateError, match="each split needs a K tile"):
        demo.render({"SPLIT_K": 4}, Shape.parse("8x8x40"))


def test_heuristic_and_sample(demo: Template) -> None:
    small_deep = Shape.parse("64x64x4096")
    picks = demo.heuristic(small_deep)
    assert picks[0]["BM"] == 64 and picks[0]["SPLIT_K"] == 4
    assert picks[1]["EPI"] == "smem" and picks[2] == demo.space.defaults()
    assert demo.heuristic(Shape.parse("64x64x16"))[0]["EPI"] == "smem"  # first rule invalid (SPLIT_K > KT): dropped
    one = demo.sample(random.Random(3), small_deep, 10)
    assert one == demo.sample(random.Random(3), small_deep, 10)
    assert len(one) == len({tuple(sorted(k.items())) for k in one})
    assert all(not demo.check(k, small_deep) for k in one)
    assert len(demo.sample(random.Random(0), small_deep, 1000)) < 2 * 2 * 3 * 2 * 2  # exhausts a small space


def test_applicable_and_arch(tmp_path: Path, demo: Template) -> None:
    assert demo.applicable(Shape.parse("8x8x8:NN"), "sm_80") and demo.applicable(Shape.parse("8x8x8"), 90)
    assert not demo.applicable(Shape.parse("8x8x8:f16"), 90)
    hopper = load_template(write_demo(tmp_path / "h", DEMO.replace('min_arch = 80', 'min_arch = 90\narch_features = ["sm_90a"]')
                                      .replace('applies', 'applies'), name="demo"))
    assert not hopper.applicable(Shape.parse("8x8x8"), "sm_80") and hopper.applicable(Shape.parse("8x8x8"), "sm_90a")
    assert hopper.compile_arch(90) == "sm_90a"


# A demo whose pipeline depends on the layout, whose shared-memory limit depends on the arch and
# whose split-K pick is derived from the tile count.
CONTEXT = DEMO.replace('KT2 = "KT * 2"', 'KT2 = "KT * 2"\nSMEM = "BM * 256 if LAYOUT_NN else BM * 128"').replace(
    '[[constraints]]\nexpr = "BM % WM == 0"',
    '[[constraints]]\nexpr = "ARCH >= 90 or SMEM <= 16384"\nreason = "too much smem for sm_80"\n\n'
    '[[constraints]]\nexpr = "BM % WM == 0"').replace(
    'knobs = { BM = 64, SPLIT_K = 4 }', 'knobs = { BM = 64 }\nderive = { SPLIT_K = "132 // (cdiv(M, BM) * cdiv(N, BM))" }')


def test_prelude_goes_between_header_and_source(tmp_path: Path) -> None:
    (tmp_path / "_prelude").mkdir()
    (tmp_path / "_prelude" / "common.cuh").write_text("__device__ int evo_common() { return 1; }\n")
    t = load_template(write_demo(tmp_path, DEMO.replace('source = "k.cu"', 'source = "k.cu"\nprelude = ["common.cuh"]')))
    source, _ = t.render({}, Shape.parse("64x64x64"))
    lines = source.splitlines()
    at = lines.index('#line 1 "_prelude/common.cuh"')
    assert lines[at - 1].startswith("#define ") and lines[at + 1] == "__device__ int evo_common() { return 1; }"
    assert lines[at + 2] == '#line 1 "k.cu"' and source.endswith(t.source_text)
    assert list(load_templates(tmp_path)) == ["demo"]  # _prelude is not a template
    for i, bad in enumerate(('["missing.cuh"]', '["../demo/k.cu"]')):
        with pytest.raises(TemplateError, match="is not a file of"):
            load_template(write_demo(tmp_path / f"bad{i}", DEMO.replace('source = "k.cu"', f'source = "k.cu"\nprelude = {bad}')))


def test_constraints_see_layout_and_arch(tmp_path: Path) -> None:
    t = load_template(write_demo(tmp_path, CONTEXT))
    tn, nn = Shape.parse("256x256x256"), Shape.parse("256x256x256:NN")
    assert t.check({"BM": 128}) == [] and t.check({"BM": 128}, nn) == []  # no arch: ARCH constraints wait
    assert t.check({"BM": 128}, nn, "sm_80") == ["too much smem for sm_80"]
    assert t.check({"BM": 128}, tn, "sm_80") == [] and t.check({"BM": 128}, nn, "sm_90a") == []
    assert t.check({"BM": 64}, nn, 80) == []
    # a layout-dependent derived value is a #define of the rendered (layout-specific) source
    assert "#define SMEM 32768" in t.render({"BM": 128}, nn)[0].splitlines()
    assert "#define SMEM 16384" in t.render({"BM": 128}, tn)[0].splitlines()
    assert t.sample(random.Random(1), nn, 10, arch=80) == [k for k in t.sample(random.Random(1), nn, 10, arch=80)
                                                          if not t.check(k, nn, 80)]
    assert all(k["BM"] == 64 for k in t.sample(random.Random(1), nn, 10, arch=80))


def test_heuristic_derive_snaps_to_the_domain(tmp_path: Path) -> None:
    t = load_template(write_demo(tmp_path, CONTEXT))
    # 1 tile of 64 x 64: 132 -> the largest SPLIT_K <= 132 is 4; 64 tiles: 132 // 64 = 2
    assert t.heuristic(Shape.parse("64x64x4096"))[0] == dict(t.space.defaults(), BM=64, SPLIT_K=4)
    assert t.heuristic(Shape.parse("64x64x4096"))[0]["SPLIT_K"] == 4
    assert t.heuristic(Shape.parse("32x16x4096"))[0]["SPLIT_K"] == 4
    bad = CONTEXT.replace('derive = { SPLIT_K', 'derive = { EPI')
    with pytest.raises(TemplateError, match="derive 'EPI' must be an int knob"):
        load_template(write_demo(tmp_path / "b", bad))


def test_named_rule_expressions_are_inlined_where_the_rules_use_them(tmp_path: Path) -> None:
    """``[heuristic_exprs]``: a name a rule's derive uses stands for its expression (names above
    it included), so the rule picks what the spelled-out expression picks; the name is nowhere
    in the knob space, the source or the plan."""
    named = CONTEXT.replace(
        'derive = { SPLIT_K = "132 // (cdiv(M, BM) * cdiv(N, BM))" }', 'derive = { SPLIT_K = "132 // TILES" }') + (
        '\n[heuristic_exprs]\nTILES_M = "cdiv(M, BM)"\nTILES = "TILES_M * cdiv(N, BM)"\n')
    spelled, short = load_template(write_demo(tmp_path / "a", CONTEXT)), load_template(write_demo(tmp_path / "b", named))
    for s in ("64x64x4096", "32x16x4096", "1000x3000x512", "128x64x100:NN"):
        assert short.heuristic(Shape.parse(s)) == spelled.heuristic(Shape.parse(s)), s
    assert "TILES" not in short.space.names and "TILES" not in short.render({}, Shape.parse("64x64x64"))[0]
    for i, (table, words) in enumerate((('TILES = "LATER * 2"\nLATER = "2"', "unknown name(s) ['LATER']"),  # only above
                         ('tiles = "cdiv(M, BM)"', "not an upper-case name"),
                         ('BM = "64"', "one the knob space already uses"),
                         ('TILES = 3', "must be a string"))):
        bad = CONTEXT + f"\n[heuristic_exprs]\n{table}\n"
        with pytest.raises(TemplateError, match=re.escape(words)):
            load_template(write_demo(tmp_path / f"bad{i}", bad))


def test_named_shape_expressions_are_inlined_into_a_rules_condition(tmp_path: Path) -> None:
    """A ``[heuristic_exprs]`` name that comes out as shape names only may stand in a rule's ``when``
    (the rule fires where the spelled-out condition does); one that stands for knob-level terms is
    refused there, as the spelled-out terms are."""
    named = CONTEXT.replace('when = "M * N <= 4096 and K >= 2048"', 'when = "OUTPUTS <= 4096 and DEEP"') + (
        '\n[heuristic_exprs]\nOUTPUTS = "M * N"\nDEEP = "K >= 2048"\n')
    spelled, short = load_template(write_demo(tmp_path / "a", CONTEXT)), load_template(write_demo(tmp_path / "b", named))
    for s in ("64x64x4096", "32x16x4096", "64x64x1024", "1000x3000x512"):
        assert short.heuristic(Shape.parse(s)) == spelled.heuristic(Shape.parse(s)), s
    bad = CONTEXT.replace('when = "M * N <= 4096 and K >= 2048"', 'when = "TILES < 4"') + (
        '\n[heuristic_exprs]\nTILES = "cdiv(M, BM)"\n')
    with pytest.raises(TemplateError, match=re.escape("unknown name(s) ['BM']")):
        load_template(write_demo(tmp_path / "bad", bad))


BROKEN = [
    ('name = "demo"', 'name = "other"', "must equal the folder name"),
    ('description = "a test template"', 'descriptoin = "x"', "unknown key(s) ['descriptoin']"),
    ('default = 128\naxis = "tiling"', 'default = 96\naxis = "tiling"', "default 96 is not one of its values"),
    ('axis = "splitk"', 'axis = "splitk"\nstep = 2', "unknown key(s) ['step'] in [knobs.SPLIT_K]"),
    ('axis = "splitk"', 'axis = "split"', "axis 'split' is not one of"),
    ('KT = "cdiv(K, 32)"', 'KT = "cdiv(K, BQ)"', "unknown name(s) ['BQ']"),
    ('KT = "cdiv(K, 32)"', 'KT = "__import__(1)"', "may be called"),
    ('reason = "BM must be a multiple of WM"', 'reason = ""', "needs a reason"),
    ('block = ["THREADS", 1, 1]', 'block = ["KT", 1, 1]', "block must be knob-only"),
    ('knobs = { BM = 64, SPLIT_K = 4 }', 'knobs = { BM = 65 }', "outside its domain: BM=65"),
    ('when = "SPLIT_K > 1"', 'when = "M > 1"', "unknown name(s) ['M']"),
    ('when = "SPLIT_K > 1"', 'when = "ARCH > 1"', "unknown name(s) ['ARCH']"),
    ('KT = "cdiv(K, 32)"', 'KT = "cdiv(K, ARCH)"', "unknown name(s) ['ARCH']"),
    ('source = "k.cu"', 'source = "missing.cu"', "does not exist"),
    ('source = "k.cu"', 'source = "k.cu"\nlead = "BM > 2"', "unknown name(s) ['BM']"),  # a lead rule names the shape only
    ('source = "k.cu"', 'source = "k.cu"\ntrail = "WARPS > 2"', "unknown name(s) ['WARPS']"),  # so does a trail rule
    ('family = "A"', 'family = "Z"', "family 'Z'"),
    ('[plan]', '[plan]\nstreams = 2', "unknown key(s) ['streams'] in [plan]"),
    ('grid = ["cdiv(N, BM)"', 'grid = ["cdiv(N, BMX)"', "unknown name(s) ['BMX']"),
    ('min_arch = 80', 'min_arch = 80\n[', "not valid TOML"),
    ('[knobs.FAST]', '[knobs.EPI_smem]\nvalues = [1]\ndefault = 1\n[knobs.FAST]', "value name EPI_smem clashes"),
]


@pytest.mark.parametrize("old,new,message", BROKEN, ids=[b[2][:30] for b in BROKEN])
def test_invalid_toml_is_refused_naming_the_file(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in DEMO
    folder = write_demo(tmp_path, DEMO.replace(old, new, 1))
    with pytest.raises(TemplateError) as info:
        load_template(folder)
    assert str(folder / "template.toml") in str(info.value) and message in str(info.value)


def test_load_templates_raise_or_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_demo(tmp_path)
    (tmp_path / "half_written").mkdir()  # a folder another engineer has only started
    (tmp_path / "_private").mkdir()
    with pytest.raises(TemplateError, match="half_written/template.toml: missing"):
        load_templates(tmp_path)
    got = load_templates(tmp_path, errors="warn")
    assert list(got) == ["demo"]
    assert "skipping template half_written" in capsys.readouterr().err


# ---- the real families ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def families() -> dict[str, Template]:
    templates = load_templates(errors="warn")
    assert set(OURS) <= set(templates)
    return {n: templates[n] for n in OURS}


def test_family_metadata(families: dict[str, Template]) -> None:
    a, t = families["sm80_mma"], families["tiny"]
    assert (a.family, t.family) == ("A", "T") and a.min_arch == t.min_arch == 80
    assert set(a.layouts) == set(t.layouts) == {"TN", "NN"}
    axes = {k.axis for k in a.space.knobs.values()}
    assert {"tiling", "loops", "padding", "swizzle", "splitk", "epilogue"} <= axes
    assert t.applicable(Shape.parse("64x8192x8192"), "sm_80") and t.applicable(Shape.parse("8192x100x8192"), 90)
    assert not t.applicable(Shape.parse("129x129x1024"), 90)  # past 128 both ways, K past the short-K rule
    assert not t.applicable(Shape.parse("2048x2048x64"), 90)  # short K, but more than a wave of 16x8 tiles
    assert t.applicable(Shape.parse("129x129x64"), 90) and t.heuristic(Shape.parse("309x216x274"), 90)[0] == dict(
        TM=16, TN=8, WARPS=8, KU=2, SPLIT_K=1, CLUSTER=1)  # short K on a small output: one 16x8 fragment per warp
    assert a.applicable(Shape.parse("1x1x1"), "sm_80") and not a.applicable(Shape.parse("8x8x8:f16"), 90)


@pytest.mark.parametrize("name", OURS)
def test_plans_resolve_at_ragged_shapes(families: dict[str, Template], name: str) -> None:
    t = families[name]
    rng = random.Random(11)
    for text in RAGGED:
        for layout in ("TN", "NN"):
            shape = Shape.parse(f"{text}:{layout}")
            if not t.applicable(shape, 90):
                continue
            picks = t.heuristic(shape)
            assert picks, f"{name} has no first pick at {shape}"
            for knobs in picks + t.sample(rng, shape, 6):
                for specialize in (False, True):
                    _, plan = t.render(knobs, shape, specialize=specialize)
                    launches, ws = plan.resolve(shape)
                    split = knobs["SPLIT_K"]
                    assert launches[0].grid[2] == split * knobs.get("CLUSTER", 1) and launches[0].smem <= MAX_SMEM
                    assert ws == (split * shape.m * shape.n * 4 if split > 1 else 0)
                    assert [launch.kernel for launch in launches][1:] == (["evo_splitk_reduce"] if split > 1 else [])
                    # _prelude/splitk_reduce.cuh: 4 elements per group of SK_LANES threads (8 from split-K 8 on)
                    lanes = 8 if split >= 8 else 1
                    assert split == 1 or launches[-1].grid[0] * (256 // lanes) * 4 >= shape.m * shape.n  # covers C
                    assert split == 1 or (launches[-1].grid[0] - 1) * (256 // lanes) * 4 < shape.m * shape.n  # no idle block
                    if specialize:
                        assert LaunchPlan.from_dict(plan.to_dict()) == plan and isinstance(plan.workspace, int)


def test_sm80_tiles_cover_the_output(families: dict[str, Template]) -> None:
    t = families["sm80_mma"]
    for text in RAGGED:
        shape = Shape.parse(text)
        for knobs in t.heuristic(shape):
            (first, *_), _ = t.render(knobs, shape)[1].resolve(shape)
            assert first.grid[0] * knobs["BM"] * knobs["BN"] >= shape.m * shape.n
            assert first.grid[0] == -(-shape.m // knobs["BM"]) * -(-shape.n // knobs["BN"])


REFUSED = [
    ("sm80_mma", {"BM": 32, "WM": 64}, None, "whole number of warp tiles"),
    ("sm80_mma", {"WN": 16, "WM": 16, "BM": 256, "BN": 256}, None, "2 to 16 warps"),
    ("sm80_mma", {"WM": 128, "WN": 64, "BM": 128, "BN": 128}, None, "255 registers"),
    ("sm80_mma", {"BM": 256, "BN": 256, "BK": 64, "STAGES": 5, "WM": 64, "WN": 64, "SWIZZLE": 1}, "4096x4096x4096",
     "227 KiB"),  # shared memory depends on the layout: checked once a shape is known
    ("sm80_mma", {"SWIZZLE": 1, "PAD": 8}, None, "XOR swizzle and row padding"),
    ("sm80_mma", {"SPLIT_K": 2, "EPI": "smem"}, None, "staged epilogue"),
    ("sm80_mma", {"SPLIT_K": 16}, "64x64x100", "every K split needs at least one"),
    ("sm80_mma", {"SPLIT_K": 16, "BM": 64, "BN": 64, "WM": 32, "WN": 32}, "8200x8192x8192", "workspace"),
    ("tiny", {"TM": 64, "TN": 64, "WARPS": 8}, None, "reduction buffer"),
    ("tiny", {"TM": 64, "TN": 64, "KU": 4}, None, "255 registers"),
    ("tiny", {"SPLIT_K": 8}, "16x16x64", "at least one k16 step"),
    ("tiny", {"SPLIT_K": 128}, None, "not one of"),
]


def test_sm80_smem_follows_layout_and_arch(families: dict[str, Template]) -> None:
    """NN's B tile is BK x (BN + PAD), TN's BN x (BK + PAD): each layout asks for its own; sm_80
    refuses more than its 163 KiB, sm_90 allows 227 KiB."""
    t = families["sm80_mma"]
    knobs = {"BM": 128, "BN": 256, "BK": 64, "WM": 64, "WN": 64, "STAGES": 4, "PAD": 8, "SWIZZLE": 0}
    tn, nn = Shape.parse("4096x4096x4096"), Shape.parse("4096x4096x4096:NN")
    smem = {lay: t.render(knobs, s)[1].resolve(s)[0][0].smem for lay, s in (("TN", tn), ("NN", nn))}
    assert smem == {"TN": 4 * (128 * 72 + 256 * 72) * 2, "NN": 4 * (128 * 72 + 64 * 264) * 2}
    assert t.check(knobs, tn, 90) == [] and any("163 KiB" in r for r in t.check(knobs, tn, "sm_80"))
    assert t.check(dict(knobs, STAGES=2), tn, 80) == []


@pytest.mark.parametrize("name,knobs,shape,reason", REFUSED, ids=[r[3][:24] for r in REFUSED])
def test_invalid_combinations_refused_with_reason(families: dict[str, Template], name: str, knobs: dict,
                                                  shape: str | None, reason: str) -> None:
    t = families[name]
    s = Shape.parse(shape) if shape else None
    reasons = t.check(knobs, s)
    assert any(reason in r for r in reasons), reasons
    with pytest.raises(TemplateError, match="invalid knobs"):
        t.render(knobs, s or Shape.parse("4096x4096x4096"))


@pytest.mark.parametrize("name", OURS)
def test_heuristics_are_shape_aware(families: dict[str, Template], name: str) -> None:
    t = families[name]
    if name == "sm80_mma":
        assert t.heuristic(Shape.parse("64x64x8192"))[0]["SPLIT_K"] > 1  # small M*N, deep K: split-K
        big = t.heuristic(Shape.parse("8192x8192x8192"))[0]
        assert big["SPLIT_K"] == 1 and big["BM"] * big["BN"] >= 128 * 128
        # few tiles, deep K: about two CTAs per SM (<= 264), unless K runs out (>= 2 BK tiles per
        # split) or the domain does (64)
        for text, want in (("64x64x16384", 64), ("256x256x4096", 16), ("256x512x8192", 8), ("128x128x1024", 8)):
            first = t.heuristic(Shape.parse(text))[0]
            tiles = t.space.env(first, Shape.parse(text))["TILES"]
            assert first["SPLIT_K"] == want and tiles * want <= 264, (text, first)
    else:
        assert t.heuristic(Shape.parse("64x64x64"))[0]["TM"] * t.heuristic(Shape.parse("64x64x64"))[0]["TN"] <= 32 * 32
        assert t.heuristic(Shape.parse("32x32x16384"))[0]["SPLIT_K"] > 1
        # deep K: split until each CTA does about one round of WARPS x KU k16 steps, <= 528 CTAs
        for text, tile, split in (("64x64x4096", 32, 16), ("64x64x16384", 32, 64), ("128x64x8192", 32, 32),
                                  ("128x128x1024", 16, 2)):
            first = t.heuristic(Shape.parse(text))[0]
            ctas = t.space.env(first, Shape.parse(text))["TILES"] * first["SPLIT_K"]
            assert (first["TM"], first["SPLIT_K"]) == (tile, split) and ctas <= 528, (text, first)


# ---- compiles (real NVRTC through evaluators.CompilePool) -------------------------------------
def _compile_sample(families: dict[str, Template], per_family: int, seed: int) -> list[tuple[str, dict, str, object]]:
    from evaluators import CompilePool

    rng = random.Random(seed)
    jobs = []
    for name in OURS:
        t = families[name]
        # each knob set at the first shape it is valid at (big tiles need big shapes, big splits
        # deep K and a workspace under 4 GiB); a set valid at none of them is not one a run could
        # evaluate here and is skipped, so only sets Template.check accepts are compiled
        texts = (["1000x1000x1000", "2048x2048x8192", "8192x8192x8192"] if name == "sm80_mma"
                 else ["77x4096x520", "120x2048x8192", "8192x120x8192"])
        found = 0
        for knobs in t.sample(rng, None, per_family * 4):
            if found == per_family:
                break
            layout = ("TN", "NN")[found % 2]
            arch = ("sm_90a", "sm_80")[(found // 2) % 2]
            shape = next((s for s in (Shape.parse(f"{x}:{layout}") for x in texts) if not t.check(knobs, s)), None)
            if shape is None:
                continue
            if t.check(knobs, shape, arch):  # the arch's own limits (sm_80: 163 KiB of shared memory)
                arch = "sm_90a"
            assert not t.check(knobs, shape, arch), (knobs, shape, arch)
            jobs.append((name, knobs, arch, t.candidate(knobs, shape)))
            found += 1
        assert found == per_family, f"{name}: only {found} of {per_family} sampled knob sets are valid at {texts}"
    with CompilePool(workers=2, use_cache=False) as pool:
        futures = [pool.submit(cand, arch) for _, _, arch, cand in jobs]
        return [(n, k, a, f.result()) for (n, k, a, _), f in zip(jobs, futures)]


def _assert_compiled(results: list) -> None:
    failed = [(n, a, k, r.status, r.message[-600:]) for n, k, a, r in results if not r.ok]
    assert not failed, failed
    for name, _, _, r in results:
        assert ("evo_gemm" if name == "sm80_mma" else "evo_tiny") in {k.name for k in r.kernels}
    # ptxas sometimes parks one or two values in local memory outside the main loop even with
    # registers to spare (seen: 4 bytes at 48 registers); a register-starved tile spills far more.
    spilled = [(name, arch, knobs, r.kernels) for name, knobs, arch, r in results
               if any(k.spill_stores > 32 or k.stack_frame > 64 for k in r.kernels)]
    assert not spilled, spilled


def test_sampled_valid_knob_sets_compile(families: dict[str, Template]) -> None:
    results = _compile_sample(families, 30, seed=2026)
    assert sum(n == "sm80_mma" for n, *_ in results) >= 30 and sum(n == "tiny" for n, *_ in results) >= 30
    assert {a for _, _, a, _ in results} == {"sm_80", "sm_90a"}
    _assert_compiled(results)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sweep_compiles(families: dict[str, Template]) -> None:
    results = _compile_sample(families, 260, seed=7)  # ~520 compiles: ~10 min on two busy cores
    assert len(results) >= 500
    _assert_compiled(results)


def test_uncomputable_derived_value_is_a_reason(tmp_path: Path) -> None:
    t = load_template(write_demo(tmp_path, DEMO.replace('KT2 = "KT * 2"', 'KT2 = "KT * 2"\nQ = "64 // (BM - 64)"')))
    assert t.check({"BM": 128}) == []
    assert t.check({"BM": 64}) == ["derived Q cannot be computed: division by zero in '64 // (BM - 64)'"]
    assert t.check({"BM": 64, "WM": 32, "EPI": "smem", "SPLIT_K": 2}) == ["smem epilogue only without split-K"]


def test_first_pick_rules_are_over_shape_features_not_shape_values() -> None:
    """No [[heuristic]] rule, ``applies``, ``lead`` or ``trail`` of a shipped template picks one value of
    M, N or K (``N == 4096``): first picks come from rules over shape features (bounds, ratios,
    tile and wave counts), never from a benchmark's own shapes. M == 1 (a single token) is a class,
    not a shape; the check is for values of two digits or more."""
    keyed = re.compile(r"\b[MNK]\s*(==|!=)\s*\d{2,}|\d{2,}\s*(==|!=)\s*[MNK]\b")
    bad = []
    for t in load_templates().values():
        texts = [t.applies, t.lead, t.trail]
        texts += [when for when, _, _ in t.heuristics] + [e for _, _, derive in t.heuristics for e in derive.values()]
        bad += [(t.name, x) for x in texts if isinstance(x, str) and keyed.search(x)]
    assert not bad, bad


def test_stage_bypass_relaxes_the_staging_rules_only_where_it_holds(tmp_path: Path) -> None:
    """``stage_bypass`` (with ``stageable``) names knob sets that read ragged pitches in place: there
    an unstaged ragged K is valid and staging is refused, elsewhere a ragged K must be staged; the
    fit rule stages only outside the bypass. Without ``stageable`` the key is an error."""
    text = DEMO.replace('source = "k.cu"', 'source = "k.cu"\nstageable = true\nstage_bypass = "FAST"')
    (tmp_path / "a" / "_prelude").mkdir(parents=True)
    (tmp_path / "a" / "_prelude" / "stage.cuh").write_text('extern "C" __global__ void evo_stage() {}\n')
    t = load_template(write_demo(tmp_path / "a", text))
    ragged = Shape.parse("100x200x1001")
    assert not t.check({"FAST": True}, ragged)
    assert any("in place" in r for r in t.check({"FAST": True, "STAGE": "AB"}, ragged))
    assert any("16 bytes" in r for r in t.check({"FAST": False}, ragged))
    assert t.fitted({"FAST": True}, ragged)["STAGE"] == "none"
    assert t.fitted({"FAST": False}, ragged)["STAGE"] == "AB"
    with pytest.raises(TemplateError, match="only with stageable"):
        load_template(write_demo(tmp_path / "b", DEMO.replace('source = "k.cu"', 'source = "k.cu"\nstage_bypass = "FAST"')))
