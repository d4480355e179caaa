"""The stream-K family (streamk): applicability, knob refusals, plans, the persistent schedule's
iteration partition, and real compiles.

The partition is pure integer arithmetic, so it has a Python model here (:func:`split`,
:func:`begin`, :func:`segments`); its properties are checked on many (tiles, iterations, CTAs, DP)
cases, and the kernel's own ``streamk_split`` / ``streamk_begin`` (the text between kernel.cu's
schedule markers, taken from the rendered source) are compiled by nvcc into a host program and
compared with the model. Compiles (NVRTC through ``CompilePool``, sm_90a and sm_80, zero spills) cover every
first pick on the shapes of the LLM-layer sample the template applies to. GPU correctness and speed
are bench/streamk_check.py's (device).
"""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from populations import Shape, Template, load_templates
from template_compile import compile_and_check, first_pick_jobs

#: The shapes of the issue-26 LLM-layer sample (bench/_llm_sample.py: sample(candidate_pool(rows)) over
#: ../shared/shapes/llm_layers.csv, seed 26) that streamk applies to, written out so the test needs no
#: file outside the repository; then the two poor-last-wave shapes of open-questions and ragged ones.
LLM_SAMPLE = ["512x768x768", "512x768x3072", "64x50257x768", "512x50257x768", "512x3072x576", "512x576x1536",
              "4096x1152x896", "512x896x896", "512x9728x896", "64x151936x896", "64x4096x2304", "64x2304x2304",
              "512x18432x2304", "512x2304x9216", "512x256000x2304", "64x9216x3072", "512x3072x3072",
              "512x16384x3072", "64x3072x8192", "512x6144x4096", "64x4096x14336", "512x4096x14336",
              "64x128256x4096", "128x50257x768"]
POOR_WAVE = ["12288x64x12288", "128x8192x2048"]
RAGGED = ["77x5000x1001", "300x4100x1030:NN", "200x129x4100", "65x8191x2056"]


@pytest.fixture(scope="module")
def sk() -> Template:
    return load_templates(errors="warn")["streamk"]


# ---- the schedule's model ---------------------------------------------------------------------
def split(tiles: int, ctas: int, dp: int) -> tuple[int, int]:
    """(data-parallel tiles, stream-K tiles): DP 0 streams all, 1 all but the last full wave's
    worth stays data-parallel, 2 only the remainder is streamed (kernel.cu: streamk_split)."""
    full = tiles // ctas
    waves = {0: 0, 1: max(full - 1, 0), 2: full}[dp]
    return waves * ctas, tiles - waves * ctas


def begin(g: int, iters_total: int, ctas: int) -> int:
    """CTA g's first stream-K iteration (kernel.cu: streamk_begin)."""
    return g * iters_total // ctas


def segments(g: int, sk_tiles: int, iters: int, ctas: int) -> list[tuple[int, int, int]]:
    """(stream-K tile, first, end) iteration ranges of CTA g, in the order it runs them."""
    total = sk_tiles * iters
    it, end, out = begin(g, total, ctas), begin(g + 1, total, ctas), []
    while it < end:
        s = it // iters
        k0, k1 = it - s * iters, min(end - s * iters, iters)
        out.append((s, k0, k1))
        it = s * iters + k1
    return out


CASES = [(t, i, g, dp) for t in (1, 7, 96, 128, 131, 132, 133, 264, 400, 1000) for i in (1, 3, 16, 64, 384)
         for g in (1, 108, 132, 264, 528) for dp in (0, 1, 2) if g <= t * i]


@pytest.mark.parametrize("dp", (0, 1, 2))
def test_partition_covers_each_iteration_once_and_balances(dp: int) -> None:
    for tiles, iters, ctas, d in CASES:
        if d != dp:
            continue
        dp_tiles, sk_tiles = split(tiles, ctas, dp)
        assert dp_tiles % ctas == 0 and dp_tiles + sk_tiles == tiles and sk_tiles >= 0
        if dp == 2:
            assert sk_tiles == tiles % ctas
        if dp == 1 and tiles >= ctas:
            assert ctas <= sk_tiles < 2 * ctas
        covered: dict[int, list[tuple[int, int, int]]] = {}
        for g in range(ctas):
            segs = segments(g, sk_tiles, iters, ctas)
            work = sum(k1 - k0 for _, k0, k1 in segs)
            # even shares: every CTA within one iteration of S / G
            assert sk_tiles * iters // ctas <= work <= -(-sk_tiles * iters // ctas)
            # only a CTA's first segment can start inside a tile (one workspace slot per CTA)
            assert all(k0 == 0 for _, k0, _ in segs[1:])
            for s, k0, k1 in segs:
                assert 0 <= k0 < k1 <= iters
                covered.setdefault(s, []).append((k0, k1, g))
        assert sorted(covered) == list(range(sk_tiles))
        for s, parts in covered.items():
            parts.sort()
            # the tile's iterations exactly once, owner (k0 == 0) first, peers the next non-empty CTAs
            assert parts[0][0] == 0 and parts[-1][1] == iters
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            owner = parts[0][2]
            peers = [g for _, _, g in parts[1:]]
            assert peers == sorted(peers) and all(p > owner for p in peers)
            # the owner's peer walk in the kernel: CTAs after it whose range begins inside the tile
            total = sk_tiles * iters
            walked = [p for p in range(owner + 1, ctas) if begin(p, total, ctas) < (s + 1) * iters
                      and begin(p, total, ctas) != begin(p + 1, total, ctas)]
            assert walked == peers


def walk(g: int, tiles: int, iters: int, ctas: int, dp: int) -> list[tuple[int, int, int, list[int]]]:
    """CTA g's units in order, (tile, k0, k1, peers it waits for): its stream-K segments (tiles numbered
    after the data-parallel ones), then data-parallel tiles g, g + G, ... (StreamkWalk::next); the
    peers of an owner of a split tile are the CTAs after it whose non-empty range begins inside it."""
    dp_tiles, sk_tiles = split(tiles, ctas, dp)
    total = sk_tiles * iters
    out = []
    for s, k0, k1 in segments(g, sk_tiles, iters, ctas):
        peers = [p for p in range(g + 1, ctas) if begin(p, total, ctas) < (s + 1) * iters
                 and begin(p, total, ctas) != begin(p + 1, total, ctas)] if k0 == 0 and k1 < iters else []
        out.append((dp_tiles + s, k0, k1, peers))
    out += [(t, 0, iters, []) for t in range(g, dp_tiles, ctas)]
    return out


def host_program(t: Template, dp: int, cases: list[tuple[int, int, int]]) -> str:
    """The schedule of the rendered kernel source (real knob set, DP = dp; the text between its
    ``schedule: begin`` and ``schedule: end`` markers, _prelude/streamk_sched.cuh's, with SK_FN made
    ``inline``) plus a host main that prints, per (tiles, iters, ctas), the split and every CTA's begin,
    then one line per CTA: its units ``tile k0 k1 [peers];``."""
    source, _ = t.render(dict(t.space.defaults(), DP=dp), Shape.parse("512x4096x4096"))
    header = source[:source.index("#line 1 ")]  # the renderer's knob #defines (DP among them)
    defines = [line for line in header.splitlines() if line.startswith("#define ")]
    schedule = source[source.index("// ---- schedule: begin"):source.index("// ---- schedule: end")]
    assert "streamk_split" in schedule and "streamk_begin" in schedule and "struct StreamkWalk" in schedule
    lines = ["#include <cstdio>", "#define SK_FN inline", *defines, schedule, "int main() {", "  int d, s, t, k0, k1;"]
    for tiles, iters, ctas in cases:
        lines += [f"  streamk_split({tiles}, {ctas}, d, s);", '  printf("%d %d", d, s);',
                  f"  for (int g = 0; g <= {ctas}; ++g) printf(\" %d\", streamk_begin(g, s * {iters}, {ctas}));",
                  '  printf("\\n");',
                  f"  for (int g = 0; g < {ctas}; ++g) {{",
                  f"    StreamkWalk w({tiles}, {iters}, {ctas}, g);",
                  "    while (w.next(t, k0, k1)) {",
                  '      printf("%d %d %d", t, k0, k1);',
                  f"      if (k0 == 0 && k1 < {iters})",
                  '        for (int p = w.next_peer(g, t); p >= 0; p = w.next_peer(p, t)) printf(" %d", p);',
                  '      printf(";");', "    }", '    printf("\\n");', "  }"]
    lines.append("  return 0;\n}\n")
    return "\n".join(lines)


HOST_CASES = [(96, 384, 132), (128, 32, 132), (133, 7, 132), (400, 64, 132), (1000, 3, 264), (5, 2, 132),
              (264, 16, 132), (131, 5, 108), (1, 1, 1), (2, 1, 2), (3, 200, 132), (224, 64, 132)]


def check_kernel_schedule(t: Template, dp: int, tmp_path: Path) -> None:
    """Build :func:`host_program` with nvcc and compare every split, begin and CTA walk with the model."""
    src = tmp_path / "sched.cu"
    src.write_text(host_program(t, dp, HOST_CASES))
    exe = tmp_path / "sched"
    subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-o", str(exe), str(src)], check=True,
                   capture_output=True, timeout=600)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert len(out) == sum(1 + ctas for _, _, ctas in HOST_CASES)
    at = 0
    for tiles, iters, ctas in HOST_CASES:
        vals = [int(v) for v in out[at].split()]
        d, s = split(tiles, ctas, dp)
        assert vals[:2] == [d, s], (tiles, iters, ctas)
        assert vals[2:] == [begin(g, s * iters, ctas) for g in range(ctas + 1)]
        for g in range(ctas):
            units = [[int(v) for v in u.split()] for u in out[at + 1 + g].split(";") if u.strip()]
            want = [[t, k0, k1, *peers] for t, k0, k1, peers in walk(g, tiles, iters, ctas, dp)]
            assert units == want, (tiles, iters, ctas, g)
        at += 1 + ctas


def test_walk_model_covers_every_tile_once() -> None:
    """The model's walks (units of all CTAs) cover every tile's iterations exactly once, owners first."""
    for tiles, iters, ctas, d in CASES:
        seen: dict[int, list[tuple[int, int]]] = {}
        for g in range(ctas):
            for t, k0, k1, _ in walk(g, tiles, iters, ctas, d):
                seen.setdefault(t, []).append((k0, k1))
        assert sorted(seen) == list(range(tiles))
        for parts in seen.values():
            parts.sort()
            assert parts[0][0] == 0 and parts[-1][1] == iters and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit) for a host build")
@pytest.mark.parametrize("dp", (0, 1, 2))
def test_kernel_schedule_matches_the_model(sk: Template, dp: int, tmp_path: Path) -> None:
    check_kernel_schedule(sk, dp, tmp_path)


# ---- template metadata, refusals, plans ---------------------------------------------------
def test_applies_to_mid_shapes_and_poor_last_waves(sk: Template) -> None:
    assert sk.family == "A" and sk.min_arch == 80 and set(sk.layouts) == {"TN", "NN"}
    for text in LLM_SAMPLE + POOR_WAVE:
        assert sk.applicable(Shape.parse(text), 90), text
    # full waves of a big GEMM, decode rows, shallow K, small work: other families'
    for text in ("4096x4096x4096", "1x4096x4096", "16x4096x4096", "512x4096x256", "64x768x768", "64x2304x768"):
        assert not sk.applicable(Shape.parse(text), 90), text
    assert {"tiling", "loops", "schedule", "splitk"} <= {k.axis for k in sk.space.knobs.values()}
    assert "#include" not in sk.source_text


REFUSED = [({"CPS": 3, "STAGES": 5, "BK": 64, "BM": 64, "BN": 64, "WM": 32, "WN": 32}, "512x4096x4096", None, "228 KiB"),
           ({"CPS": 2, "STAGES": 4, "BK": 64, "BM": 128, "BN": 64, "WM": 64, "WN": 32}, "512x4096x4096:NN", 80, "164 KiB"),
           ({"CPS": 3, "BM": 128, "BN": 128, "WM": 64, "WN": 64, "BK": 16, "STAGES": 2}, None, None, "64K registers"),
           ({"SWIZZLE": 1, "PAD": 8}, None, None, "same bank conflicts"),
           ({"CPS": 5}, None, None, "not one of")]


@pytest.mark.parametrize("knobs,shape,arch,reason", REFUSED, ids=[r[3][:20] for r in REFUSED])
def test_invalid_combinations_refused_with_reason(sk: Template, knobs: dict, shape: str | None,
                                                  arch: int | None, reason: str) -> None:
    reasons = sk.check(knobs, Shape.parse(shape) if shape else None, arch)
    assert any(reason in r for r in reasons), reasons


def test_plan_is_one_persistent_launch_with_slots_and_flags(sk: Template) -> None:
    rng = random.Random(7)
    for text in LLM_SAMPLE[::4] + POOR_WAVE + RAGGED:
        shape = Shape.parse(text)
        for knobs in sk.heuristic(shape, 90) + sk.sample(rng, shape, 4, arch=90):
            for specialize in (False, True):
                _, plan = sk.render(knobs, shape, specialize=specialize)
                (launch,), ws = plan.resolve(shape)
                tiles = -(-shape.m // knobs["BM"]) * -(-shape.n // knobs["BN"])
                grid = min(knobs["SMS"] * knobs["CPS"], tiles * -(-shape.k // knobs["BK"]))
                assert launch.kernel == "evo_streamk" and launch.grid == (grid, 1, 1)
                assert launch.block == (32 * (knobs["BM"] // knobs["WM"]) * (knobs["BN"] // knobs["WN"]), 1, 1)
                assert ws == grid * (knobs["BM"] * knobs["BN"] * 4 + 4)
                assert not plan.zero_workspace  # the kernel clears its own flags


def test_first_picks(sk: Template) -> None:
    first = lambda text: sk.heuristic(Shape.parse(text), 90)[0]  # noqa: E731
    assert (first("128x8192x2048")["BM"], first("128x8192x2048")["DP"]) == (64, 0)
    assert (first("12288x64x12288")["BN"], first("12288x64x12288")["DP"]) == (64, 0)
    assert first("512x4096x14336")["DP"] == 1
    for text in LLM_SAMPLE + POOR_WAVE:
        assert all(k["SMS"] == 132 for k in sk.heuristic(Shape.parse(text), 90)[:2]), text
        assert sk.heuristic(Shape.parse(text), 80), text  # sm_80 has picks too


# ---- compiles -------------------------------------------------------------------------------
def test_first_picks_on_the_llm_sample_compile_without_spills(sk: Template) -> None:
    jobs = first_pick_jobs({"streamk": sk}, LLM_SAMPLE + POOR_WAVE + RAGGED, samples=6, sample_shape="300x4100x4104")
    assert len(jobs) >= 12
    compile_and_check(jobs)


def test_device_check_plans_valid_variants(sk: Template) -> None:
    """bench/streamk_check.py (the device script): its mid shapes are streamk's, each gets its picks
    and a CPS x DP sweep, every gemv row gets ISSUE 0 and 1 of the same picks; all knob sets valid."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import streamk_check as chk

    g = load_templates(errors="warn")["gemv"]
    for text in chk.MID:
        s = Shape.parse(text)
        assert sk.applicable(s, 90), text
        vs = chk.streamk_variants(sk, s)
        assert vs[0][0] == "pick0" and len(vs) >= 4 and not any(sk.check(k, s, 90) for _, k in vs)
        assert {(k["CPS"], k["DP"]) for _, k in vs} >= {(1, 0), (1, 1), (1, 2)}
    for text in chk.GEMV_ROWS:
        s = Shape.parse(text)
        vs = chk.gemv_variants(g, s)
        assert {k["ISSUE"] for _, k in vs} == {0, 1} and not any(g.check(k, s, 90) for _, k in vs)
