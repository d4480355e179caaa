"""bench/llm_layers_bench.py on the CPU: sampling and classes, waves and resume of the evolve
stage, the library-path logic, the per-class summary and the issue-26 targets, the report and
its plot from a small results file. The GPU timing itself runs on the device only.
"""
from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import _llm_report as rep  # noqa: E402
import _llm_sample as smp  # noqa: E402
import llm_layers_bench as bench  # noqa: E402

SHARED_CSV = next((p for p in (ROOT.parent / "shared/shapes/llm_layers.csv", ROOT.parent.parent / "shared/shapes/llm_layers.csv")
                   if p.is_file()), None)

#: An llm_layers.csv of our own making, shaped like the shared one: token counts 1/8/64/512/4096
#: over a few models' layers, and one odd-N lm_head (no M=16 rows, no M=4096 lm_head).
MODELS = {"tiny": (576, 1536, 49152), "mid": (2304, 9216, 256000), "big": (4096, 14336, 128256)}


def _write_csv(path: Path) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["M", "N", "K", "model", "layer"])
        for model, (h, f, v) in MODELS.items():
            for m in (1, 8, 64, 512, 4096):
                w.writerow([m, 3 * h, h, model, "qkv"])
                w.writerow([m, h, h, model, "o"])
                w.writerow([m, f, h, model, "up"])
                w.writerow([m, h, f, model, "down"])
                if m <= 512:
                    w.writerow([m, v, h, model, "lm_head"])
        for m in (1, 8, 64, 512):
            w.writerow([m, 50257, 768, "odd", "lm_head"])
    return path


@pytest.fixture
def csv_path(tmp_path: Path) -> Path:
    return _write_csv(tmp_path / "layers.csv")


# -- classes and sampling -----------------------------------------------------------------------
@pytest.mark.parametrize("mnk,classes", [
    ((1, 576, 576), ("decode", "small")), ((16, 4096, 4096), ("decode",)), ((17, 64, 64), ("m17_128", "small")),
    ((128, 4096, 4096), ("m17_128",)), ((129, 4096, 4096), ("m129_1024",)), ((1024, 4096, 4096), ("m129_1024",)),
    ((1500, 4096, 4096), ()), ((2048, 4096, 4096), ("m2048",)), ((512, 50257, 768), ("m129_1024", "misaligned")),
    ((8, 4096, 4100), ("decode", "misaligned")), ((1, 1000, 49999), ("decode", "small", "misaligned")),
])
def test_classes_of(mnk: tuple, classes: tuple) -> None:
    assert smp.classes_of(*mnk) == classes


def _check_sample(rows: list[smp.Row], sample: list[smp.Row], total: int, per_class: int) -> None:
    counts = smp.class_counts(sample)
    assert len(sample) >= total and len({r.key for r in sample}) == len(sample)
    assert all(n >= per_class for n in counts.values()), counts
    assert {r.m for r in sample if "decode" in r.classes} >= {1, 8, 16}
    csv_keys = {r.key for r in rows}
    for r in sample:
        assert (r.origin == "csv") == (r.key in csv_keys)


def test_sample_covers_every_class_with_derived_rows_said_so(csv_path: Path) -> None:
    rows = smp.read_rows(csv_path)
    assert not any(r.m == 16 for r in rows) and sum("misaligned" in r.classes for r in rows) == 4
    pool = smp.candidate_pool(rows, 8)
    assert sum("misaligned" in r.classes for r in pool) == 8  # 4 from the CSV, 4 at more token counts
    assert [r.m for r in pool if r.origin.endswith("x50257x768") and r.m not in (1, 8, 64, 512)] == [16, 4096, 128, 2048]
    assert all(r.origin == "M=16 of 8x{}x{}".format(r.n, r.k) for r in pool if r.m == 16 and r.n != 50257)
    sample = smp.sample(pool, 48, 8, seed=26)
    _check_sample(rows, sample, 48, 8)
    assert smp.sample(pool, 48, 8, seed=26) == sample  # deterministic
    assert smp.sample(pool, 48, 8, seed=27) != sample
    assert len(smp.sample(pool, 10, 8)) > 10  # the classes need more than 10 shapes: they win


@pytest.mark.skipif(SHARED_CSV is None, reason="the shared llm_layers.csv is not beside this checkout")
def test_the_default_sample_of_the_shared_csv() -> None:
    rows = smp.read_rows(SHARED_CSV)
    sample = smp.sample(smp.candidate_pool(rows, 8), 48, 8, 26)
    _check_sample(rows, sample, 48, 8)
    assert len(sample) == 48


def test_waves_spread_the_anchors(csv_path: Path) -> None:
    sample = smp.sample(smp.candidate_pool(smp.read_rows(csv_path)), 48, 8)
    first, rest = smp.waves(sample, 12)
    assert len(first) == 12 and len(first) + len(rest) == len(sample)
    assert {r.mclass for r in first} == {"decode", "m17_128", "m129_1024", "m2048"}
    assert any("misaligned" in r.classes for r in first)
    assert sorted(r.key for r in smp.interleave(sample)) == sorted(r.key for r in sample)


def test_list_prints_the_sample(csv_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--list", "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "48 shapes; per class" in out and "wave 1" in out and "M=16 of 8x" in out
    assert bench.main(["--list", "--csv", str(csv_path.parent / "missing.csv")]) == 2


# -- the evolve stage: waves, transfer seeds, resume ----------------------------------------------
def test_evolve_runs_two_waves_and_resumes(csv_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], float]] = []
    rcs = [0, 1, 0]

    def stand_in_child(cmd: list[str], timeout_s: float, log: Any) -> int:  # test double: no GPU, no evo run
        calls.append((cmd, timeout_s))
        return rcs[len(calls) - 1]
    monkeypatch.setattr(bench, "run_child", stand_in_child)
    argv = ["--csv", str(csv_path), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
            "--stages", "evolve", "--budget", "4m"]
    assert bench.main(argv) == 1  # wave 2 failed
    (w1, t1), (w2, _) = calls
    shapes = lambda cmd: [cmd[i + 1] for i, a in enumerate(cmd) if a == "--shape"]  # noqa: E731
    assert w1[1:4] == ["-m", "evo", "run"] and len(shapes(w1)) == 12 and len(shapes(w2)) == 48
    assert w1[w1.index("--budget") + 1] == "84s" and w2[w2.index("--budget") + 1] == "156s" and t1 == 84 + 240
    assert "--seeds-per-template" not in w1 and w2[w2.index("--seeds-per-template") + 1] == "1"
    state = json.loads((tmp_path / "w" / "state.json").read_text())
    assert state["evolve"]["wave1"]["done"] and not state["evolve"]["wave2"]["done"]
    assert bench.main(argv) == 0  # resumed: only the wave that did not finish runs again
    assert len(calls) == 3 and len(shapes(calls[2][0])) == 48


def test_evolve_stage_through_evo_run_transfers_to_the_second_wave(csv_path: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``evo run`` children (with the test-only stand-in pool, no GPU): wave 2's new
    shapes are seeded from wave 1's elites, and every timed evaluation records its roofline."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))
    monkeypatch.setenv("EVO_FAKE_DELAY_S", "0.005")
    work = tmp_path / "w"
    assert bench.main(["--csv", str(csv_path), "--work", str(work), "--out", str(tmp_path / "o"), "--stages", "evolve",
                       "--budget", "8s", "--total", "10", "--per-class", "1", "--anchors", "3",
                       "--evo-module", "fake_evo"]) == 0
    from evo.search._progress import read_events
    from populations import Archive

    events = read_events(work / "archive" / "events.jsonl")
    starts = [e for e in events if e["event"] == "start"]
    assert [len(e["shapes"]) for e in starts] == [3, 10]
    later = [e for e in events[events.index(starts[1]):] if e["event"] == "seed"]
    # most new shapes start from transferred elites (one whose neighbours' kernels do not apply
    # to it, or whose neighbours had no elite yet on a loaded CPU, may start from templates alone)
    assert len(later) == 7 and sum(e["transferred"] > 0 for e in later) >= 4, later
    with Archive(work / "archive", "r") as ar:
        assert len(ar.shapes()) == 10
        evs = [e for s in ar.shapes() for e in ar.evaluations(s) if "device" in e.timers]
        assert evs and all(e.roofline_frac is not None and e.roofline_frac > 0 for e in evs)


def test_time_stage_resumes_retries_failures_and_skips_a_shape_that_lost_the_context() -> None:
    rows = [smp.Row(1, 64 * i, 64) for i in range(1, 7)]
    have = {rows[0].shape: {"cublas_tn_s": 1e-6}, rows[1].shape: {"notes": "RuntimeError: x"},
            rows[2].shape: {"fatal": True}}
    tried, saves, now = [], [], [0.0]
    current = [have]  # the dict the call under test fills

    def stand_in_timer(row: smp.Row) -> dict[str, Any]:  # test double for the GPU timing of one shape
        tried.append(row.shape)
        # saved as fatal before it runs: a process its watchdog ends leaves the row skipped next time
        assert current[0].get(row.shape, {}).get("fatal")
        now[0] += 1.0
        if row is rows[4]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {**row.to_dict(), "cublas_tn_s": 2e-6, "cublas_nn_s": 3e-6, "evo_s": 1e-6}
    ok = bench.time_shapes(rows, have, stand_in_timer, lambda: saves.append(1), lambda m: None)
    assert not ok and tried == [rows[1].shape, rows[3].shape, rows[4].shape]  # 0 done, 2 fatal, stop at 4
    assert have[rows[4].shape]["fatal"] and rows[5].shape not in have and len(saves) == 6  # before and after each
    tried.clear()
    assert bench.time_shapes(rows, have, stand_in_timer, lambda: None, lambda m: None)
    assert tried == [rows[5].shape]  # the next call goes on with the rest
    tried.clear()
    now[0] = 0.0  # each timing takes 1 s: shapes start at 0 and 1, not at 2
    current[0] = {}
    bench.time_shapes(rows, current[0], stand_in_timer, lambda: None, lambda m: None, cap=1.5, clock=lambda: now[0])
    assert tried == [rows[0].shape, rows[1].shape]


def test_pack_and_restore(tmp_path: Path) -> None:
    work = tmp_path / "w"
    (work / "archive").mkdir(parents=True)
    (work / "archive" / "x.log").write_text("data")
    (work / "archive" / ".lock").write_text("123")
    (work / "state.json").write_text("{}")
    bench.pack(work, tmp_path / "p.tgz")
    again = tmp_path / "w2"
    assert bench.restore(tmp_path / "p.tgz", again)
    assert (again / "archive" / "x.log").read_text() == "data" and (again / "state.json").is_file()
    assert not (again / "archive" / ".lock").exists()
    assert not bench.restore(tmp_path / "p.tgz", again)  # never over an existing archive


# -- which path the library takes -----------------------------------------------------------------
class StandInLibrary:
    """Test double for evo.export._export.EvoLibrary (loading one needs a GPU): routes the shapes it exports."""

    def __init__(self, manifest: dict[str, Any], active: bool = True) -> None:
        self.manifest, self.active, self.reason = manifest, active, "no CUDA device"
        self.kernels = {(e["m"], e["n"], e["k"], e["layout"]): e for e in manifest["kernels"]}

    def route(self, a: Any, b: Any) -> Any:
        key = (a.m, b.n, a.k, "TN")
        return key if key in self.kernels else None


class _T:
    def __init__(self, m: int, n: int, k: int) -> None:
        self.m, self.n, self.k = m, n, k

    def t(self) -> "_T":
        return self


def test_library_path_follows_the_manifest_and_the_route() -> None:
    a, b = smp.Row(1, 4096, 4096), smp.Row(8, 4096, 4096)
    c = smp.Row(64, 4096, 4096)
    manifest = {"kernels": [{"shape": a.shape, "m": 1, "n": 4096, "k": 4096, "layout": "TN", "template": "gemv",
                             "candidate": "abcdef0123456789"},
                            {"shape": c.shape, "m": 64, "n": 4096, "k": 4096, "layout": "TN", "path": "cublas",
                             "reason": "evolved 0.97x: not faster"}],
                "skipped": [{"shape": b.shape, "reason": "no ok, unflagged measurement"}]}
    lib = StandInLibrary(manifest)
    ops = lambda r: (_T(r.m, r.n, r.k), _T(r.m, r.n, r.k))  # noqa: E731
    assert bench.library_path(lib, a, *ops(a)) == ("evolved", "gemv abcdef012345")
    assert bench.library_path(lib, b, *ops(b)) == ("cuBLAS", "no ok, unflagged measurement")
    assert bench.library_path(lib, c, *ops(c)) == ("cuBLAS", "evolved 0.97x: not faster")
    assert bench.library_path(StandInLibrary(manifest, active=False), a, *ops(a))[0] == "cuBLAS"
    assert bench.library_path(None, a, *ops(a)) == ("cuBLAS", "no exported library")
    assert bench.manifest_claim(manifest, "2x2x2:TN:f32") == (None, "not in the manifest")


# -- summary, targets, report ----------------------------------------------------------------------
def _row(m: int, n: int, k: int, cublas_us: float, evo_us: float, peer_us: float | None = None,
         nn_us: float | None = None) -> dict[str, Any]:
    r = smp.Row(m, n, k, "model", "layer").to_dict()
    r.update(cublas_tn_s=cublas_us * 1e-6, cublas_nn_s=(nn_us or cublas_us * 1.1) * 1e-6, evo_s=evo_us * 1e-6,
             evo_path="evolved")
    if peer_us is not None:
        r["peer_s"] = peer_us * 1e-6
    return r


def _fake_rows() -> list[dict[str, Any]]:
    return [
        _row(1, 4096, 4096, 14.06, 8.6, 9.93),          # decode, big weights: 0.87 of the roofline, beats the peer
        _row(1, 768, 3072, 7.28, 3.5, 3.15),            # decode, small: slower than the peer (0.9x of it)
        _row(8, 2304, 768, 4.0, 4.0, 3.0),              # decode + small
        _row(512, 4096, 4096, 60.0, 50.0),              # M 129-1024
        _row(4096, 4096, 4096, 200.0, 205.0, nn_us=190.0),  # compute bound, cuBLAS at 0.92 of the roofline
        _row(64, 50257, 768, 40.0, 16.0),               # misaligned
    ]


def test_derive_takes_the_better_cublas_layout_and_the_issue_roofline() -> None:
    d = rep.derive(_row(4096, 4096, 4096, 200.0, 205.0, nn_us=190.0))
    assert d["cublas_layout"] == "NN" and d["cublas_s"] == pytest.approx(190e-6)
    assert d["cublas_roof"] == pytest.approx(2 * 4096 ** 3 / 790e12 / 190e-6)
    assert d["evo_x"] == pytest.approx(190 / 205)
    one = rep.derive(_row(1, 4096, 4096, 14.06, 8.6, 9.93))
    # the issue's 0.555 was against a copy's 4.3 TB/s; the roofline now uses HBM's 4.5 TB/s read rate
    assert one["cublas_roof"] == pytest.approx(0.555 * 4.3 / 4.5, abs=0.003) and one["evo_vs_peer"] == pytest.approx(9.93 / 8.6)


def test_class_summary_and_targets_say_what_is_met_and_by_how_much() -> None:
    rows = [rep.derive(r) for r in _fake_rows()]
    classes = {c["class"]: c for c in rep.class_summary(rows)}
    assert classes["decode"]["shapes"] == 3 and classes["small"]["shapes"] == 3  # 1x4096x4096 is 3.4e7 FLOP
    assert classes["decode"]["evo_x"] == pytest.approx(rep.geomean([14.06 / 8.6, 7.28 / 3.5, 1.0]))
    assert classes["m2048"]["met"] is False and classes["m2048"]["min_shape"].startswith("4096x4096x4096")
    t = {x["target"]: x for x in rep.targets(rows)}
    peer = t["every decode row >= the plain peer"]
    assert peer["met"] is False and peer["value"] == pytest.approx(3.0 / 4.0) and peer["missed_by"] == pytest.approx(0.25)
    assert sorted(peer["failing"]) == sorted([rows[1]["shape"], rows[2]["shape"]])
    roof = t["decode, weights >= 8 MB: >= 0.85 of the roofline"]
    assert roof["shapes"] == 1 and roof["met"] is True  # 1x4096x4096 at 0.87
    replaced = t["cuBLAS >= 0.8 of the roofline: evo >= 0.85"]
    assert replaced["shapes"] == 1 and replaced["value"] == pytest.approx(2 * 4096 ** 3 / 790e12 / 205e-6)
    assert replaced["met"] is (replaced["value"] >= 0.85)
    compute = t["compute-bound (>= 1e12 FLOP) >= 1.0x"]
    assert compute["shapes"] == 0 and compute["met"] is None  # its only shape is judged by the roofline
    never = t["never slower than cuBLAS (>= 0.98x), roofline rule applied"]
    assert never["met"] is True and never["shapes"] == 5  # 4096^3 (0.93x) is judged by the roofline rule instead
    strict = t["never slower, strict: >= 0.98x of the better layout on every shape"]
    assert strict["met"] is False and strict["failing"] == [rows[4]["shape"]] and strict["shapes"] == 6
    assert t["never slower than cuBLAS in the caller's layout (TN): >= 0.98x"]["value"] == pytest.approx(200 / 205)
    m1 = t["under 1e8 FLOP, M=1 >= 1.8x"]
    gm = rep.geomean([14.06 / 8.6, 7.28 / 3.5])
    assert m1["shapes"] == 2 and m1["value"] == pytest.approx(gm) and m1["met"] is (gm >= 1.8)


def test_never_slower_says_which_rule_judged_a_row_with_both_layouts() -> None:
    """64x128256x4096 on 2026-12-01: the library fell back to cuBLAS TN (284.46 us) where cuBLAS NN
    took 254.90: 0.90x of the better layout, 1.00x of the caller's; cuBLAS is at 0.93 of the
    roofline, so the roofline rule judges it, and the fallback reaches 0.83 of it (< 0.85)."""
    fell = rep.derive({**_row(64, 128256, 4096, 284.46, 284.46, nn_us=254.90), "evo_path": "cuBLAS"})
    v = rep.never_slower(fell)
    assert fell["evo_x"] == pytest.approx(254.90 / 284.46) and fell["evo_x_tn"] == pytest.approx(1.0)
    assert v["rule"] == "roofline" and v["met"] is False
    assert v["text"] == ("roofline rule: cuBLAS at 0.93 of the roofline, evo 0.83 < 0.85 "
                         "(0.90x of the better layout (NN), 1.00x of TN)")
    slow = rep.never_slower(rep.derive(_row(512, 4096, 4096, 60.0, 64.0)))  # cuBLAS at 0.3 of the roofline
    assert slow["rule"] == "speed" and slow["met"] is False and slow["text"].endswith("of TN; < 0.98x")
    assert rep.never_slower(rep.derive(_row(512, 4096, 4096, 60.0, 59.5)))["met"] is True
    assert rep.never_slower(rep.derive({**_row(8, 64, 64, 4.0, 4.0), "evo_s": None})) is None
    md = rep.markdown([fell], {})
    assert "| **missed**: roofline rule: cuBLAS at 0.93 of the roofline, evo 0.83 < 0.85" in md
    assert "| 0.90x | 1.00x | 0.83 |" in md and "bytes/4.5e12" in md


def test_report_and_plot_from_a_results_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _fake_rows()
    rows.append({**smp.Row(16, 6144, 4096).to_dict(), "notes": "RuntimeError: lost"})  # a shape that failed
    rows[1]["evo_rel_err"] = math.inf
    src = tmp_path / "results.json"
    src.write_text(json.dumps(rep.clean({"meta": {"gpu": "stand-in"}, "rows": rows})))
    assert bench.main(["--summarize", str(src), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "summary.md").read_text()
    assert "| 1x4096x4096 |" in md and "**missed** by 0.250" in md and "| decode (M <= 16) | 4 | 3 |" in md
    png = tmp_path / "o" / "speedup_vs_roofline.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert {c["class"] for c in summary["classes"]} == set(smp.CLASSES) and summary["targets"]
    assert bench.main(["--summarize", str(tmp_path / "none.json"), "--out", str(tmp_path / "o")]) == 2


@pytest.mark.gpu
def test_the_timer_on_a_gpu() -> None:
    """On a GPU: both cuBLAS layouts timed over a rotation > 2x L2, a plausible time, and the
    error check tells a right product from a wrong one."""
    import torch

    import _llm_timer as tm

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = tm.Sets(8, 4096, 4096, l2)
    assert sets.bytes > 2 * l2
    ref = sets.reference()
    assert tm.rel_error(torch.matmul(sets.a[0], sets.w[0].t()), ref) < tm.REL_TOL
    assert tm.rel_error(torch.zeros_like(sets.c[0]), ref) > 0.5
    t = tm.time_arms({"tn": lambda i: torch.matmul(sets.a[i], sets.w[i].t(), out=sets.c[i]),
                      "nn": lambda i: torch.matmul(sets.a[i], sets.wt[i], out=sets.c[i])}, sets.n_sets, rounds=3)
    roof = 2 * (8 * 4096 + 4096 * 4096 + 8 * 4096) / 4.5e12
    assert all(roof / 1.3 < v < 1e-3 for v in t.values()), t
