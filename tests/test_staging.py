"""The alignment transform (populations/_plan.py "staging", populations/_staging.py): plans that
copy a ragged operand into an aligned workspace buffer before the main kernel reads it with TMA.

CPU tests: the workspace layout and pitches, validation, serialisation, the templates' rendering
and first picks at ragged shapes, the binder's staged pointers (a test-double loader), the export
launcher's text, and real NVRTC compiles of every first pick seeding emits on drawn ragged shapes.
The GPU test runs staged first picks through the evaluator (tests marked ``gpu``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from populations import LaunchPlan, PlanError, Shape, TensorMapSpec, load_templates

sys.path.insert(0, str(Path(__file__).parent))

STAGED = ("sm90_wgmma", "streamk90")


@pytest.fixture(scope="module")
def templates():
    return load_templates()


def staged_pick(t, s: Shape) -> dict:
    """The first of ``t``'s first picks at ``s`` that stages (sm90_wgmma's picks for M 17-256 with
    wide weights include one that reads a ragged K in place: ``RAGGED``, tests/test_template_sm90.py)."""
    return next(k for k in t.heuristic(s, 90) if not k.get("RAGGED"))


def plan(staging: dict, workspace: object = 0, maps: dict | None = None, args: tuple = ("stagedA", "C", "M")) -> LaunchPlan:
    return LaunchPlan.from_dict({
        "launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "args": list(args)}],
        "workspace": workspace, "staging": staging, "tensor_maps": maps or {}})


def test_layout_follows_the_own_workspace_aligned_and_sized():
    p = plan({"A": 64, "B": 8}, workspace="M * 4 + 3")
    s = Shape(77, 1001, 1001, "TN", "f32")
    a, b = p.staged_copies(s)
    assert (a.operand, a.rows, a.cols, a.pitch) == ("A", 77, 1001, 1024)
    assert (b.operand, b.rows, b.cols, b.pitch) == ("B", 1001, 1001, 1008)
    assert a.offset == 512 and a.offset % 256 == 0 and a.offset >= 77 * 4 + 3
    assert b.offset % 256 == 0 and b.offset >= a.offset + a.nbytes
    _, ws = p.resolve(s)
    assert ws == b.offset + b.nbytes
    assert p.pitches(s) == {"lda": 1001, "ldb": 1001, "ldc": 1001, "ldsa": 1024, "ldsb": 1008}


def test_nn_stages_b_by_its_n_pitch():
    p = plan({"B": 64}, args=("stagedB", "ldsb"))
    s = Shape(64, 1001, 512, "NN", "f32")
    (b,) = p.staged_copies(s)
    assert (b.rows, b.cols, b.pitch, b.offset) == (512, 1001, 1024, 0)
    (launch,), ws = p.resolve(s)
    assert launch.args == ("stagedB", 1024) and ws == 512 * 1024 * 2


@pytest.mark.parametrize("staging, maps, args, words", [
    ({"C": 8}, {}, ("C",), "only A and B"),
    ({"A": 12}, {}, ("stagedA",), "multiple of 8"),
    ({"A": 512}, {}, ("stagedA",), "multiple of 8"),
    ({}, {}, ("stagedA",), "does not stage A"),
    ({"A": 8}, {"t": {"matrix": "A", "box": [64, 64], "staged": 64}}, ("stagedA",), "stages A as 8"),
    ({}, {"t": {"matrix": "B", "box": [64, 64], "staged": 64}}, ("C",), "stages B as nothing"),
])
def test_invalid_staging_is_refused(staging, maps, args, words):
    with pytest.raises(PlanError, match=words):
        plan(staging, maps=maps, args=args)


def test_unstaged_plans_serialise_as_before_and_staged_ones_round_trip():
    old = plan({}, args=("A", "C"))
    assert "staging" not in old.to_dict()
    assert "staged" not in TensorMapSpec("A", (64, 64)).to_dict()
    new = plan({"A": 64}, maps={"t": {"matrix": "A", "box": [64, 64], "staged": 64}})
    again = LaunchPlan.from_dict(new.to_dict())
    assert again == new and again.tensor_maps["t"].pointer == "stagedA"


@pytest.mark.parametrize("name", STAGED)
@pytest.mark.parametrize("text, want", [
    ("777x1536x2883", {"A", "B"}), ("512x4096x1033", {"A", "B"}), ("300x1001x2050:NN", {"A", "B"}),
    ("300x1000x2050:NN", {"A"}), ("300x1001x2048:NN", {"B"}), ("512x4100x4096", set()),
])
def test_first_picks_stage_exactly_the_ragged_operands(templates, name, text, want):
    t, s = templates[name], Shape.parse(text)
    if not t.applicable(s, 90):
        pytest.skip(f"{name} is not meant for {s}")
    picks = t.heuristic(s, 90)
    assert picks
    for k in picks:
        for specialize in (False, True):
            cand = t.candidate(k, s, specialize=specialize)
            if k.get("RAGGED"):  # reads the ragged K in place: no copy, no tensor map
                assert want and not cand.plan.staging and not cand.plan.tensor_maps
                continue
            assert set(cand.plan.staging) == want
            launches, ws = cand.plan.resolve(s)
            kernels = [ln.kernel for ln in launches]
            assert all(k.startswith("evo_stage") for k in kernels[:len(kernels) - (1 + kernels[-1].endswith("reduce"))])
            staged_maps = {m.matrix for m in cand.plan.tensor_maps.values() if m.staged}
            assert staged_maps == want
            if want:  # the pre-pass writes each copy whole: rows x pitch of the staged buffer
                first = launches[0]
                assert first.kernel in ("evo_stage", "evo_stage2")
                copies = {c.operand: c for c in cand.plan.staged_copies(s)}
                ints = [a for a in first.args if isinstance(a, int)]
                for op in sorted(want):
                    c = copies[op]
                    assert [c.rows, c.cols, c.pitch] == ints[:3] or [c.rows, c.cols, c.pitch] == ints[3:6]
                assert ws >= max(c.offset + c.nbytes for c in copies.values())


def test_mutation_keeps_or_repairs_staging(templates):
    """A knob set moved to a ragged shape gets the staging it needs from ``fitted``."""
    t = templates["sm90_wgmma"]
    aligned, ragged = Shape.parse("1024x1024x1024"), Shape.parse("1024x1024x1027")
    k = t.heuristic(aligned, 90)[0]
    assert k["STAGE"] == "none" and t.check(k, ragged, 90)
    fixed = t.fitted(k, ragged)
    assert fixed["STAGE"] == "AB" and not t.check(fixed, ragged, 90)
    assert {x: fixed[x] for x in k if x != "STAGE"} == {x: k[x] for x in k if x != "STAGE"}


@pytest.mark.parametrize("name", STAGED)
def test_an_aligned_pitch_is_staged_only_off_a_sector_on_a_large_product(templates, name):
    """RESULTS 27 (k): a pitch 16 bytes off a 32-byte sector (K % 16 == 8) costs the big tiles
    22-30%; staging it onto 128 bytes is allowed where the copies cost little (M * N >= 3000 *
    (M + N)), with STAGE_PITCH 64 only, and nowhere else on an aligned pitch."""
    t = templates[name]
    big, small, on = Shape.parse("5247x12016x2376"), Shape.parse("4096x8192x4088"), Shape.parse("5247x12016x2368")
    base = t.heuristic(big, 90)[-1]
    for stage in ("A", "B", "AB"):
        k = dict(base, STAGE=stage, STAGE_PITCH=64)
        assert not t.check(k, big, 90), (stage, t.check(k, big, 90))
        assert t.fitted(k, big)["STAGE"] == stage  # a pick that stages on purpose keeps it
        assert t.check(dict(k, STAGE_PITCH=8), big, 90)  # pitch 8 would change nothing
        assert any("aligned already" in r for r in t.check(k, small, 90))  # the copies cost too much
        assert any("aligned already" in r for r in t.check(k, on, 90))  # a 128-byte pitch already
    nn = Shape.parse("8192x8192x1032:NN")  # NN: B's pitch is N (aligned to 128 bytes)
    if t.check(dict(base, STAGE="A", STAGE_PITCH=64), nn, 90) == []:
        assert t.check(dict(base, STAGE="B", STAGE_PITCH=64), nn, 90)
    ragged = Shape.parse("6000x7000x1001")  # a ragged K still stages exactly what it must
    assert t.fitted(dict(base, STAGE="A", STAGE_PITCH=64), ragged)["STAGE"] == "AB"


def test_the_big_off_sector_rows_get_a_staged_pick_after_the_cluster(templates):
    """sm90_wgmma at M, N >= 2048, K % 16 == 8, large: the 2 x 1 cluster first, then the same tile
    unclustered on copies with a 128-byte pitch (TN: both; NN: A), then unclustered in place."""
    t = templates["sm90_wgmma"]
    s = Shape.parse("5247x12016x2376")
    picks = t.heuristic(s, 90)
    assert [(k["CLUSTER_M"], k["STAGE"]) for k in picks[:3]] == [(2, "none"), (1, "AB"), (1, "none")]
    cand = t.candidate(picks[1], s)
    assert cand.plan.staging == {"A": 64, "B": 64}
    copies = {c.operand: c for c in cand.plan.staged_copies(s)}
    assert copies["A"].pitch == copies["B"].pitch == 2432 and copies["A"].rows == 5247 and copies["B"].rows == 12016
    _, ws = cand.plan.resolve(s)
    assert ws >= 2 * 2432 * (5247 + 12016)
    nn = t.heuristic(Shape.parse("8192x8192x1032:NN"), 90)
    assert [(k["CLUSTER_M"], k["STAGE"]) for k in nn[:2]] == [(2, "none"), (1, "A")]
    for text in ("4096x8192x4088", "5247x12016x2368", "1024x1024x1032"):
        assert all(k["STAGE"] == "none" for k in t.heuristic(Shape.parse(text), 90)), text


def test_the_staged_off_sector_pick_compiles(templates):
    """NVRTC for sm_90a, the static and PTX scans, no spills: the pick and its pre-pass."""
    pytest.importorskip("cuda.bindings")
    from evaluators import CompilePool

    t, s = templates["sm90_wgmma"], Shape.parse("5247x12016x2376")
    cand = t.candidate(t.heuristic(s, 90)[1], s)
    with CompilePool(workers=1, use_cache=False) as pool:
        r = pool.submit(cand, "sm_90a").result()
    assert r.ok, r.message[-300:]
    assert set(cand.plan.kernel_names) <= {k.name for k in r.kernels} and "evo_stage2" in cand.plan.kernel_names
    assert not any(k.spill_stores or k.stack_frame for k in r.kernels)


class _Loader:
    """Test double for the driver loader (a boundary we do not own): records launches."""

    def __init__(self) -> None:
        self.launched: list[tuple[str, list]] = []

    def load(self, cubin: bytes) -> str:
        return "module"

    def function(self, module: str, name: str, smem: int) -> str:
        return name

    def param_layout(self, fn: str) -> None:
        return None

    def launcher(self, fn: str, grid: tuple, block: tuple, smem: int):
        def go(stream: int, pack) -> None:
            self.launched.append((fn, [pack.arg_bytes(i) for i in range(len(pack))]))
        return go


def test_the_binder_points_staged_arguments_into_the_workspace(templates):
    pytest.importorskip("torch")
    from evaluators.run._kernels import CandidateKernels
    from evaluators.run._tmap import TmapCache

    t, s = templates["sm90_wgmma"], Shape.parse("777x1536x2883")
    cand = t.candidate(staged_pick(t, s), s)
    encoded: list[tuple[str, int, int]] = []

    def encode(spec, shape, address):  # test double for cuTensorMapEncodeTiled
        from evaluators.run._tmap import tmap_geometry
        encoded.append((spec.matrix, address, tmap_geometry(spec, shape).global_strides[0]))
        return bytes(128)

    loader = _Loader()
    kernels = CandidateKernels(loader, b"", cand.plan, TmapCache(encode=encode))
    import evaluators.run._kernels as km
    km_getter = km._raw_stream_getter
    km._raw_stream_getter = lambda: (lambda: 0)
    try:
        call, ws, n = kernels.bind(s)
    finally:
        km._raw_stream_getter = km_getter
    base = 1 << 40
    call({"A": 0x1000, "B": 0x2000, "C": 0x3000, "workspace": base}, None)
    a, b = cand.plan.staged_copies(s)
    stage, main = loader.launched[0], loader.launched[1]
    assert stage[0] == "evo_stage2"
    ptrs = [int.from_bytes(x, "little") for x in stage[1] if len(x) == 8]
    assert ptrs == [0x1000, base + a.offset, 0x2000, base + b.offset]
    assert sorted(encoded) == sorted([("A", base + a.offset, a.pitch * 2), ("B", base + b.offset, b.pitch * 2)])
    assert ws == b.offset + b.nbytes


def test_export_launcher_passes_the_staged_pointers(templates):
    from evo.export._export_source import launcher

    t, s = templates["sm90_wgmma"], Shape.parse("777x1536x2883")
    cand = t.candidate(staged_pick(t, s), s)
    text, ws = launcher(s, cand, list(cand.plan.kernel_names))
    a, b = cand.plan.staged_copies(s)
    assert f"(char*)workspace + {a.offset}ull" in text and f"(char*)workspace + {b.offset}ull" in text
    assert f"pitch[1] = {{{a.pitch * 2}ull}}" in text and ws == b.offset + b.nbytes
    assert "if (workspace == nullptr) return -3;" in text


def test_every_first_pick_on_the_random_sets_misaligned_shapes_compiles(templates):
    """Every first pick seeding emits, of every template, at the misaligned shapes of the random-shape
    benchmark's seed-1 draw (bench/_rand_shapes.py), for sm_90a and sm_80 where the template applies:
    NVRTC, the static and PTX scans, the ptxas policy, no spills; staged picks carry their pre-pass
    kernels. Sources shared across shapes compile once."""
    pytest.importorskip("cuda.bindings")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import _rand_shapes
    from evaluators import CompilePool
    from template_compile import first_pick_jobs

    shapes = [r.shape for r in _rand_shapes.generate(1) if r.n % 8 or r.k % 8]
    assert len(shapes) >= 30
    jobs = first_pick_jobs(templates, shapes, samples=0, archs=("sm_90a", "sm_80"))
    assert sum(1 for _, _, c in jobs if c.plan.staging) >= 8 and {a for _, a, _ in jobs} == {"sm_90a", "sm_80"}
    with CompilePool(workers=2, use_cache=False) as pool:
        done = [(n, a, c, f.result()) for n, a, c, f in [(n, a, c, pool.submit(c, a)) for n, a, c in jobs]]
    failed = [(n, a, c.knobs, r.status, r.message[-300:]) for n, a, c, r in done if not r.ok]
    assert not failed, failed
    spilled = [(n, a, c.knobs) for n, a, c, r in done if any(k.spill_stores or k.stack_frame for k in r.kernels)]
    assert not spilled, spilled
    for _, _, c, r in done:
        assert set(c.plan.kernel_names) <= {k.name for k in r.kernels}


@pytest.mark.gpu
def test_staged_first_picks_are_ok_in_the_evaluator(templates):
    """Correctness cascade (generic ragged instances included), hack checks and the device timer
    on staged plans, TN and NN."""
    from evaluators import LocalPool

    cands = []
    for text in ("777x1536x2883", "300x1001x2050:NN", "65x8191x2057", "129x260x1030:NN"):
        s = Shape.parse(text)
        for n in STAGED:
            t = templates[n]
            if t.applicable(s, 90):
                cands.append(t.candidate(staged_pick(t, s), s))
    # an aligned pitch staged on purpose (K % 16 == 8 on a large product): sm90_wgmma's second pick
    off = Shape.parse("6007x6500x1032")
    pick = next(k for k in templates["sm90_wgmma"].heuristic(off, 90) if k["STAGE"] != "none")
    cands.append(templates["sm90_wgmma"].candidate(pick, off))
    with LocalPool(gpus=[0], compile_workers=4) as pool:
        results = [(c, f.result()) for c, f in [(c, pool.submit(c)) for c in cands]]
    bad = [(str(c.shapes[0]), c.template, e.status.value, e.flags, e.message[:200])
           for c, evs in results for e in evs if e.status.value != "ok" or e.flags]
    assert not bad, bad


@pytest.mark.parametrize("fused", [True, False])
def test_prepared_b_launcher_copies_only_a(templates, fused):
    """The launcher for a B padded once: B's tensor map reads the caller's pointer with the caller's
    pitch, no pre-pass copies B, and A is still copied (fused AB replaced by evo_stage of A)."""
    from evo.export._export import _unit_kernels
    from evo.export._export_source import launcher, prepared_b

    t, s = templates["sm90_wgmma"], Shape.parse("777x1536x2883")
    knobs = {**staged_pick(t, s), "STAGE_FUSED": fused}
    cand = t.candidate(knobs, s)
    kernels = _unit_kernels(cand)
    assert "evo_stage" in kernels and prepared_b(cand, s).cols == 2883
    plain, _ = launcher(s, cand, kernels)
    text, _ = launcher(s, cand, kernels, prepared=True)
    a, b = cand.plan.staged_copies(s)
    assert f'int evo_hgemm_{s.key}_wb(const void* A, const void* B, long long ldb, void* C' in text
    assert "if (ldb < 2883 || ldb % 8) return -5;" in text
    assert "pitch[1] = {(cuuint64_t)ldb * 2ull}" in text and f"pitch[1] = {{{a.pitch * 2}ull}}" in text
    assert f"(char*)workspace + {b.offset}ull" not in text and f"(char*)workspace + {a.offset}ull" in text
    stage = f"evo_{s.key}_kernel_{kernels.index('evo_stage')}()"
    assert text.count("cudaLaunchKernel") == plain.count("cudaLaunchKernel") - (0 if fused else 1)
    assert stage in text and "evo_stage2" not in [k for k in kernels if f"kernel_{kernels.index(k)}()" in text]
    # the A copy's grid: one 256-thread block per 256 vectors of A's copy
    vectors = 777 * (a.pitch // 8)
    assert f"dim3({min(-(-vectors // 256), 1056)}, 1, 1), dim3(256, 1, 1)" in text


def test_no_prepared_b_launcher_without_a_staged_b(templates):
    from evo.export._export_source import launcher, prepared_b

    t, s = templates["sm90_wgmma"], Shape.parse("512x4096x1024")
    cand = t.candidate(staged_pick(t, s), s)
    assert prepared_b(cand, s) is None
    with pytest.raises(ValueError, match="does not stage B"):
        launcher(s, cand, list(cand.plan.kernel_names), prepared=True)


def test_extern_c_kernels_finds_every_kernel_launched_or_not():
    from evo.export._export_source import extern_c_kernels

    src = ('extern "C" __global__ void __launch_bounds__(256, 1) EVO_CLUSTER\nk_one(int* p) {}\n'
           'extern "C" __global__ void k_two(const __grid_constant__ int x) { }\n'
           '__global__ void not_c(int* p) {}\nextern "C" int host_fn(int x) { return x; }\n')
    assert extern_c_kernels(src) == ["k_one", "k_two"]


def test_a_library_of_staged_kernels_links(tmp_path):
    """Every staged unit defines evo_stage and evo_stage2 (extern "C", one of them unlaunched): the
    export renames both per shape, so units link together (a real nvcc build)."""
    import shutil

    from archive_fixture import ok as ok_eval
    from evo.export._export import NVCC, export
    from populations import Archive
    if not Path(NVCC).exists() and not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    t = load_templates()["sm90_wgmma"]
    with Archive(tmp_path / "arch", "w") as a:
        for text in ("777x1536x2883", "512x4096x1001"):
            s = Shape.parse(text)
            c = t.candidate(staged_pick(t, s), s)
            a.record(c, [ok_eval(c, s, 1.5)])
    manifest = export(tmp_path / "arch", tmp_path / "lib")
    assert manifest.skipped == () and len(manifest.kernels) == 2
    # both stage B (K % 8 != 0): each has a launcher for a B padded once, in the library
    preps = {e.shape: e.prepared_b for e in manifest.kernels}
    assert all(p and p.symbol.endswith("_wb") for p in preps.values()), preps
    nm = shutil.which("nm")
    if nm:
        import subprocess

        syms = subprocess.run([nm, "-D", "--defined-only", str(tmp_path / "lib" / "libevo_hgemm.so")],
                              capture_output=True, text=True, check=True).stdout
        assert all(p.symbol in syms for p in preps.values())


@pytest.mark.gpu
def test_prepared_weights_give_the_same_product(tmp_path):
    """A library of staged kernels on the GPU: ``evo_hgemm(a, w.t())`` and ``evo_hgemm(a,
    prepare_weight(w))`` (B padded once, only A copied per call) both match an fp32 reference,
    whatever lies in the padding."""
    import torch

    from archive_fixture import ok as ok_eval
    from evo.export._export import export, load_library
    from populations import Archive

    t = load_templates()["sm90_wgmma"]
    texts = ("777x1536x2883", "64x4096x1001")
    with Archive(tmp_path / "arch", "w") as a:
        for text in texts:
            s = Shape.parse(text)
            c = t.candidate(staged_pick(t, s), s)
            a.record(c, [ok_eval(c, s, 1.5)])
    export(tmp_path / "arch", tmp_path / "lib")
    lib = load_library(tmp_path / "lib")
    assert lib.active, lib.reason
    g = torch.Generator(device="cuda").manual_seed(7)
    for text in texts:
        s = Shape.parse(text)
        a = torch.randn(s.m, s.k, device="cuda", generator=g).half()
        w = torch.randn(s.n, s.k, device="cuda", generator=g).half()
        ref = (a.float() @ w.float().t())
        pw = lib.prepare_weight(w)
        assert pw.padded is not None and pw.padded.stride(0) % 64 == 0
        pw.padded[:, s.k:] = float("nan")  # never read: the tensor map stops at K
        for out in (lib.evo_hgemm(a, w.t()), lib.evo_hgemm(a, pw)):
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 2e-3, (text, err)
    assert lib.prepare_weight(torch.randn(96, 64, device="cuda").half()).padded is None  # not exported


@pytest.mark.gpu
def test_patched_linear_holds_its_weight_padded_once(tmp_path):
    """``evo.torch.patch`` on an ``nn.Linear`` whose kernel stages B (K % 8 != 0): the module holds
    its weight padded once, calls ``linear_prepared`` (an evolved kernel, no fallback), matches
    F.linear, and pads again after the weight changes in place (no stale copy in use)."""
    import torch

    from archive_fixture import ok as ok_eval
    from evo.export._export import export, load_library
    from evo.torch import call_counts, patched, reset_counts
    from populations import Archive

    t = load_templates()["sm90_wgmma"]
    s = Shape.parse("64x4096x1001")
    with Archive(tmp_path / "arch", "w") as a:
        c = t.candidate(staged_pick(t, s), s)
        a.record(c, [ok_eval(c, s, 1.5)])
    export(tmp_path / "arch", tmp_path / "lib")
    lib = load_library(tmp_path / "lib")
    assert lib.active, lib.reason
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(s.k, s.n, bias=True)).half().cuda().eval()
    x = torch.randn(s.m, s.k, device="cuda").half()

    def check(got):
        ref = torch.nn.functional.linear(x.float(), model[0].weight.float(), model[0].bias.float())
        assert ((got.float() - ref).norm() / ref.norm()).item() < 2e-3

    with torch.no_grad(), patched(model, lib) as report:
        assert report.prepared == ["0"], str(report)
        pad = model[0]._evo_wpad
        assert pad is not None and pad.stride(0) % 64 == 0 and torch.equal(pad[:, :s.k], model[0].weight)
        reset_counts()
        check(model(x))
        model[0].weight.mul_(-0.5)  # in place: the version counter moves, the copy is made again
        check(model(x))
        assert torch.equal(model[0]._evo_wpad[:, :s.k], model[0].weight)
        torch.cuda.synchronize()
        assert call_counts() == (2, 0)




def test_transfer_from_an_aligned_neighbour_stages_a_ragged_target(templates):
    """An elite of an aligned shape moved to a ragged one keeps its tile and gets the staging the
    target needs (the template's fit rule), instead of failing the target's constraints."""
    from evo.search._transfer import transfer_candidates

    t = templates["sm90_wgmma"]
    near, target = Shape.parse("1024x1024x1024"), Shape.parse("1024x1024x1027")
    elite = t.candidate(t.heuristic(near, 90)[0], near)
    from archive_fixture import ok as ok_eval

    got = transfer_candidates(target, [near], lambda s, n: [(elite, ok_eval(elite, near, 1.1))], {"sm90_wgmma": t})
    assert len(got) == 1 and got[0].knobs["STAGE"] == "AB" and set(got[0].plan.staging) == {"A", "B"}
    assert {k: v for k, v in got[0].knobs.items() if k != "STAGE"} == \
        {k: v for k, v in elite.knobs.items() if k != "STAGE"}


def test_valid_knob_sets_have_plans_that_resolve_at_huge_ragged_shapes(templates):
    """The whole workspace (the template's own and the staged copies) is a rule: a knob set every
    other rule allows (split-K 12 with both operands staged at 4754x18757x1849, drawn by the seeds
    of the random-shape benchmark) is refused by the rules instead of by the plan's 4 GiB limit."""
    import random

    t = templates["sm90_wgmma"]
    s = Shape.parse("4754x18757x1849")
    big = {"BK": 64, "BM": 256, "BN": 128, "CLUSTER_M": 1, "CONSUMERS": 2, "EPI": "direct", "GROUP": 16,
           "PERSISTENT": False, "RASTER": "N", "SCHED": "coop", "SPLIT_K": 12, "STAGE": "AB", "STAGES": 2,
           "STAGE_FUSED": False, "STAGE_PITCH": 64}
    assert any("workspace" in why for why in t.check(big, s))
    assert not t.check(dict(big, SPLIT_K=8), s)
    for name, tpl in sorted(templates.items()):
        for text in ("4754x18757x1849", "8191x16383x4097:NN", "3000x20001x2999"):
            shape = Shape.parse(text)
            if not tpl.applicable(shape, 90):
                continue
            for knobs in tpl.sample(random.Random(0), shape, 60, 90):
                tpl.candidate(knobs, shape).plan.resolve(shape)  # raises PlanError where a rule is missing
