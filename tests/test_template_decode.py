"""The decode families gemv (CUDA-core GEMV, family T), swab (swap-AB mma.sync, family A) and swpipe
(swap-AB mma.sync with a cp.async weight pipeline and shared-memory tokens, family A).

Knob space, plans at ragged shapes, first picks per shape class, refusals with reasons, and real
compiles (evaluators' ``CompilePool``: static scan, NVRTC, ptxas resource policy) of every knob set
their heuristics emit on a committed sample of decode/latency shapes of llm_layers.csv, for sm_90a
and (clusters off) sm_80, plus seeded random valid knob sets; zero spills. GPU correctness and speed
are bench/decode_dev.py's (device); ``-m slow`` compiles the picks for every shape of the sample.
"""
from __future__ import annotations

import random

import pytest

from populations import Shape, Template, load_templates
from template_compile import compile_and_check, first_pick_jobs

DECODE = ("gemv", "swab", "swpipe")
# decode rows (M = 1, 8) and latency rows of llm_layers.csv, M = 16 and 2..4 variants, and ragged shapes
SAMPLE = ["1x2304x768", "1x768x3072", "1x50257x768", "1x576x576", "1x49152x576", "1x896x896", "1x151936x896",
          "1x2304x2304", "1x9216x2304", "1x3072x3072", "1x4096x4096", "1x4096x14336", "1x128256x4096",
          "8x2304x768", "8x576x576", "8x3072x576", "8x4864x896", "8x3072x3072", "8x4096x4096", "8x4096x14336",
          "8x128256x4096", "8x960x576", "8x576x1536", "16x896x896", "16x4096x4096", "16x14336x4096", "64x576x576",
          "64x768x768", "64x960x576", "2x2304x768", "3x4096x4096", "16x6144x4096", "16x50257x768", "16x4096x14336",
          "8x50257x768", "16x2304x2304", "12x3072x3072"]
RAGGED = ["1x1x1", "3x77x9", "5x1000x1001", "7x33x4100", "13x129x520", "2x8191x17", "64x1x2049", "40x100x72",
          "13x2049x1032", "5x1000x4100"]
# the small-K rows at M = 1 (one warp, 4 or 8 rows) and the few-rows deep-K rows at M = 2..4
FEW = ["1x28080x192", "1x8080x512", "1x700x300", "3x392x4816"]
FIRST = SAMPLE[::3] + RAGGED[:4] + RAGGED[-2:] + FEW  # the quick compile test's shapes


@pytest.fixture(scope="module")
def fams() -> dict[str, Template]:
    templates = load_templates(errors="warn")
    assert set(DECODE) <= set(templates)
    return {n: templates[n] for n in DECODE}


def test_metadata_and_applies(fams: dict[str, Template]) -> None:
    g, s = fams["gemv"], fams["swab"]
    assert (g.family, s.family) == ("T", "A") and g.min_arch == s.min_arch == 80
    assert g.layouts == s.layouts == ("TN",) and not g.applicable(Shape.parse("1x4096x4096:NN"), 90)
    assert g.applicable(Shape.parse("1x4096x4096"), 80) and g.applicable(Shape.parse("4x50257x768"), 90)
    assert not g.applicable(Shape.parse("8x4096x4096"), 90) and g.applicable(Shape.parse("8x576x576"), 90)
    # M 5..12 on few rows (N <= 1024) and deep K (K > 1024): 2 rows a CTA on 8 warps, weights any size
    assert g.applicable(Shape.parse("9x264x3080"), 90) and g.applicable(Shape.parse("12x1024x20000"), 90)
    assert g.applicable(Shape.parse("7x432x4776"), 90)  # 2.1M weights: past the M 5..8 small-weight bound
    for text in ("13x264x3080", "16x1000x2000", "9x1025x3080", "12x1000x1024", "12x2000x2000"):
        assert not g.applicable(Shape.parse(text), 90), text
    assert s.applicable(Shape.parse("8x4096x4096"), 90) and s.applicable(Shape.parse("16x128256x4096"), 80)
    assert s.applicable(Shape.parse("64x576x576"), 90) and not s.applicable(Shape.parse("64x4096x4096"), 90)
    assert not s.applicable(Shape.parse("1x4096x4096"), 90)  # one token: gemv's CUDA cores win
    p = fams["swpipe"]
    assert p.family == "A" and p.min_arch == 80 and p.layouts == ("TN",)
    assert p.applicable(Shape.parse("16x4096x4096"), 90) and p.applicable(Shape.parse("2x2304x2304"), 80)
    assert not p.applicable(Shape.parse("1x4096x4096"), 90) and not p.applicable(Shape.parse("32x4096x4096"), 90)
    assert not p.applicable(Shape.parse("16x896x896"), 90)  # under 4 MB of weights: nothing to pipeline
    big = dict(NT=2, XK=4096, STAGES=8, KT=256, CLUSTER=1)  # 194 KiB: fine on sm_90, over sm_80's 163 KiB
    assert not p.check(big, Shape.parse("16x4096x4096"), 90)
    assert any("163 KiB" in r for r in p.check(big, Shape.parse("16x4096x4096"), 80))
    # the launch's shared memory is a function of the knobs alone (one size per compiled function)
    k = p.heuristic(Shape.parse("16x4096x4096"), 90)[0]
    sizes = {p.render(k, Shape.parse(f"16x4096x{kk}"))[1].resolve(Shape.parse(f"16x4096x{kk}"))[0][0].smem
             for kk in (1000, 2048, 4096)}
    assert len(sizes) == 1
    for t in fams.values():
        assert {"tiling", "loops", "splitk"} <= {k.axis for k in t.space.knobs.values()}
        assert "#include" not in t.source_text and "__device__ float" not in t.source_text


@pytest.mark.parametrize("name", DECODE)
def test_plans_resolve_at_ragged_shapes(fams: dict[str, Template], name: str) -> None:
    """One launch, no workspace, the grid covers every (row tile, token group), z = the cluster."""
    t = fams[name]
    rng = random.Random(5)
    rows, toks = ("ROWS", "TOK") if name == "gemv" else ("RT", "NT")
    per_row, per_tok = (1, 1) if name == "gemv" else (16, 8)
    for text in RAGGED + SAMPLE[:6] + SAMPLE[-6:]:
        shape = Shape.parse(text)
        if not t.applicable(shape, 90):
            continue
        picks = t.heuristic(shape, 90)
        assert picks, (name, text)
        for knobs in picks + t.sample(rng, shape, 5, arch=90):
            for specialize in (False, True):
                _, plan = t.render(knobs, shape, specialize=specialize)
                launches, ws = plan.resolve(shape)
                assert ws == 0 and len(launches) == 1
                (launch,) = launches
                warp_rows = knobs["WARPS"] if knobs.get("WMAP") else 1  # swab WMAP 1: each warp its own rows
                tiles = -(-shape.n // (per_row * knobs[rows] * knobs.get("TILES", 1) * warp_rows))
                tiles = -(-tiles // knobs.get("TPC", 1)) * -(-shape.m // (per_tok * knobs[toks]))
                assert launch.grid == (tiles, 1, knobs["CLUSTER"]) and launch.block == (32 * knobs["WARPS"], 1, 1)
                if name == "swpipe":  # weight stages plus a token buffer that holds one cluster rank's K stages
                    per = -(-(-(-shape.k // knobs["KT"])) // knobs["CLUSTER"])
                    assert per * knobs["KT"] <= knobs["XK"]
                    assert launch.smem == 2 * (knobs["STAGES"] * 16 * knobs["RT"] * (knobs["KT"] + 8)
                                               + 8 * knobs["NT"] * (knobs["XK"] + 8))


def test_swpipe_candidates_are_specialised(fams: dict[str, Template], tmp_path) -> None:
    """swpipe's token buffer holds XK columns, so its kernel is memory-safe only where the XK
    constraint holds: a generic candidate (every M, N, K claimed) overran shared memory at the
    evaluator's ragged K=4104 instance on the H200. Its candidates are specialised however asked;
    the other decode families stay generic, and ``generic`` must be a boolean in template.toml."""
    shape = Shape.parse("8x6144x768")
    knobs = fams["swpipe"].heuristic(shape, 90)[0]
    cand = fams["swpipe"].candidate(knobs, shape)
    assert not fams["swpipe"].generic and not cand.generic and "#define EVO_K 768" in cand.source
    assert "#define EVO_K" in fams["swpipe"].render(knobs, shape)[0]
    for name in ("gemv", "swab"):
        assert fams[name].generic and fams[name].candidate(fams[name].heuristic(shape, 90)[0], shape).generic
    import shutil

    from populations import TemplateError, load_template
    bad = tmp_path / "swpipe"
    shutil.copytree(fams["swpipe"].path, bad)
    text = (bad / "template.toml").read_text().replace("generic = false", 'generic = "no"')
    (bad / "template.toml").write_text(text)
    (tmp_path / "_prelude").symlink_to(fams["swpipe"].path.parent / "_prelude")
    with pytest.raises(TemplateError, match="generic must be true or false"):
        load_template(bad)


def test_cluster_is_compile_time_and_hopper_only(fams: dict[str, Template]) -> None:
    shape = Shape.parse("8x576x576")
    for name, knobs in (("gemv", {"CLUSTER": 4}), ("swab", {"CLUSTER": 4}), ("swpipe", {"CLUSTER": 4})):
        t = fams[name]
        shape = Shape.parse("8x2304x2304" if name == "swpipe" else "8x576x576")
        source, plan = t.render(knobs, shape)
        assert "#define CLUSTER 4" in source.splitlines() and "__cluster_dims__(1, 1, CLUSTER)" in source
        assert plan.resolve(shape)[0][0].grid[2] == 4
        assert any("need sm_90" in r for r in t.check(knobs, shape, 80))
        # sm_80 first picks exist and never use a cluster
        picks = t.heuristic(shape, 80)
        assert picks and all(k["CLUSTER"] == 1 for k in picks)


def test_first_picks_follow_the_measured_classes(fams: dict[str, Template]) -> None:
    """The rules fixed from bench/decode_dev.py's H200 sweep (template.toml comments)."""
    g, s = fams["gemv"], fams["swab"]
    first = lambda t, text: t.heuristic(Shape.parse(text), 90)[0]  # noqa: E731
    # M = 1: one memory round trip per thread (THREADS * UNROLL * 8 >= K up to K = 4096)
    assert first(g, "1x576x576") == dict(g.space.defaults(), ROWS=2, TOK=1, WARPS=4, UNROLL=1)
    # N >= 6144 at K <= 1024: ROWS 4 (1x9728x896: ROWS 2 was 9% slower), ROWS 8 next on N >= 32768
    # (third, behind ROWS 4 with row tiles: test_gemv_row_tiles_are_early_picks_behind_the_measured_first)
    assert first(g, "1x9728x896")["ROWS"] == first(g, "1x151936x896")["ROWS"] == 4
    assert g.heuristic(Shape.parse("1x151936x896"), 90)[2]["ROWS"] == 8
    for text in ("1x2304x2304", "1x3072x3072", "1x4096x4096"):
        k = first(g, text)
        assert k["WARPS"] * 32 * k["UNROLL"] * 8 >= Shape.parse(text).k and k["CLUSTER"] == 1, (text, k)
    # M = 1, K <= 512: as many warps as the row has chunks for (no warp idles: (WARPS - 1) * 32 < chunks),
    # one round trip, ROWS x WARPS = 8 first on wide N and 4 next, 4 elsewhere (the plain peer's best shapes)
    for text in ("1x28080x192", "1x5376x128", "1x880x160", "1x8080x512", "1x700x300", "1x300x7"):
        shape = Shape.parse(text)
        chunks = -(-shape.k // 8)
        picks = g.heuristic(shape, 90)
        k = picks[0]
        assert (k["WARPS"] - 1) * 32 < chunks <= k["WARPS"] * 32 * k["UNROLL"], (text, k)
        assert k["ROWS"] * k["WARPS"] == (8 if shape.n >= 6144 else 4) and k["TOK"] == 1, (text, k)
        if shape.n >= 6144:
            assert picks[1]["ROWS"] * picks[1]["WARPS"] == 4 and picks[1]["WARPS"] == k["WARPS"], (text, picks[1])
    # M = 1, at most 512 rows and K > 4096 (more than UNROLL 2's one round trip of 256 threads): one row a
    # CTA, 8 warps, 4 chunks in flight a thread; 2 next
    for text in ("1x144x14720", "1x304x12992", "1x512x8192", "1x135x5288", "1x128x5632", "1x512x4104"):
        ks = g.heuristic(Shape.parse(text), 90)
        assert [(k["ROWS"], k["WARPS"], k["UNROLL"]) for k in ks[:2]] == [(1, 8, 4), (1, 8, 2)], (text, ks[:2])
    assert first(g, "1x513x8192")["UNROLL"] == first(g, "1x512x4096")["UNROLL"] == 2
    # M = 2..4: all tokens of a row tile in one CTA, exactly M of them (no clamped duplicate row)
    assert [first(g, f"{m}x2304x768")["TOK"] for m in (2, 3, 4)] == [2, 3, 4]
    assert all(k["TOK"] == 3 for k in g.heuristic(Shape.parse("3x1232x2400"), 90) if k["TOK"] != 1)
    # ... K > 1024 on N > 1024: the plain peer's launch shape (2 rows, 4 warps, UNROLL 1) second
    for text in ("3x1232x2400", "2x2160x11920", "4x4096x4096"):
        ks = g.heuristic(Shape.parse(text), 90)
        assert (ks[0]["ROWS"], ks[0]["UNROLL"]) == (4, 2), (text, ks[0])
        assert (ks[1]["ROWS"], ks[1]["WARPS"], ks[1]["UNROLL"], ks[1]["TOK"]) == (2, 4, 1, Shape.parse(text).m), (text, ks[1])
    # ... and with few rows (N <= 1024) and deep K, one row a CTA and 8 warps (enough CTAs for the SMs)
    for text in ("3x392x4816", "2x64x17856", "4x1000x2048"):
        k = first(g, text)
        assert (k["ROWS"], k["WARPS"]) == (1, 8) and k["TOK"] == Shape.parse(text).m, (text, k)
    assert first(g, "3x2048x4816")["ROWS"] == 4  # wide N keeps the ROWS 4 rule
    # ... and at M = 5..12 two rows a CTA on 8 warps, UNROLL 1 then 2, the tokens in the fewest groups of
    # at most 8 (9 = 5 + 4, 12 = 6 + 6)
    for text, tok in (("5x160x1952", 5), ("7x432x4776", 7), ("9x264x3080", 5), ("10x128x2816", 5), ("12x1000x2000", 6),
                      ("9x196x13569", 5)):
        ks = g.heuristic(Shape.parse(text), 90)
        assert [(k["ROWS"], k["WARPS"], k["UNROLL"], k["TOK"]) for k in ks[:2]] == [(2, 8, 1, tok), (2, 8, 2, tok)], (text, ks[:2])
    k = first(g, "8x1000x2000")  # 8 tokens a CTA: 4 warps (8 ran 26% slower at 8x768x3072)
    assert (k["ROWS"], k["WARPS"], k["UNROLL"], k["TOK"]) == (2, 4, 1, 8), k
    # M = 2..4, K <= 512: the M = 1 rule's warps with every token in the CTA, ROWS x WARPS = 8 on wide N,
    # 4 elsewhere; the 4-warp pick next
    for text in ("4x14208x128", "3x2816x128", "3x704x192", "2x8000x384", "4x896x384", "2x635x205"):
        shape = Shape.parse(text)
        chunks = -(-shape.k // 8)
        ks = g.heuristic(shape, 90)
        k = ks[0]
        assert (k["WARPS"] - 1) * 32 < chunks <= k["WARPS"] * 32 and k["TOK"] == shape.m, (text, k)
        assert k["ROWS"] * k["WARPS"] == (8 if shape.n >= 6144 else 4) and k["UNROLL"] == 1, (text, k)
        assert any(x["WARPS"] == 4 and x["ROWS"] == 4 for x in ks[1:3]), (text, ks[:3])
    assert first(g, "4x14208x128")["ROWS"] == 8 and first(g, "4x14208x128")["WARPS"] == 1
    assert first(g, "2x2304x768")["WARPS"] == 4  # K > 512: the 4-warp rule
    # swab, small weights: one 16 x 8 tile per CTA; a cluster splits K only where K is deep (K >= 1536)
    # and the tiles are few (about 200 CTAs)
    assert first(s, "8x768x3072")["CLUSTER"] == 4 and first(s, "8x576x1536")["CLUSTER"] == 2
    assert first(s, "8x576x576")["CLUSTER"] == first(s, "8x2304x768")["CLUSTER"] == 1
    assert (first(s, "8x576x576")["RT"], first(s, "8x576x576")["NT"]) == (1, 1)
    # weights >= 64 MB at M <= 8: both token tiles per CTA, each lane owning 32 contiguous bytes (KMAP 1)
    assert first(s, "8x128256x4096")["KMAP"] == 1 and first(s, "8x128256x4096")["NT"] == 2
    # M 9..16 with large weights: both token tiles in one CTA
    assert first(s, "16x4096x4096")["NT"] == 2 and first(s, "16x4096x4096")["CLUSTER"] == 4
    assert first(s, "16x14336x4096")["CLUSTER"] == 1
    # K = 576..768: 8 warps x 3 k32 steps cover K in one round trip, any N, tokens in cdiv(M, 8) tiles
    for text in ("8x2304x768", "8x6144x768", "8x50257x768", "16x50257x768", "8x3072x576"):
        k = first(s, text)
        assert (k["U"], k["WARPS"], k["CLUSTER"]) == (3, 8, 1) and k["NT"] == -(-Shape.parse(text).m // 8), (text, k)
    # the plain peer's launch shape (one step per warp, ping-pong, 8 warps) where it was measured best
    for text in ("8x6144x4096", "16x6144x4096"):
        k = first(s, text)
        assert (k["U"], k["PIPE"], k["WARPS"], k["CLUSTER"]) == (1, 1, 8, 1), (text, k)


def test_gemv_row_tiles_are_early_picks_behind_the_measured_first(fams: dict[str, Template]) -> None:
    """TILES > 1 (row tiles per CTA, the next tile's loads ahead of this tile's epilogue) is among the
    first 4 picks (``evo run`` seeds 4 per template) of the M = 1 rows where evo and the plain peer
    were tied, behind the measured first pick, which is unchanged."""
    g = fams["gemv"]
    picks = lambda text: g.heuristic(Shape.parse(text), 90)  # noqa: E731
    for text, first, tiles in (("1x50257x768", (4, 4, 1), {4, 2}), ("1x49152x576", (4, 4, 1), {4, 2}),
                               ("1x9728x896", (4, 4, 1), {4, 2}), ("1x9216x3072", (4, 8, 2), {2}),
                               ("1x6144x4096", (2, 8, 2), {2})):
        ks = picks(text)
        assert (ks[0]["ROWS"], ks[0]["WARPS"], ks[0]["UNROLL"], ks[0]["TILES"]) == (*first, 1), (text, ks[0])
        assert {k["TILES"] for k in ks[:4]} - {1} == tiles, (text, ks[:4])
        for k in ks[:4]:
            if k["TILES"] > 1:  # the same launch shape as the first pick, tiles apart
                assert (k["ROWS"], k["WARPS"], k["UNROLL"], k["CLUSTER"], k["PIPE"], k["ISSUE"]) == (*first, 1, 0, 0)
    # the measured ROWS 8 pick of large N stays among the first 4; small N and few rows: no tiles
    assert any(k["ROWS"] == 8 for k in picks("1x50257x768")[:4])
    for text in ("1x2304x2304", "1x3072x3072", "1x4096x4096", "1x576x576", "1x896x4864", "8x576x576", "3x4096x4096"):
        assert all(k["TILES"] == 1 for k in picks(text)), text
    # the grid covers cdiv(N, ROWS * TILES) row groups; sm_80 gets no ROWS 8 with tiles (it spilled)
    k = picks("1x50257x768")[1]
    assert g.render(k, Shape.parse("1x50257x768"))[1].resolve(Shape.parse("1x50257x768"))[0][0].grid == (3142, 1, 1)
    assert g.check(dict(k, ROWS=8, TILES=2), Shape.parse("1x50257x768"), 90) == []
    assert g.check(dict(k, ROWS=8, TILES=2), Shape.parse("1x50257x768"), 80)


REFUSED = [
    ("gemv", {"TILES": 2, "PIPE": 1}, None, "CLUSTER 1, PIPE 0, ISSUE 0"),
    ("gemv", {"TILES": 4, "CLUSTER": 2}, None, "CLUSTER 1, PIPE 0, ISSUE 0"),
    ("gemv", {"TILES": 2, "ROWS": 4, "TOK": 4}, None, "ROWS * TOK above 8"),
    ("gemv", {"ROWS": 8, "TOK": 8}, None, "epilogue dominates"),
    ("gemv", {"ROWS": 8, "UNROLL": 8, "PIPE": 1}, None, "would spill"),
    ("gemv", {"CLUSTER": 8}, "1x16x40", "at least one 16-byte K chunk"),
    ("gemv", {"ISSUE": 1, "PIPE": 1}, None, "PIPE must be 0"),
    ("swab", {"RT": 4, "NT": 8, "U": 4}, None, "would spill"),
    ("swab", {"RT": 4, "NT": 8, "WARPS": 8, "U": 1}, None, "48 KiB"),
    ("swab", {"CLUSTER": 4}, "8x64x64", "at least one k32 step"),
    ("swab", {"U": 5}, None, "not one of"),
    ("swpipe", {"WARPS": 8, "RT": 1, "KT": 64}, None, "at least one k16 step"),
    ("swpipe", {"NT": 2, "KT": 256, "STAGES": 8, "XK": 8192}, None, "227 KiB"),
    ("swpipe", {"NT": 2, "XK": 2048, "CLUSTER": 1}, "16x4096x4096", "token buffer"),
    ("swpipe", {"NT": 1, "RT": 2, "WARPS": 8, "KT": 64, "STAGES": 3, "XK": 2048}, None, "opt-in"),
    ("swpipe", {"CLUSTER": 8, "KT": 256}, "8x4096x1024", "at least one K stage"),
]


@pytest.mark.parametrize("name,knobs,shape,reason", REFUSED, ids=[r[3][:24] for r in REFUSED])
def test_invalid_combinations_refused_with_reason(fams: dict[str, Template], name: str, knobs: dict,
                                                  shape: str | None, reason: str) -> None:
    s = Shape.parse(shape) if shape else None
    reasons = fams[name].check(knobs, s)
    assert any(reason in r for r in reasons), reasons


# ---- compiles (real NVRTC through evaluators.CompilePool, tests/template_compile.py) -----------
def test_first_picks_and_samples_compile_without_spills(fams: dict[str, Template]) -> None:
    jobs = first_pick_jobs(fams, FIRST, samples=6)
    assert len(jobs) >= 30
    compile_and_check(jobs)


def test_gemv_one_warp_picks_of_m_2_to_4_compile_without_spills(fams: dict[str, Template]) -> None:
    """The M = 2..4, K <= 512 first picks (one or two warps, up to 8 rows x 4 tokens of sums a
    thread), aligned and realigning, sm_90a and sm_80."""
    g = fams["gemv"]
    jobs = _valid_jobs(g, ("4x14208x128", "3x2816x128", "2x8000x384", "4x6150x131", "3x704x197"),
                       lambda shape, arch: g.heuristic(shape, arch)[:2])
    assert len(jobs) >= 10 and any(k["ROWS"] == 8 and k["TOK"] == 4 for _, _, c in jobs for k in [c.knobs])
    compile_and_check(jobs)


def test_gemv_token_counts_off_the_powers_of_two_compile_without_spills(fams: dict[str, Template]) -> None:
    """TOK takes every count 1-8 (a CTA holds exactly M tokens at M = 3, 5, 6, 7): the plain, ping-pong,
    row-tile, one-warp, cluster and realigning loops at TOK 3, 5, 6 and 7 compile for sm_90a and (no
    cluster) sm_80 without spills, and the template refuses no such count for its own sake."""
    g = fams["gemv"]
    assert set(range(1, 9)) <= set(g.space.knobs["TOK"].values)
    loops = (dict(ROWS=4, WARPS=4, UNROLL=2), dict(ROWS=2, WARPS=8, UNROLL=2, PIPE=1), dict(ROWS=2, WARPS=4, UNROLL=1, TILES=2),
             dict(ROWS=4, WARPS=1, UNROLL=1), dict(ROWS=1, WARPS=8, UNROLL=2, CLUSTER=2), dict(ROWS=4, WARPS=4, UNROLL=1, ISSUE=1))

    def sets(shape: Shape, arch: str) -> list[dict]:
        base = dict(g.space.defaults(), RAGGED=int(shape.k % 8 != 0))
        return [dict(base, TOK=tok, **v) for tok in (3, 5, 6, 7) for v in loops
                if not (v.get("ISSUE") and base["RAGGED"]) and not (v.get("TILES") and tok * v["ROWS"] > 8)]
    jobs = _valid_jobs(g, ("7x2304x768", "3x1001x999"), sets)
    assert {c.knobs["TOK"] for _, _, c in jobs} == {3, 5, 6, 7} and len(jobs) >= 30, len(jobs)
    compile_and_check(jobs)


def test_gemv_picks_of_m_5_to_12_compile_without_spills(fams: dict[str, Template]) -> None:
    """gemv's first three picks at M 5..12 on few rows and deep K (2 rows a CTA, up to 8 tokens in one
    or two groups, UNROLL 2 near the register estimate's bound), aligned and realigning, sm_90a and
    sm_80."""
    g = fams["gemv"]
    jobs = _valid_jobs(g, ("9x264x3080", "8x1000x2000", "7x432x4776", "11x777x9001", "9x196x13569"),
                       lambda shape, arch: g.heuristic(shape, arch)[:3])
    assert {c.knobs["TOK"] for _, _, c in jobs} >= {5, 7, 8} and any(c.knobs["RAGGED"] for _, _, c in jobs), jobs
    compile_and_check(jobs)


def test_gemv_issue_loop_compiles_without_spills(fams: dict[str, Template]) -> None:
    """ISSUE = 1 (bound-test-free full iterations, advancing pointers, loads ahead of the FMAs) on
    the first picks of the M = 1 rows and at ragged shapes, sm_90a and sm_80 (nothing else)."""
    g = fams["gemv"]
    jobs = _valid_jobs(g, ("1x4096x4096", "1x3072x8192", "1x2304x768", "1x151936x896", "5x1000x1001", "3x77x9"),
                       lambda shape, arch: [dict(k, ISSUE=1, PIPE=0) for k in g.heuristic(shape, arch)[:2]])
    assert len(jobs) >= 8
    compile_and_check(jobs)


def test_gemv_ragged_rows_take_the_realigning_path(fams: dict[str, Template]) -> None:
    """RAGGED = 1 (aligned 16-byte loads shifted into place in registers) is what every first pick
    of a ragged K gets and never one of an aligned K (a knob set that would only add shifts is
    refused); its loop shapes (PIPE, TILES, clusters, several tokens and rows) compile for sm_90a and,
    without a cluster, sm_80, without spills."""
    g = fams["gemv"]
    for text in ("1x851x21953", "3x1449x4413", "2x11545x7105", "1x300x7", "4x129x1030"):
        picks = g.heuristic(Shape.parse(text), "sm_90a")
        assert picks and all(k["RAGGED"] == 1 for k in picks), (text, picks)
    for text in ("1x4096x4096", "2x2304x768", "1x50257x768"):
        assert all(k["RAGGED"] == 0 for k in g.heuristic(Shape.parse(text), "sm_90a")), text
    aligned = Shape.parse("1x4096x4096")
    assert any("realigning path would only add" in r for r in g.check(dict(g.space.defaults(), RAGGED=1), aligned))
    def sets(shape: Shape, arch: str) -> list[dict]:
        base = dict(g.space.defaults(), RAGGED=1)
        return g.heuristic(shape, arch) + [dict(base, **v) for v in (
            dict(ROWS=1, TOK=1, WARPS=8, UNROLL=2, PIPE=1), dict(ROWS=4, TOK=2, WARPS=4, UNROLL=2, TILES=2),
            dict(ROWS=8, TOK=1, WARPS=4, UNROLL=1, TILES=4), dict(ROWS=2, TOK=4, WARPS=2, UNROLL=4),
            dict(ROWS=4, TOK=1, WARPS=8, UNROLL=2, CLUSTER=4), dict(ROWS=2, TOK=2, WARPS=4, UNROLL=1, CLUSTER=2, PIPE=1))]
    jobs = _valid_jobs(g, ("1x851x21953", "3x1449x4413", "2x77x9", "4x129x1030"), sets)
    assert len(jobs) >= 14
    compile_and_check(jobs)


def test_swab_ragged_rows_take_the_realigning_path(fams: dict[str, Template]) -> None:
    """swab's RAGGED = 1 (each lane's chunk completed from the neighbour that holds the next block:
    the next lane, the next step's first lane, or its own next step, by KMAP): every first pick of a
    ragged K, none of an aligned one; its loop shapes (KMAP 0/1, U 1..8, PIPE, WMAP, clusters)
    compile for sm_90a and, without a cluster, sm_80, without spills."""
    sw = fams["swab"]
    for text in ("5x203x9531", "9x511x2945", "14x1201x17765", "40x100x73"):
        picks = sw.heuristic(Shape.parse(text), "sm_90a")
        assert picks and all(k["RAGGED"] == 1 for k in picks), (text, picks)
    assert all(k["RAGGED"] == 0 for k in sw.heuristic(Shape.parse("8x4096x4096"), "sm_90a"))
    def sets(shape: Shape, arch: str) -> list[dict]:
        base = dict(sw.space.defaults(), RAGGED=1)
        return sw.heuristic(shape, arch) + [dict(base, **v) for v in (
            dict(RT=1, NT=1, WARPS=4, U=1, KMAP=0), dict(RT=2, NT=1, WARPS=4, U=3, KMAP=0, PIPE=1),
            dict(RT=1, NT=2, WARPS=8, U=4, KMAP=1), dict(RT=2, NT=2, WARPS=4, U=2, KMAP=1, PIPE=1),
            dict(RT=1, NT=1, WARPS=4, U=8, KMAP=1, WMAP=1), dict(RT=2, NT=1, WARPS=4, U=2, CLUSTER=4))]
    jobs = _valid_jobs(sw, ("5x203x9531", "14x1201x17765", "3x77x9", "40x100x73"), sets)
    assert len(jobs) >= 14
    compile_and_check(jobs)


def test_swab_short_k_first_picks_are_one_warp_over_the_whole_row(fams: dict[str, Template]) -> None:
    """K <= 256 at M <= 16 (random seed 18's decode rows where the plain peer's one-warp swap-AB
    launch beat every decode kernel): swab's first pick is one warp walking the row's k32 steps in
    one round trip (U = the steps, snapped to the domain; every token tile of up to 16 tokens), its
    second spreads the same row's steps over the largest power of two of warps <= the steps (one or
    two steps a warp, a shared-memory reduction); 16 rows, no cluster; deeper K keeps the rules
    below. They compile without spills for sm_90a and sm_80, aligned and realigning."""
    sw = fams["swab"]
    for text in ("4x23424x128", "6x17472x128", "8x416x64", "2x100x40", "16x5000x256", "12x3000x96", "5x3000x130"):
        shape = Shape.parse(text)
        first, second = sw.heuristic(shape, "sm_90a")[:2]
        steps = -(-shape.k // 32)
        assert (first["WARPS"], first["RT"], first["CLUSTER"], first["NT"]) == (1, 1, 1, -(-shape.m // 8)), (text, first)
        assert first["U"] == max(u for u in (1, 2, 3, 4, 6, 8) if u <= min(steps, 8 if shape.m <= 8 else 4)), (text, first)
        warps = max(w for w in (1, 2, 4, 8) if w <= steps)
        assert (second["WARPS"], second["RT"], second["CLUSTER"], second["NT"], second["WMAP"]) == \
            (warps, 1, 1, -(-shape.m // 8), 0), (text, second)
        assert second["U"] == -(-steps // warps) and second["U"] * second["WARPS"] >= steps, (text, second)
        for k in (first, second):
            assert not sw.check(k, shape, "sm_90a"), (text, k)
    for text in ("8x2304x768", "8x416x288", "17x4000x128"):
        assert sw.heuristic(Shape.parse(text), "sm_90a")[0]["WARPS"] > 1, text
    jobs = _valid_jobs(sw, ("4x23424x128", "8x416x64", "16x5000x256", "12x3000x96", "5x3000x130", "3x77x9"),
                       lambda shape, arch: sw.heuristic(shape, arch)[:2])
    assert len(jobs) >= 16
    compile_and_check(jobs)


def _valid_jobs(t: Template, shapes: tuple[str, ...], knob_sets, archs=("sm_90a", "sm_80")) -> list:
    """Compile jobs of ``t`` for every knob set ``knob_sets(shape, arch)`` gives that the template
    accepts at that shape and arch (one job per distinct source and arch)."""
    jobs = {}
    for text in shapes:
        shape = Shape.parse(text)
        for arch in archs:
            for knobs in knob_sets(shape, arch):
                if t.check(knobs, shape, arch):
                    continue
                cand = t.candidate(knobs, shape)
                jobs.setdefault((cand.source, arch), (t.name, arch, cand))
    return list(jobs.values())


def test_swab_warp_row_tiles_compile_and_are_never_a_first_pick(fams: dict[str, Template]) -> None:
    """WMAP = 1 (each warp its own row tiles over the CTA's K range, tokens shared through L1; not
    yet timed on a GPU): later picks of the M = 2..16 rows with >= 16 MB of weights, never the first;
    its grid covers 16 * RT * WARPS rows a CTA; its picks and forced variants at ragged shapes
    (clusters on and off, the cluster reduction of per-warp outputs) compile for sm_90a, and those
    without a cluster for sm_80, without spills."""
    sw = fams["swab"]
    for text in ("16x6144x4096", "16x4096x14336", "16x50257x768", "8x4096x4096", "12x3072x3072"):
        shape = Shape.parse(text)
        picks = sw.heuristic(shape, "sm_90a")
        assert not picks[0].get("WMAP") and any(k.get("WMAP") for k in picks[1:]), (text, picks)
    k = dict(sw.space.defaults(), RT=1, NT=2, WARPS=8, U=4, WMAP=1, CLUSTER=8)
    (launch,), _ = sw.candidate(k, Shape(16, 6144, 4096)).plan.resolve(Shape(16, 6144, 4096))
    assert launch.grid == (48, 1, 8) and launch.block == (256, 1, 1)
    def sets(shape: Shape, arch: str) -> list[dict]:  # sm_80 keeps the sets without a cluster
        return [p for p in sw.heuristic(shape, "sm_90a") if p.get("WMAP")] + [
            dict(sw.space.defaults(), RT=rt, NT=nt, WARPS=4, U=2, PIPE=pipe, WMAP=1, CLUSTER=cl)
            for rt, nt, pipe, cl in ((1, 2, 0, 1), (2, 1, 1, 2), (1, 1, 0, 4))]
    jobs = _valid_jobs(sw, ("16x6144x4096", "16x14336x4096", "8x4096x14336", "16x50257x768", "13x2049x1032",
                            "5x1000x1001", "3x77x9", "7x33x4100"), sets)
    assert len(jobs) >= 10
    compile_and_check(jobs)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_first_pick_of_the_sample_compiles(fams: dict[str, Template]) -> None:
    compile_and_check(first_pick_jobs(fams, SAMPLE + RAGGED + FEW, samples=40))


def test_gemv_realigning_path_issues_every_load_before_its_first_shuffle(fams: dict[str, Template]) -> None:
    """RAGGED 1 (rows off the 16-byte grid): each iteration's UNROLL x (ROWS + TOK) block loads are
    all issued before the first shuffle of the realignment (decode.cuh dec_raw / dec_join). Loading,
    shuffling and shifting one chunk after another left one 16-byte load in flight a thread (the
    SASS had a SHFL after every LDG), and gemv ran 0.52x of cuBLAS at 1x13696x2756 (H100, seed 10)."""
    import re

    from evaluators.compile import cuda_tool
    from evaluators.compile._sass import disassemble
    from test_sass_check import build

    tool = cuda_tool("nvdisasm")
    if tool is None:
        pytest.skip("no nvdisasm (the dev extra's nvidia-cuda-nvdisasm)")
    g = fams["gemv"]
    for text, knobs in (("1x13696x2756", dict(ROWS=4, TOK=1, WARPS=8, UNROLL=2)),
                        ("3x1001x999", dict(ROWS=1, TOK=4, WARPS=8, UNROLL=2))):
        k = g.space.complete(dict(knobs, RAGGED=1))
        assert not g.check(k, Shape.parse(text), 90)
        cubin, _ = build(g.candidate(k, Shape.parse(text), specialize=True).source, "sm_90a")
        ops = re.findall(r"\b(LDG\.E[.\w]*|SHFL\.\w+)", disassemble(cubin, tool))
        first_shfl = next(i for i, op in enumerate(ops) if op.startswith("SHFL"))
        loads = sum(op.startswith("LDG") and ".128" in op for op in ops[:first_shfl])
        # each chunk: its own block, and lane 31's next block (a predicated load on every lane)
        assert loads >= 2 * k["UNROLL"] * (k["ROWS"] + k["TOK"]), (text, loads, ops[:first_shfl + 2])


# ---- device -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_first_picks_pass_the_evaluator_on_the_gpu(fams: dict[str, Template], tmp_path) -> None:
    """The decode families' first picks through the whole evaluator (its ragged instances for generic
    candidates included) at decode rows, the three where a generic swpipe overran its token buffer
    on the H200 (8x6144x768, 8x50257x768, 16x6144x4096) among them."""
    pytest.importorskip("torch")
    from evaluators import LocalPool
    from populations import Status

    cases = []
    for text in ["8x6144x768", "8x50257x768", "16x6144x4096", "16x1152x896", "1x9216x3072", "3x77x9", "5x4100x1030",
                 "1x851x21953", "2x1001x4413", "4x129x1030", "1x300x7", "9x511x2945", "14x1201x1765", "40x100x73",
                 "1x7000x200", "1x900x456", "3x500x4816", "6x17472x128", "8x416x64", "12x3000x96", "8x768x3072", "11x300x4097"]:
        s = Shape.parse(text)
        for name in DECODE:
            if fams[name].applicable(s, 90):
                cases += [(name, text, k) for k in fams[name].heuristic(s, 90)[:3]]
    # gemv's one-warp epilogue (stores from registers, no shared memory) on both of its paths: one
    # tile and TILES > 1, aligned and realigning, several tokens, rows past N's edge
    one_warp = [dict(ROWS=4, TOK=1, WARPS=1, UNROLL=1), dict(ROWS=8, TOK=1, WARPS=1, UNROLL=2, TILES=2),
                dict(ROWS=2, TOK=4, WARPS=1, UNROLL=1, TILES=4, RAGGED=1), dict(ROWS=4, TOK=2, WARPS=1, UNROLL=2, PIPE=1),
                dict(ROWS=8, TOK=4, WARPS=1, UNROLL=1), dict(ROWS=8, TOK=4, WARPS=1, UNROLL=1, RAGGED=1)]
    for text, k in zip(["1x1002x136", "1x7003x200", "5x1001x455", "3x333x1024", "4x14211x128", "3x6150x131"], one_warp):
        k = fams["gemv"].space.complete(k)
        assert not fams["gemv"].check(k, Shape.parse(text), 90), (text, k)
        cases.append(("gemv", text, k))
    cands = [fams[n].candidate(k, Shape.parse(s)) for n, s, k in cases]
    with LocalPool(compile_workers=4, timers=("device",), log_dir=str(tmp_path)) as pool:
        evals = pool.evaluate(cands)
    assert {n for n, _, _ in cases} == set(DECODE)
    bad = [(n, s, k, e.status.value, e.message[:300]) for (n, s, k), e in zip(cases, evals) if e.status is not Status.OK]
    assert not bad, bad
    for name in ("gemv", "swab"):  # the realigning paths were judged
        assert sum(1 for n, _, k in cases if n == name and k.get("RAGGED")) >= 6, name
