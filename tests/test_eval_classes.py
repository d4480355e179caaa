"""Issue 18 on the CPU: the evaluator closes whole classes of cheating, not cases.

- Compiled output: the PTX scan (:mod:`evaluators.compile._ptxscan`) on PTX text for every rule, and on
  real NVRTC compiles of spellings the source scan cannot see.
- No false rejections: template seeds still compile and pass every scan.
- Bounded parsers: each CPU-side attack (unterminated literals, macro bombs, nested plan
  expressions, shape-claim floods) is a clean rejection within its limit, never an exception.
- Timed calls checked like checked calls: the random perturbation, the random workspace fill,
  the verification of a timed replay, the large ragged instance.
"""
from __future__ import annotations

import itertools
import random
import sys
import time
from pathlib import Path

import pytest

from populations import Candidate, LaunchPlan, PlanError, Shape, Status

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "evaluators" / "compile"))
import _ptxscan  # noqa: E402  (the compile child loads it the same way: a top-level, stdlib-only module)

KERNEL = 'extern "C" __global__ void k(float* c, int n) { if (threadIdx.x < n) c[threadIdx.x] = 1.f; }\n'
PLAN = {"launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "smem": 0, "args": ["C", "N"]}],
        "workspace": 0}


def cand(source: str, shapes: tuple[Shape, ...] = (Shape(64, 64, 64, "TN"),), plan: dict | None = None) -> Candidate:
    return Candidate(source=source, plan=LaunchPlan.from_dict(plan or PLAN), shapes=shapes, generic=True)


# -- the PTX scan on text ----------------------------------------------------------------------
PTX_HEAD = ".version 9.0\n.target sm_90a\n.address_size 64\n"
BODY = ".visible .entry k(\n.param .u64 k_param_0\n)\n{\n.reg .b64 %rd<4>;\n.reg .b32 %r<4>;\n{}\nret;\n}\n"


def body(*lines: str, decls: str = "") -> str:
    return PTX_HEAD + decls + BODY.replace("{}", "\n".join(lines), 1)


@pytest.mark.parametrize("line, words", [
    ("mov.u64 %rd1, %clock64;", "clock"), ("mov.u32 %r1, %clock;", "clock"), ("mov.u32 %r1, %clock_hi;", "clock"),
    ("mov.u64 %rd1, %globaltimer;", "global timer"), ("mov.u32 %r1, %globaltimer_lo;", "global timer"),
    ("mov.u32 %r1, %pm3;", "performance counter"), ("mov.u32 %r1, %envreg7;", "environment"),
    ("mov.u64 %rd1, %gridid;", "grid id"), ("mov.u64 %rd1, %current_graph_exec;", "graph handle"),
    ("pmevent 1;", "pmevent"), ("brkpt;", "brkpt"), ("cvta.const.u64 %rd1, %rd2;", "cvta.const"),
])
def test_ptx_forbidden_instructions(line: str, words: str) -> None:
    reasons = _ptxscan.scan_ptx(body(line))
    assert reasons and words in reasons[0], reasons


@pytest.mark.parametrize("decl, words", [
    (".global .align 4 .b8 tbl[16] = {1, 0, 0, 0};\n", ".global variable tbl"),
    (".visible .global .align 8 .u64 counter;\n", ".global variable counter"),
    (".global .align 1 .b8 $str[6] = {104, 101, 108, 108, 111};\n", ".global variable $str"),
    (".extern .func (.param .b32 func_retval0) vprintf\n(\n.param .b64 a,\n.param .b64 b\n)\n;\n", "vprintf"),
    (".global .texref tex0;\n", ".global variable tex0"), (".surfref surf0;\n", ".surfref"),
])
def test_ptx_module_state_and_calls_out(decl: str, words: str) -> None:
    name = words.split()[-1]
    use = f"mov.u64 %rd1, {name};" if ".global" in words else ""
    reasons = _ptxscan.scan_ptx(body(use, decls=decl))
    assert any(words in r for r in reasons), reasons


def test_ptx_allowed_state_spaces_and_specials() -> None:
    """Static and dynamic shared memory, __constant__ read with ld.const, %smid, nanosleep,
    cluster registers and comments that name forbidden things all pass."""
    decls = (".shared .align 16 .b8 tile[4096];\n.extern .shared .align 16 .b8 dyn[];\n"
             ".const .align 4 .b8 table[16];\n.global .align 1 .u8 _ZN26__nv_atomic_triv_cp_helperIjE5__valE;\n")
    lines = ("ld.const.u32 %r1, [table+4];", "mov.u32 %r2, %smid;", "nanosleep.u32 100;", "mov.u32 %r3, %cluster_ctarank;",
             "// mov.u64 %rd1, %globaltimer; (a comment)", "/* %clock64 .global */", "ld.shared.u32 %r1, [tile];",
             "mov.u32 %r1, %clock_me_not;")
    assert _ptxscan.scan_ptx(body(*lines, decls=decls)) == []


def test_ptx_scan_is_linear() -> None:
    text = body(*["ld.global.nc.u32 %r1, [%rd1]; // " + "x" * 80] * 20000)
    t0 = time.perf_counter()
    assert _ptxscan.scan_ptx(text) == []
    assert time.perf_counter() - t0 < 2.0


# -- the compiled-output scan on real compiles -------------------------------------------------
evaluators = pytest.importorskip("evaluators")
ARCH = "sm_90a"


@pytest.mark.parametrize("snippet, words", [
    ('unsigned long long t; asm volatile("mov.u64 %0, %%glob" "altimer;" : "=l"(t)); c[1] = (float)t;', "global timer"),
    ('long long t = (clock64)(); c[1] = (float)t;', "clock"),
    ('__device__ const unsigned tbl[2] = {0u, 1u}; unsigned x = atomicAdd((unsigned*)tbl, 1u); c[1] = (float)x;', ".global"),
    ('unsigned* p = (unsigned*)(void*)"abcd"; c[1] = (float)atomicAdd(p, 1u);', ".global variable $str"),
])
def test_compiled_output_scan_sees_what_the_source_scan_cannot(snippet: str, words: str, tmp_path: Path) -> None:
    decl, _, code = snippet.partition("; ") if snippet.startswith("__device__") else ("", "", snippet)
    src = (decl + ";\n" if decl else "") + 'extern "C" __global__ void k(float* c, int n) { ' + code + " }\n"
    c = cand(src)
    assert evaluators.scan(c, arch=ARCH).ok  # the text passes ...
    result = evaluators.compile_candidate(c, ARCH, cache_dir=tmp_path, timeout_s=60)
    assert result.status is Status.REJECTED, result.message  # ... the PTX does not
    assert result.message.startswith("compiled-output scan:") and words in result.message, result.message
    again = evaluators.compile_candidate(c, ARCH, cache_dir=tmp_path, timeout_s=60)  # the verdict is cached
    assert again.cached and again.status is Status.REJECTED


def test_nvcc_backend_scans_its_ptx_too(tmp_path: Path) -> None:
    """nvcc keeps its intermediate PTX (--keep) for the same scan."""
    from evaluators.compile._toolkit import nvcc_path

    if not nvcc_path():
        pytest.skip("nvcc not found")
    hidden = cand('extern "C" __global__ void k(float* c, int n) { long long t = (clock64)(); c[0] = (float)t; }\n')
    result = evaluators.compile_candidate(hidden, ARCH, backend="nvcc", use_cache=False, timeout_s=120)
    assert result.status is Status.REJECTED and "%clock64" in result.message, result.message
    plain = evaluators.compile_candidate(cand(KERNEL), ARCH, backend="nvcc", use_cache=False, timeout_s=120)
    assert plain.status is Status.OK, plain.message


def test_template_seeds_pass_the_compiled_output_scan(tmp_path: Path) -> None:
    """No false rejections: every template's first heuristic seed at a tall, a square and a decode
    shape compiles and passes both scans (generic and specialised)."""
    from populations import load_templates

    seen = 0
    for shape in (Shape(4096, 4096, 4096, "TN"), Shape(512, 2304, 768, "TN"), Shape(1, 4096, 4096, "NN")):
        for name, t in load_templates().items():
            if not t.applicable(shape, ARCH):
                continue
            for knobs in t.heuristic(shape, arch=ARCH)[:1]:
                for spec in (False, True):
                    r = evaluators.compile_candidate(t.candidate(knobs, shape, specialize=spec), ARCH, cache_dir=tmp_path)
                    assert r.status is Status.OK, f"{name} {shape} {knobs}: {r.message[:400]}"
                    seen += 1
    assert seen >= 6


# -- bounded parsers ---------------------------------------------------------------------------
ATTACKS = {
    "unterminated string": '#if 0\n' + '"\\' * 60000 + " x\n#endif\n",
    "unterminated char": "#if 0\n" + "'\\" * 60000 + " x\n#endif\n",
    "unterminated raw string": '#if 0\nR"e(' + 'R"(' * 40000 + "\n#endif\n",
    "unterminated comment": "/* " * 40000,
    "macro bomb (arguments)": "#define T(x) x x x x\n#if 0\n" + "T(" * 24 + "y" + ")" * 24 + "\n#endif\n",
    "macro bomb (ladder)": "#define A0 x x x x x x x x x x\n" + "".join(
        f"#define A{i} " + " ".join([f"A{i - 1}"] * 10) + "\n" for i in range(1, 9)) + "__device__ void f() { A8; }\n",
    "unbalanced macro calls": "#define F(x) x\n__device__ void f() { " + "F(" * 40000 + "; }\n",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_source_attacks_are_rejected_quickly(name: str) -> None:
    t0 = time.perf_counter()
    verdict = evaluators.scan(cand(ATTACKS[name] + KERNEL))
    took = time.perf_counter() - t0
    assert took < 3.0, f"{name}: {took:.1f}s"
    if name != "unbalanced macro calls":  # that one is merely broken C++: the compiler refuses it
        assert not verdict.ok and verdict.reasons, name


@pytest.mark.parametrize("expr", ["-" * 900 + "1", "not " * 240 + "1", "1+" * 490 + "1",
                                  "1 if 1 else " * 80 + "2", "min(" * 120 + "1" + ",2)" * 120])
def test_nested_plan_expressions_are_plan_errors(expr: str) -> None:
    plan = {**PLAN, "launches": [{**PLAN["launches"][0], "grid": [expr, 1, 1]}]}
    t0 = time.perf_counter()
    with pytest.raises(PlanError):
        LaunchPlan.from_dict(plan)
    assert time.perf_counter() - t0 < 1.0


def test_claimed_shapes_are_capped() -> None:
    from evaluators.static._static import MAX_CLAIMED_SHAPES

    shapes = tuple(Shape(8 * (i + 1), 64, 64, "TN") for i in range(MAX_CLAIMED_SHAPES + 1))
    verdict = evaluators.scan(cand(KERNEL, shapes))
    assert not verdict.ok and "claims" in verdict.reasons[0]
    assert evaluators.scan(cand(KERNEL, shapes[:MAX_CLAIMED_SHAPES])).ok


def test_a_failure_inside_the_scan_is_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    from evaluators.static import _static

    def boom(*_a: object, **_k: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(_static, "_structure", boom)
    verdict = evaluators.scan(cand(KERNEL))
    assert not verdict.ok and "RecursionError" in verdict.reasons[0]


# -- timed calls checked like checked calls (CPU tensors; the CUDA graph is a test double) -------
torch = pytest.importorskip("torch")


def _rotation_double():
    """Stand-in for the harness's TimingBuffers (they need a GPU): stacked A, B (TN), C, their
    pristine copy and the timers' perturbation, borrowed from the real class (its methods only
    touch these tensors)."""
    from evaluators.run._rotation import TimingBuffers

    class _Rotation:
        scramble, _mask_window, _b_stored = TimingBuffers.scramble, TimingBuffers._mask_window, TimingBuffers._b_stored
        embed, _run_of_sets, poison_outputs = TimingBuffers.embed, TimingBuffers._run_of_sets, TimingBuffers.poison_outputs
        unflip, live_inputs = TimingBuffers.unflip, TimingBuffers.live_inputs

        def __init__(self, sets: int, shape: Shape) -> None:
            gen = torch.Generator().manual_seed(3)
            m, n, k = shape.m, shape.n, shape.k
            self.n_sets, self._mk = sets, (m, k)
            self.a_all = torch.empty(sets, m * k, dtype=torch.float16).uniform_(-1, 1, generator=gen)
            self.bnk_all = torch.empty(sets, n * k, dtype=torch.float16).uniform_(-1, 1, generator=gen)
            self.bkn_all = self.bnk_all.clone()
            self.cc_all = torch.full((sets, m * n), float("nan"), dtype=torch.float16)
            self._flipped: set[int] = set()
            self._dirty, self._mask, self.coherent = set(), None, {}
            self._inputs = [t.view(torch.int16) for t in (self.a_all, self.bnk_all, self.bkn_all)]
            self._pristine = [t.clone() for t in self._inputs]
    return _Rotation


class _GraphDouble:
    """Test double of a captured CUDA graph of one rotation: replay() calls every set once."""

    def __init__(self, rot, shape: Shape, stale_after: int | None = None) -> None:
        self.rot, self.shape, self.stale_after, self.replays = rot, shape, stale_after, 0

    def replay(self) -> None:
        self.replays += 1
        if self.stale_after is not None and self.replays > self.stale_after:
            return  # a kernel that keeps the previous output once it believes it is timed
        m, n, k = self.shape.m, self.shape.n, self.shape.k
        a = self.rot.a_all.view(-1, m, k).double()
        b = self.rot.bnk_all.view(-1, n, k).double()
        self.rot.cc_all.copy_(torch.bmm(a, b.transpose(1, 2)).half().view(self.rot.n_sets, -1))


def _timed(stale_after: int | None, replays: int = 5, shape: Shape = Shape(64, 48, 96, "TN")) -> None:
    from evaluators.run import _rotation

    rot = _rotation_double()(3, shape)
    ws = torch.zeros(3, 256, dtype=torch.uint8)
    perturb = _rotation._perturber(rot, shape, ws, random.Random(1))
    graph = _GraphDouble(rot, shape, stale_after)
    for _ in range(replays):
        perturb()
        graph.replay()
    _rotation._check_timed(graph, perturb, rot, shape, "timed replays", lambda: None, random.Random(2))


def test_an_honest_timed_replay_passes() -> None:
    _timed(stale_after=None)
    _timed(stale_after=None, shape=Shape(1024, 32, 48, "TN"))  # rows sampled


def test_a_kernel_idle_when_timed_is_caught_naming_the_call() -> None:
    from evaluators.correctness import CheckFailed

    with pytest.raises(CheckFailed, match="timed calls verified: timed replays: rotation set . is wrong on a replay"):
        _timed(stale_after=1)
    with pytest.raises(CheckFailed, match="timed calls verified"):
        _timed(stale_after=1, shape=Shape(1024, 32, 48, "TN"))  # 64 random rows of 1024 suffice: all are stale


def test_perturbation_changes_a_and_b_and_their_magnitudes_and_refills_the_workspace() -> None:
    """Every call changes A or B (both over the calls) nearly everywhere, signs and magnitudes
    alike (so no output kept from an earlier call can be updated cheaply), below 2 in magnitude,
    never in the same pattern twice; the workspace rows get bytes from the checked calls' set;
    some calls hide the cancellation test, some poison C; unflip restores the inputs bit for bit."""
    from evaluators.correctness import WORKSPACE_FILLS
    from evaluators.run import _rotation

    shape = Shape(64, 48, 96, "TN")
    rot = _rotation_double()(2, shape)
    pristine_a, pristine_b, pristine_kn = rot.a_all.clone(), rot.bnk_all.clone(), rot.bkn_all.clone()
    ws = torch.zeros(2, 256, dtype=torch.uint8)
    perturb = _rotation._perturber(rot, shape, ws, random.Random(7))
    fills, patterns, poisoned, dense = set(), set(), 0, {"A": 0, "B": 0}
    for call in range(40):
        a0, b0 = rot.a_all.clone(), rot.bnk_all.clone()
        rot.cc_all.zero_()
        perturb()
        for name, now, before in (("A", rot.a_all, a0), ("B", rot.bnk_all, b0)):
            changed = now.view(torch.int16) != before.view(torch.int16)
            assert float(now.float().abs().max()) < 2.0 and bool(torch.isfinite(now.float()).all())
            if float(changed.float().mean()) < 0.9:
                continue  # the other operand's turn (or only the hidden cancellation changed it)
            dense[name] += 1
            ratio = (now.float().abs() / before.float().abs().clamp(min=1e-3))[changed]
            assert float(ratio.max()) > 2 and float(ratio.min()) < 0.5  # magnitudes, not only signs
            assert float(((now.float() * before.float()) < 0).float().mean()) > 0.3  # and signs
        assert dense["A"] + dense["B"] >= call + 1  # every call changes one operand densely
        patterns.add(hash(tuple(t.view(torch.int16)[0, :32].numpy().tobytes() for t in (rot.a_all, rot.bnk_all))))
        fills.add(int(ws[0, 0]))
        poisoned += bool((rot.cc_all != 0).any())
        assert bool((ws == ws[0, 0]).all())
    assert min(dense.values()) >= 10  # both operands, at random
    assert len(patterns) == 40
    assert fills <= set(WORKSPACE_FILLS) and len(fills) >= 3
    assert 3 <= poisoned <= 20  # C poisoned on random calls (a quarter of them)
    assert torch.equal(rot.bkn_all, pristine_kn)  # the other layout's B is the baseline's alone
    rot.unflip()
    assert torch.equal(rot.a_all.view(torch.int16), pristine_a.view(torch.int16))
    assert torch.equal(rot.bnk_all.view(torch.int16), pristine_b.view(torch.int16))


def test_host_timers_perturb_the_set_they_call_next_and_no_other() -> None:
    """``_set_perturber(i)`` changes set i's A or B densely (signs and magnitudes), refills set
    i's workspace row, and leaves every other set, every C and the hidden tests of other sets as
    they were: a host-timed call sees inputs as fresh as after the whole perturbation, at a
    fraction of its cost."""
    from evaluators.correctness import WORKSPACE_FILLS
    from evaluators.run import _rotation

    shape = Shape(64, 48, 96, "TN")
    rot = _rotation_double()(4, shape)
    pristine_a, pristine_b = rot.a_all.clone(), rot.bnk_all.clone()
    ws = torch.zeros(4, 256, dtype=torch.uint8)
    perturb = _rotation._perturber(rot, shape, ws, random.Random(0))  # noqa: F841 (the device timer's, untouched)
    perturb_set = _rotation._set_perturber(rot, shape, ws, random.Random(5))
    rot.embed(torch.Generator().manual_seed(1), random.Random(2), shape)  # hidden in a random run of sets
    assert rot.coherent
    rng, operands = random.Random(9), set()
    for _ in range(60):
        i = rng.randrange(4)
        a0, b0, w0, c0 = rot.a_all.clone(), rot.bnk_all.clone(), ws.clone(), rot.cc_all.clone()
        carried = set(rot.coherent) - {i}  # other sets keep their hidden test: their inputs stay
        perturb_set(i)
        da = (rot.a_all.view(torch.int16) != a0.view(torch.int16)).float().mean(dim=1)
        db = (rot.bnk_all.view(torch.int16) != b0.view(torch.int16)).float().mean(dim=1)
        others = [s for s in range(4) if s != i]
        assert float(da[others].max()) == 0 and float(db[others].max()) == 0
        assert max(float(da[i]), float(db[i])) > 0.9
        operands.add("A" if float(da[i]) > 0.9 else "B")
        assert bool((ws[others] == w0[others]).all()) and int(ws[i, 0]) in WORKSPACE_FILLS and bool((ws[i] == ws[i, 0]).all())
        assert torch.equal(rot.cc_all.view(torch.int16), c0.view(torch.int16))
        assert set(rot.coherent) == carried  # set i's own test is gone with its scramble
    assert operands == {"A", "B"}
    rot.unflip()
    assert torch.equal(rot.a_all.view(torch.int16), pristine_a.view(torch.int16))
    assert torch.equal(rot.bnk_all.view(torch.int16), pristine_b.view(torch.int16))


def test_timed_check_judges_timed_outputs_exactly() -> None:
    """A kernel that is right within the random-input tolerance but loses exactness on the
    cancellation hidden in timed inputs (fp16 partial sums) is caught on the timed replay."""
    from evaluators.correctness import CheckFailed
    from evaluators.run import _rotation

    shape = Shape(64, 48, 256, "TN")
    rot = _rotation_double()(3, shape)

    class Fp16Partials(_GraphDouble):
        def replay(self) -> None:
            m, n, k = shape.m, shape.n, shape.k
            a = self.rot.a_all.view(-1, m, k).double()
            b = self.rot.bnk_all.view(-1, n, k).double()
            acc = sum(torch.bmm(a[..., z:z + 64], b[..., z:z + 64].transpose(1, 2)).half().double()
                      for z in range(0, k, 64))
            self.rot.cc_all.copy_(acc.half().view(self.rot.n_sets, -1))
    perturb = _rotation._perturber(rot, shape, None, random.Random(1))
    graph = Fp16Partials(rot, shape)
    for _ in range(3):
        perturb()
        graph.replay()
    with pytest.raises(CheckFailed, match="timed calls verified"):
        _rotation._check_timed(graph, perturb, rot, shape, "timed replays", lambda: None, random.Random(2))


def test_large_ragged_instance_keeps_the_grid_and_cuts_every_tail() -> None:
    from evaluators.correctness import large_ragged

    rng = random.Random(0)
    for _ in range(50):
        shape = Shape(rng.randint(65, 9000), rng.randint(65, 9000), rng.randint(65, 9000), "TN")
        big = large_ragged(shape, set(), rng)
        assert all(0 < shape_d - d < 64 for shape_d, d in ((shape.m, big.m), (shape.n, big.n), (shape.k, big.k)))
        tma = large_ragged(shape, {"K", "N"}, rng)
        assert tma.k % 8 == 0 and tma.n % 8 == 0 and tma.k < shape.k and tma.n < shape.n
    assert large_ragged(Shape(1, 4096, 4096, "TN"), set(), rng).m == 1
    # a pitch dimension of 8 or less has nothing to cut to while staying a multiple of 8 (TMA's
    # rule); it was cut to 1..7, and a TMA kernel at 1x1x8 was rejected for a shape it never claimed
    for _ in range(20):
        small = large_ragged(Shape(1, 8, 8, "TN"), {"K", "N"}, rng)
        assert (small.n, small.k) == (8, 8)
        assert large_ragged(Shape(1, 8, 8, "TN"), set(), rng).k < 8


def test_workspace_rows_are_guarded_each_and_poisoned_between_calls_without_a_workspace() -> None:
    """A plan without a workspace still gets a 256-byte row per timing set (its pointer is passed):
    every row is refilled with a poison byte before each timed replay, and a store past any row,
    into the band before the next one, is seen."""
    from evaluators.correctness import WORKSPACE_FILLS
    from evaluators.run import _rotation

    shape = Shape(64, 48, 96, "TN")
    rows = _rotation.WorkspaceRows(4, 0, torch.device("cpu"), torch.Generator().manual_seed(1), 0xFF)
    assert rows.rows.shape == (4, 256) and rows.intact()
    rows.rows[2].fill_(0x42)  # state a kernel leaves in its row: the next replay's refill erases it
    perturb = _rotation._perturber(_rotation_double()(4, shape), shape, rows.rows, random.Random(3))
    perturb()
    assert int(rows.rows[2, 0]) in WORKSPACE_FILLS and bool((rows.rows == rows.rows[0, 0]).all())
    assert rows.intact()
    stride = rows.guard.data.stride(0)
    rows.guard.data.view(-1)[stride + 256] ^= 1  # one byte past set 1's row
    assert not rows.intact()


@pytest.mark.parametrize("seed", range(20))
def test_generic_instances_cover_every_alignment_class_and_the_small_ranges(seed: int) -> None:
    """Every combination of aligned (multiple of 8) and ragged M, N, K, each in the small ranges
    (M 2..6 or 8, N and K below a tile) and at mid sizes; 1x1x1; M, N and K in 2..6, 2..12 and
    2..16 somewhere; the claimed grid with partial tails and a size past the claim; bounded count."""
    from evaluators.correctness import (MAX_INSTANCES, alignment_class, beyond_claim, class_cover, large_ragged,
                                        ragged_instances)

    claim = Shape(512, 512, 1024, "TN")
    rng = random.Random(seed)
    cover = class_cover(claim, set(), rng)
    assert len(cover) <= MAX_INSTANCES and len(set(cover)) == len(cover)
    assert cover == class_cover(claim, set(), random.Random(seed))  # deterministic by seed
    got = ragged_instances(claim, set(), rng) + cover
    small = [s for s in got if s.m <= 8 and s.n <= 16 and s.k <= 16]
    mid = [s for s in got if s.m > 16 and s.n > 16 and s.k > 16 and s.k < 4096]
    combos = set(itertools.product((True, False), repeat=3))
    assert {alignment_class(s) for s in small if s != Shape(1, 1, 1, "TN")} == combos
    assert {alignment_class(s) for s in mid} == combos
    assert any(2 <= s.m <= 6 for s in got) and any(2 <= s.n <= 12 and s.n % 8 for s in got)
    assert any(2 <= s.k <= 16 and s.k % 8 for s in got) and Shape(1, 1, 1, "TN") in got
    assert any(s.m % 8 == 0 and s.n % 8 == 0 and s.k % 8 for s in got)  # the class the issue found empty
    assert any(s.k >= 4096 for s in got)
    big, past = large_ragged(claim, set(), rng), beyond_claim(claim, set(), rng)
    assert big.m < claim.m and big.n < claim.n and big.k < claim.k
    assert past.m > claim.m and past.n > claim.n and past.k > claim.k
    pitched = beyond_claim(claim, {"K", "N"}, rng)
    assert pitched.n % 8 == 0 and pitched.k % 8 == 0


def test_checked_random_inputs_and_timed_inputs_have_one_distribution() -> None:
    """The checked calls' random inputs and the timed calls' (a rotation after the perturbation)
    have the same magnitudes and signs: the quantiles of |x| and the share of negatives agree."""
    from evaluators.correctness import draw_random, scramble_
    from evaluators.run import _rotation

    shape = Shape(256, 128, 256, "TN")
    gen = torch.Generator().manual_seed(9)
    checked = draw_random(256, 256, gen, torch.device("cpu")).float().flatten()
    rot = _rotation_double()(2, shape)
    scramble_(rot.a_all, gen)  # the rotation is filled as TimingBuffers fills it: uniform, scrambled
    perturb = _rotation._perturber(rot, shape, None, random.Random(5))
    for _ in range(3):
        perturb()
    timed = rot.a_all.float().flatten()
    q = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95])
    assert torch.allclose(torch.quantile(checked.abs(), q), torch.quantile(timed.abs(), q), rtol=0.1)
    assert abs(float((checked < 0).float().mean()) - float((timed < 0).float().mean())) < 0.02
    assert float(checked.abs().max()) < 2 and float(timed.abs().max()) < 2


def _truncating_fp32(a, b_kn):
    """An honest accumulator as tensor cores may build it: fp32, blocks of 16 products, every
    partial sum truncated toward zero (a biased walk, not a rounded one): float64 in, fp16 out."""
    import numpy as np
    x, y = a.double().numpy(), b_kn.double().numpy()
    acc = np.zeros((x.shape[0], y.shape[1]), np.float32)
    for k0 in range(0, x.shape[1], 16):
        exact = acc.astype(np.float64) + x[:, k0:k0 + 16] @ y[k0:k0 + 16]
        f = exact.astype(np.float32)
        over = np.abs(f.astype(np.float64)) > np.abs(exact)
        f[over] = np.nextafter(f[over], np.float32(0))
        acc = f
    return torch.from_numpy(acc).half()


@pytest.mark.parametrize("k", [4096, 65536])
def test_a_truncating_fp32_accumulator_passes_the_hidden_cancellation_and_the_stricter_tolerance(k: int) -> None:
    """No false rejection at long K: sign-coherent partial sums of half of S are judged by the
    exact tolerance alone, in the cascade and on the timed replay; random data by the stricter."""
    from evaluators.correctness import Cascade, Operands
    from evaluators.run import _rotation

    gen = torch.Generator().manual_seed(k)
    ops = Operands.allocate(Shape(16, 16, k, "TN"), 0, False, torch.device("cpu"), gen)
    cas = Cascade(ops, lambda o: o.C.data.copy_(_truncating_fp32(o.A.data, o.b_kn())), lambda: None, gen)
    cas.random()
    cas.cancellation("nan")
    cas.cancellation("finite")
    shape = Shape(32, 16, k, "TN")
    rot = _rotation_double()(2, shape)

    class Truncating(_GraphDouble):
        def replay(self) -> None:
            a = self.rot.a_all.view(-1, shape.m, shape.k)
            b = self.rot.bnk_all.view(-1, shape.n, shape.k)
            self.rot.cc_all.copy_(torch.stack([_truncating_fp32(a[i], b[i].t()) for i in range(2)]).view(2, -1))
    graph = Truncating(rot, shape)
    perturb = _rotation._perturber(rot, shape, None, random.Random(k))
    perturb()
    graph.replay()
    _rotation._check_timed(graph, perturb, rot, shape, "timed replays", lambda: None, random.Random(1))
    assert rot.coherent  # the timed check hid the cancellation test somewhere


def test_random_timed_replays_are_kept_and_verified_after_the_loop() -> None:
    """Outputs of timed replays drawn at random among all of them are verified after the loop:
    a kernel wrong in the loop and right on the replay after it is caught naming the replay."""
    from evaluators.correctness import CheckFailed
    from evaluators.run import _rotation

    shape = Shape(64, 48, 96, "TN")

    class WrongInTheLoop(_GraphDouble):
        def replay(self) -> None:
            super().replay()
            if self.replays <= 20:
                self.rot.cc_all.mul_(1.01)  # 1% off: far outside either tolerance

    for graph_type, caught in ((_GraphDouble, False), (WrongInTheLoop, True)):
        rot = _rotation_double()(4, shape)
        samples = _rotation.TimedSamples(rot, shape, random.Random(3))
        perturb = _rotation._perturber(rot, shape, None, random.Random(4))
        graph = graph_type(rot, shape)
        for _ in range(20):
            samples.note("torch.matmul NN")  # another arm's replay: not kept
            samples.note("candidate")
            perturb()
            graph.replay()
        samples.flush()
        assert len(samples.kept) == _rotation.TIMED_SAMPLES and samples.seen == 20
        _rotation._check_timed(graph, perturb, rot, shape, "timed replays", lambda: None, random.Random(2))
        if caught:
            with pytest.raises(CheckFailed, match="is wrong on timed replay"):
                samples.check("timed replays")
        else:
            samples.check("timed replays")


def test_timed_hidings_use_the_candidates_draws_made_once() -> None:
    """Issue 36's throughput cut: the timed replays' perturbation draws the hidden test once per
    candidate (EMBED_DRAWS of them, at its first hiding) and hides it with one of those each time,
    in a run of sets drawn at random; every hiding's rows are one draw's and cancel exactly there."""
    from unittest import mock

    from evaluators.correctness import cancellation_draws
    from evaluators.run import _rotation

    shape = Shape(40, 24, 64, "TN")
    rot = _rotation_double()(6, shape)
    perturb = _rotation._perturber(rot, shape, None, random.Random(11))
    with mock.patch.object(_rotation, "cancellation_draws", wraps=cancellation_draws) as made:
        seen = []
        for _ in range(60):
            rot.coherent = {}
            perturb.embed()
            seen.append({s: tuple(r.tolist()) for s, r in rot.coherent.items()})
    assert made.call_count == 1 and len(perturb._draws) == _rotation.EMBED_DRAWS
    pool = {tuple(d.picked.tolist()) for d in perturb._draws}
    assert all(rows in pool for hid in seen for rows in hid.values())
    assert len({rows for hid in seen for rows in hid.values()}) > 4  # several draws used, not one
    assert len({tuple(sorted(hid)) for hid in seen}) > 4  # runs of sets drawn per hiding
    m, n, k = shape.m, shape.n, shape.k
    assert rot.coherent
    for s, rows in rot.coherent.items():  # the last hiding's sets
        a = rot.a_all[s, :m * k].view(m, k).double()
        b = rot.bnk_all[s, :n * k].view(n, k).double()
        r = rows.tolist()
        assert torch.equal((a @ b.t())[r], torch.zeros(len(r), n, dtype=torch.float64))
