"""bench/random_shapes_bench.py on the CPU (issue 34): the generator (deterministic per seed, its
distributions, quotas and caps), ``--list``, bad arguments, the evolve stage's command and resume,
the pad peer called in-process, the best evolved kernel per shape, and the report with its
targets from a results file made here. The GPU timing itself runs on the device only.
"""
from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import _rand_report as rrep  # noqa: E402
import _rand_shapes as gen  # noqa: E402
import _rand_time as rtime  # noqa: E402
import random_shapes_bench as bench  # noqa: E402

SEEDS = (1, 2, 34, 2026)


# -- the generator ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_the_generator_is_deterministic_per_seed_and_meets_its_quotas(seed: int) -> None:
    rows = gen.generate(seed)
    assert rows == gen.generate(seed) and [r.origin for r in rows] == [r.origin for r in gen.generate(seed)]
    assert [r.key for r in rows] != [r.key for r in gen.generate(seed + 1)]
    assert len(rows) >= 100 and len({r.key for r in rows}) == len(rows)
    assert sum(r.m <= 16 for r in rows) >= 15
    assert sum(64 <= r.m <= 2047 for r in rows) >= 25
    assert sum(2 * r.m * r.n * r.k >= 1e11 for r in rows) >= 10
    assert sum(bool(r.n % 8 or r.k % 8) for r in rows) >= 0.30 * len(rows)
    for r in rows:
        assert 1 <= r.m <= 16384 and 64 <= r.n <= 32768 and 64 <= r.k <= 32768 and r.shape.endswith(":TN:f32")
        assert 2 * r.m * r.n * r.k <= gen.MAX_FLOP and 2 * (r.m * r.k + r.n * r.k + r.m * r.n) <= gen.MAX_OPERAND_BYTES
    # the quota rows come after the plain draws, each in its class
    rules = {name: rule for name, (_, rule) in gen.QUOTAS.items()}
    for r in rows[100:]:
        name = r.origin.split(",")[0].removeprefix("quota ")
        assert name == "misaligned" and "misaligned" in r.classes or rules[name](r.m, r.n, r.k), r


def test_quotas_are_filled_by_conditional_draws_after_the_plain_ones() -> None:
    small = gen.generate(7, count=10)
    assert small[:10] == gen.generate(7, count=100)[:10]  # the same stream: the plain draws are a prefix
    assert len(small) > 10 and all(r.origin.startswith("quota ") for r in small[10:])
    have = gen.quota_counts(small)
    assert all(n >= least for n, least in have.values()), have
    assert have["misaligned"][1] == math.ceil(0.30 * len(small))


def test_the_draws_follow_the_stated_distributions() -> None:
    """Shares of a large draw against what the distributions give: within 4 standard errors plus
    2% (the caps redraw about 1-2% of draws, all large ones)."""
    rows = gen.generate(11, count=4000)[:4000]
    n = len(rows)

    def near(share: float, p: float) -> bool:
        return abs(share - p) <= 4 * math.sqrt(p * (1 - p) / n) + 0.02
    lo, hi = gen.M_RANGE
    assert near(sum(r.m <= 16 for r in rows) / n, math.log(17 / lo) / math.log((hi + 1) / lo))
    assert near(sum(r.m <= 128 for r in rows) / n, math.log(129 / lo) / math.log((hi + 1) / lo))
    nlo, nhi = gen.NK_RANGE
    mid_nk = math.sqrt(nlo * nhi)  # a log-uniform's median
    assert near(sum(r.n <= mid_nk for r in rows) / n, 0.5) and near(sum(r.k <= mid_nk for r in rows) / n, 0.5)
    ragged = sum(bool(r.n % 8 or r.k % 8) for r in rows) / n
    assert near(ragged, gen.RAGGED_SHARE * 63 / 64)
    aligned = [r for r in rows if not (r.n % 8 or r.k % 8)]
    assert any(r.n % 128 == 0 and r.k % 128 == 0 for r in aligned) and any(r.n % 64 for r in aligned)


def test_classes_of_rows() -> None:
    assert gen.classes_of(16, 4096, 4096) == ("decode",)
    assert gen.classes_of(17, 64, 64) == ("mid", "small")
    assert gen.classes_of(2047, 50257, 768) == ("mid", "misaligned", "big")
    assert gen.classes_of(2048, 4096, 4100) == ("m2048", "misaligned")  # 6.9e10 FLOP
    assert gen.classes_of(2048, 8192, 4100) == ("m2048", "misaligned", "big")


def test_used_seeds_are_read_from_the_results_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "RESULTS.md"
    md.write_text("    python3 bench/random_shapes_bench.py --seed 7 --budget 10m --out DIR\n"
                  "    SEED=11 EVOLVE=5m bash bench/device.sh random-shapes\n"
                  "    python3 bench/llm_layers_bench.py --seed 26\n")
    assert gen.used_seeds(md) == [7, 11] and gen.used_seeds(tmp_path / "none.md") == []
    monkeypatch.setattr(gen, "RESULTS_MD", md)
    assert bench.main(["--seed", "11", "--list"]) == 0
    out = capsys.readouterr().out
    assert "seed 11 (USED BEFORE" in out and "[7, 11]" in out
    assert bench.main(["--seed", "12", "--list"]) == 0
    assert "USED BEFORE" not in capsys.readouterr().out


# -- the command line ----------------------------------------------------------------------------
def test_list_prints_the_shapes_their_classes_and_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--seed", "34", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = gen.generate(34)
    assert lines[0].startswith("# random shapes, seed 34") and len(lines) == len(rows) + 2
    assert all(r.shape in line and " ".join(r.classes) in line for r, line in zip(rows, lines[1:]))
    assert sum("wave 1" in line for line in lines) == 12
    assert lines[-1].startswith(f"seed 34: {len(rows)} shapes; quotas")


@pytest.mark.parametrize("argv", [
    [], ["--list"], ["--seed", "-1", "--list"], ["--seed", "1", "--count", "0"], ["--seed", "1", "--stages", "train"],
    ["--seed", "1", "--budget", "soon"], ["--seed", "x"], ["--seed", "1", "--anchor-share", "1.5"],
    ["--summarize", "/nonexistent/results.json"],
])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = bench.main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_summarize_refuses_a_file_without_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert bench.main(["--summarize", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


# -- the evolve stage ---------------------------------------------------------------------------
class StandInChild:
    """Test double of ``_bench_stages.run_child`` (no GPU, no evo run): records each command and
    returns the next exit code."""

    def __init__(self, rcs: list[int]) -> None:
        self.rcs, self.calls = list(rcs), []

    def __call__(self, cmd: list[str], timeout_s: float, log: Any) -> int:
        self.calls.append(cmd)
        return self.rcs.pop(0)


def test_evolve_runs_evo_over_every_shape_within_the_budget_and_resumes(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    child = StandInChild([0, 1, 0])
    monkeypatch.setattr(bench, "run_child", child)
    argv = ["--seed", "5", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--stages", "evolve"]
    assert bench.main(argv) == 1  # wave 2 failed
    calls = child.calls
    w1, w2 = calls
    shapes = lambda cmd: [cmd[i + 1] for i, a in enumerate(cmd) if a == "--shape"]  # noqa: E731
    rows = gen.generate(5)
    assert w1[1:4] == ["-m", "evo", "run"] and len(shapes(w1)) == 12 and shapes(w2) == [r.shape for r in rows]
    budgets = [float(c[c.index("--budget") + 1].rstrip("s")) for c in (w1, w2)]
    assert sum(budgets) == pytest.approx(600, abs=1)  # 10 minutes in all, the default
    assert {c[c.index("--operators") + 1] for c in (w1, w2)} == {bench.default_operators()}
    assert all(c[c.index("--seed") + 1] == "5" for c in (w1, w2))
    # the second wave seeds two picks a template (sm90_wgmma's second before the trailing families')
    assert "--seeds-per-template" not in w1 and w2[w2.index("--seeds-per-template") + 1] == "2"
    assert bench.main(argv) == 0 and len(calls) == 3 and len(shapes(calls[2])) == len(rows)  # only wave 2 again
    other = ["--seed", "6", *argv[2:]]
    assert bench.main(other) == 2  # the work folder was made for seed 5
    assert len(calls) == 3


def test_default_operators_follow_optuna(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "optuna" else real(name))
    assert bench.default_operators() == "knob"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "optuna" else real(name))
    assert bench.default_operators() == "knob:3,optuna:1"


def test_the_peers_are_looked_for_in_the_carried_copy_too() -> None:
    assert str(ROOT / ".carry_shared/peers/pad_cublas.py") in rtime.PAD_DEFAULTS
    assert "../shared/peers/pad_cublas.py" == rtime.PAD_DEFAULTS[0]


# -- the pad peer, in-process -------------------------------------------------------------------
STAND_IN_PAD_PEER = '''"""Test double of ../shared/peers/pad_cublas.py: its command line and --json output, made-up times."""
import argparse, csv, json


def main():
    ap = argparse.ArgumentParser(); ap.add_argument("csv", nargs="+"); ap.add_argument("--json"); args = ap.parse_args()
    out = []
    for f in args.csv:
        for r in csv.DictReader(open(f)):
            m, n, k = int(r["M"]), int(r["N"]), int(r["K"])
            assert n != 777, "check failed"
            t = 1e-3 * m * n * k / 1e6 + 5.0
            out.append(dict(M=m, N=n, K=k, tn_us=t, nn_us=t * 1.1, pad_both_us=t / 2, pad_a_us=t / 3, aligned_us=t / 4,
                            pad=64, both_x=2.0, a_x=3.0))
    json.dump(out, open(args.json, "w"))
'''


class _Args:
    retime = False
    time_max_seconds = 0.0


def test_the_pad_peer_runs_its_own_main_per_misaligned_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    peer = tmp_path / "pad_peer_stand_in.py"
    peer.write_text(STAND_IN_PAD_PEER)
    argv = list(sys.argv)
    figures = rtime.pad_call(bench.btime.import_peer(peer, "pad_stand_in"), 8, 1000, 4100, tmp_path)
    t = 1e-3 * 8 * 1000 * 4100 / 1e6 + 5.0
    assert figures == pytest.approx({"pad_tn_s": t * 1e-6, "pad_nn_s": t * 1.1e-6, "pad_both_s": t / 2 * 1e-6,
                                     "pad_a_s": t / 3 * 1e-6, "pad_aligned_s": t / 4 * 1e-6, "pad_multiple": 64})
    assert sys.argv == argv
    rows = [gen.RandRow(8, 1000, 4100), gen.RandRow(64, 777, 4096), gen.RandRow(16, 4096, 4096)]
    work = tmp_path / "w"
    work.mkdir()
    (work / "results.json").write_text(json.dumps({"meta": {}, "rows": [r.to_dict() for r in rows]}))

    class StandInRun:  # test double of _bench_stages.Run: the work folder and a log
        args, results_path, logs = _Args(), work / "results.json", []

        def log(self, msg: str) -> None:
            self.logs.append(msg)

        def cap(self) -> None:
            return None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the pass itself touches no GPU here
    assert rtime.stage_pad(StandInRun(), peer) is False  # the 777 row's check failed
    got = {r["shape"]: r for r in json.loads((work / "results.json").read_text())["rows"]}
    assert got[rows[0].shape]["pad_both_s"] == pytest.approx(t / 2 * 1e-6)
    assert "AssertionError: check failed" in got[rows[1].shape]["pad_note"] and "pad_both_s" not in got[rows[1].shape]
    assert "pad_note" not in got[rows[2].shape] and "pad_both_s" not in got[rows[2].shape]  # aligned: not the peer's
    StandInRun.logs.clear()
    assert rtime.stage_pad(StandInRun(), peer) is False and len(StandInRun.logs) == 1  # only the failed row again


@pytest.mark.skipif(not Path(rtime.PAD_DEFAULTS[1]).is_file(), reason="../shared/peers/pad_cublas.py is not beside this checkout")
def test_the_shared_pad_peer_has_the_interface_we_call() -> None:
    src = Path(rtime.PAD_DEFAULTS[1]).read_text()
    assert "def main():" in src and '"--json"' in src and 'DictReader' in src
    for field in ("tn_us", "nn_us", "pad_both_us", "pad_a_us", "aligned_us", "pad="):
        assert field in src, field


# -- the best evolved kernel before the fallback ------------------------------------------------------
def test_best_evolved_takes_the_export_re_timing_else_the_archive(tmp_path: Path) -> None:
    import archive_fixture
    from populations import Archive

    archive_fixture.build(tmp_path / "a")
    with Archive(tmp_path / "a", "r") as ar:
        fit = {str(s): next(iter(ar.fitness(s).values()), None) for s in ar.shapes()}
    mma, tiny = str(archive_fixture.S_MMA), str(archive_fixture.S_TINY)
    verify = {"candidates": [{"candidate": "c1", "speedup": 0.9, "speedup_same_layout": 0.95, "s": 2e-5},
                             {"candidate": "c2", "speedup": 1.3, "speedup_same_layout": 1.4, "s": 1.4e-5},
                             {"candidate": "c3", "speedup": None, "s": None}]}
    manifest = {"paths": {mma: {"path": "cublas", "verify": verify}}}
    best = rtime.best_evolved(tmp_path / "a", manifest, [mma, tiny, "3x64x64:TN:f32"])
    assert best[mma]["best_evolved_x"] == 1.3 and best[mma]["verify_best_x_tn"] == 1.4
    assert best[mma]["verify_best_candidate"] == "c2" and best[mma]["archive_fitness"] == fit[mma]
    assert best[tiny]["best_evolved_x"] == fit[tiny] and best[tiny]["best_evolved_src"] == "archive fitness"
    assert best["3x64x64:TN:f32"]["best_evolved_x"] is None


# -- the report -----------------------------------------------------------------------------------
def _roofline_s(m: int, n: int, k: int) -> float:
    return max(2 * m * n * k / 790e12, 2 * (m * k + n * k + m * n) / 4.5e12)


def _synthetic_results(seed: int) -> dict[str, Any]:
    """Results as the time stage writes them, for the rows of ``seed``, with made-up times drawn here."""
    rng = random.Random(seed)
    rows = []
    for r in gen.generate(seed):
        roof = _roofline_s(r.m, r.n, r.k)
        tn = roof / rng.uniform(0.15, 0.95)
        rec = {**r.to_dict(), "cublas_tn_s": tn, "cublas_nn_s": tn * rng.uniform(0.9, 1.2), "evo_s": tn / rng.uniform(0.9, 2.5),
               "evo_path": rng.choice(["evolved", "cuBLAS"]), "evo_why": "made up",
               "best_evolved_x": rng.uniform(0.6, 1.6), "best_evolved_src": "export re-timing", "verify_best_s": tn / 1.1}
        if r.m <= 16:
            rec["peer_s"] = rec["evo_s"] * rng.uniform(0.9, 1.2)
        if "misaligned" in r.classes:
            rec.update(pad_tn_s=tn, pad_nn_s=tn * 1.05, pad_both_s=tn / rng.uniform(1.0, 3.0), pad_a_s=tn / rng.uniform(1.5, 3.5))
            if rng.random() < 0.5:  # an exported kernel that stages B: timed with the weights padded once too
                rec["evo_wonce_s"] = rec["evo_s"] / rng.uniform(1.0, 1.8)
        rows.append(rec)
    rows[3] = {**rows[3], "cublas_tn_s": None, "cublas_nn_s": None, "evo_s": None, "notes": "RuntimeError: made up"}
    return {"meta": {"seed": seed, "gpu": "stand-in"}, "rows": rows}


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def test_summarize_writes_the_tables_targets_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = _synthetic_results(34)
    src = tmp_path / "results.json"
    src.write_text(json.dumps(results))
    assert bench.main(["--summarize", str(src), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "summary.md").read_text()
    assert md.strip() in capsys.readouterr().out  # printed too
    assert md.startswith("# Random-shape benchmark (issue 34), seed 34:") and "## Issue 34 targets, seed 34" in md
    timed = [r for r in results["rows"] if r.get("cublas_tn_s")]
    for r in results["rows"]:
        assert f"| {r['M']}x{r['N']}x{r['K']} |" in md
    for label in gen.LABELS.values():
        assert f"| {label} |" in md
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["seed"] == 34 and len(summary["rows"]) == len(results["rows"])
    t = {x["target"]: x for x in summary["targets"]}
    for x in summary["targets"]:  # every target says met or missed, and by how much
        line = next(line for line in md.splitlines() if line.startswith(f"| {x['target']} |"))
        assert x["met"] is not None, x  # every target has rows to judge in this set
        assert ("| met |" in line) == x["met"] and (x["met"] or f"**missed** by {x['missed_by']:.3f}" in line)

    def x_of(r: dict[str, Any]) -> float:
        return min(r["cublas_tn_s"], r["cublas_nn_s"]) / r["evo_s"]

    def speed_judged(r: dict[str, Any]) -> bool:
        return _roofline_s(r["M"], r["N"], r["K"]) / min(r["cublas_tn_s"], r["cublas_nn_s"]) < 0.8
    whole = t["random set geomean >= 1.25x"]
    assert whole["value"] == pytest.approx(_geomean([x_of(r) for r in timed if speed_judged(r)]))
    assert whole["met"] is (whole["value"] >= 1.25)
    mis = [r for r in timed if "misaligned" in r["classes"]]
    pad = t["misaligned >= the pad peer, A and B padded every call (same run)"]
    pad_x = [min(r["pad_tn_s"], r["pad_nn_s"]) / r["pad_both_s"] for r in mis]
    assert pad["value"] == pytest.approx(_geomean([x_of(r) for r in mis]) / _geomean(pad_x)) and pad["shapes"] == len(mis)
    once = t["misaligned >= the pad peer, weights padded once (same run)"]
    pad_a = [min(r["pad_tn_s"], r["pad_nn_s"]) / r["pad_a_s"] for r in mis]
    evo_once = [min(r["cublas_tn_s"], r["cublas_nn_s"]) / r.get("evo_wonce_s", r["evo_s"]) for r in mis]
    assert any("evo_wonce_s" in r for r in mis)
    assert once["value"] == pytest.approx(_geomean(evo_once) / _geomean(pad_a)) and once["shapes"] == len(mis)
    mid = [r for r in results["rows"] if "mid" in gen.classes_of(r["M"], r["N"], r["K"])]
    share = t["mid: best evolved kernel >= 1.0x on >= 80% of the rows"]
    assert share["value"] == pytest.approx(sum(bool(r["best_evolved_x"] >= 1.0 or (
        r.get("cublas_tn_s") and not speed_judged(r) and _roofline_s(r["M"], r["N"], r["K"]) / r["verify_best_s"] >= 0.85))
        for r in mid) / len(mid))
    decode = [r for r in timed if r["M"] <= 16]
    peer = t["every decode row >= 0.98x the plain peer"]
    assert peer["value"] == pytest.approx(min(r["peer_s"] / r["evo_s"] for r in decode)) and peer["shapes"] == len(decode)
    tn = t["after export, no shape below 0.98x of cuBLAS TN"]
    assert tn["value"] == pytest.approx(min(r["cublas_tn_s"] / r["evo_s"] for r in timed))
    assert {"mid (M 17-2047) >= 1.1x", ">= 1e11 FLOP >= 1.0x", "misaligned >= 2.0x", "cuBLAS >= 0.8 of the roofline: evo >= 0.85",
            "misaligned >= the pad peer, weights padded once (same run)"} <= set(t)
    classes = {c["class"]: c for c in summary["classes"]}
    assert classes["big"]["shapes"] == sum(2 * r["M"] * r["N"] * r["K"] >= 1e11 for r in results["rows"])
    assert classes["decode"]["target"] is None and classes["mid"]["target"] == 1.10
    png = tmp_path / "o" / "speedup_vs_roofline.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_roofline_rule_governs_where_cublas_is_near_the_roofline() -> None:
    """A row where cuBLAS is at >= 0.8 of the roofline leaves the speedup geomeans and is judged
    by the roofline target; a mid row's best kernel at >= 0.85 of the roofline counts there."""
    r = gen.RandRow(4096, 8192, 8192)
    roof = _roofline_s(r.m, r.n, r.k)
    near = {**r.to_dict(), "cublas_tn_s": roof / 0.9, "cublas_nn_s": roof / 0.9, "evo_s": roof / 0.86}
    slow = {**gen.RandRow(512, 8192, 8192).to_dict(), "cublas_tn_s": 1e-3, "cublas_nn_s": 1e-3, "evo_s": 0.8e-3,
            "best_evolved_x": 0.95, "verify_best_s": _roofline_s(512, 8192, 8192) / 0.86}
    rows = [rrep.derive_row(x) for x in (near, slow)]
    t = {x["target"]: x for x in rrep.targets(rows)}
    assert t["random set geomean >= 1.25x"]["shapes"] == 1 and t["random set geomean >= 1.25x"]["value"] == pytest.approx(1.25)
    assert t["random set geomean, every shape"]["shapes"] == 2
    roof_t = t["cuBLAS >= 0.8 of the roofline: evo >= 0.85"]
    assert roof_t["shapes"] == 1 and roof_t["value"] == pytest.approx(0.86) and roof_t["met"]
    share = t["mid: best evolved kernel >= 1.0x on >= 80% of the rows"]
    assert share["shapes"] == 1 and share["value"] == 0.0  # cuBLAS far from the roofline there: 0.95x fails
    rows[1]["cublas_roof"] = 0.85  # were cuBLAS near the roofline, 0.86 of it would count
    again = {x["target"]: x for x in rrep.targets(rows)}
    assert again["mid: best evolved kernel >= 1.0x on >= 80% of the rows"]["value"] == 1.0


def test_the_time_stage_runs_the_timer_then_the_pad_peer_then_the_best_kernels(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage's wiring, with stand-ins for the two GPU passes: the timer gets the seed in its
    meta and every decode M for the peer, the best evolved figures come from the export manifest,
    and the report under --out is this seed's."""
    work, seen = tmp_path / "w", []
    rows = gen.generate(8)
    mid = next(r for r in rows if "mid" in r.classes)

    def stand_in_timer(run: Any, meta: dict[str, Any], peer_ms: list[int], reserve_s: float) -> bool:  # test double: no GPU
        seen.append(("time", meta["seed"], peer_ms))
        # time kept back for the pad peer, which runs after every timed row: per misaligned row
        ragged = sum("misaligned" in r.classes for r in run.sample)
        assert ragged > 0 and reserve_s == pytest.approx(bench.PAD_S_A_ROW * ragged)
        bench.stg.write_json(run.results_path, {"meta": meta, "rows": [
            {**r.to_dict(), "cublas_tn_s": 2e-5, "cublas_nn_s": 3e-5, "evo_s": 1e-5} for r in run.sample]})
        return True

    def stand_in_pad(run: Any, path: Any) -> bool:  # test double: no GPU
        seen.append(("pad", json.loads(run.results_path.read_text())["rows"][0].get("best_evolved_src")))
        return True
    monkeypatch.setattr(bench.btime, "stage_time", stand_in_timer)
    monkeypatch.setattr(bench.rtime, "stage_pad", stand_in_pad)
    (work / "lib").mkdir(parents=True)
    (work / "lib" / "manifest.json").write_text(json.dumps({"paths": {mid.shape: {"verify": {"candidates": [
        {"candidate": "c", "speedup": 1.07, "speedup_same_layout": 1.2, "s": 1.5e-5}]}}}}))
    assert bench.main(["--seed", "8", "--work", str(work), "--out", str(tmp_path / "o"), "--stages", "time"]) == 0
    assert seen == [("time", 8, list(range(1, 17))), ("pad", None)]  # the best kernels come after the pad peer
    out = json.loads((tmp_path / "o" / "results.json").read_text())
    got = {r["shape"]: r for r in out["rows"]}
    assert got[mid.shape]["best_evolved_x"] == 1.07 and got[mid.shape]["best_evolved_src"] == "export re-timing"
    assert all(r["best_evolved_src"] == "none" for s, r in got.items() if s != mid.shape)  # no archive here
    assert (tmp_path / "o" / "summary.md").read_text().startswith("# Random-shape benchmark (issue 34), seed 8:")


def test_a_terminated_benchmark_takes_its_evo_child_with_it(tmp_path: Path) -> None:
    """SIGTERM (the device runner's ``timeout``) while ``run_child`` waits: the child's process
    group is stopped before the benchmark exits, so no ``evo run`` outlives it."""
    import os
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import _bench_stages as s; "
              f"s.run_child([sys.executable, '-c', {child!r}], 60, print)")
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and "interrupting the child" in out

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    assert not alive(child_pid)


def test_the_timer_reads_the_loaders_manifest_records() -> None:
    """The runtime loader hands the manifest and its kernels as frozen records (ExportManifest,
    KernelEntry, PreparedB), not dicts: the time stage names each row's path from them (seed 6's
    first time stage failed on every row when it called ``.items()`` on the record). The loaded
    library is a stand-in (a GPU boundary): its manifest and entries are the real records."""
    from types import SimpleNamespace

    import _bench_time as btime
    from evo.runtime import ExportManifest, KernelEntry

    entry = KernelEntry(m=777, n=1536, k=2883, layout="TN", symbol="evo_hgemm_777x1536x2883",
                        shape="777x1536x2883:TN:f32", candidate="c0ffee1234567890", template="sm90_wgmma")
    manifest = ExportManifest(arch="sm_90a", kernels=(entry,),
                              skipped=({"shape": "5x9x7:TN:f32", "reason": "no kernel beat cuBLAS"},))
    lib = SimpleNamespace(active=True, manifest=manifest, kernels={(777, 1536, 2883, "TN"): entry},
                          route=lambda a, b: True)
    row = SimpleNamespace(m=777, n=1536, k=2883, shape="777x1536x2883:TN:f32")
    w = SimpleNamespace(t=lambda: None)  # the weight: only transposed on the way to route()
    assert btime.library_path(lib, row, None, w) == ("evolved", "sm90_wgmma c0ffee123456")
    other = SimpleNamespace(m=5, n=9, k=7, shape="5x9x7:TN:f32")
    lib_off = SimpleNamespace(**{**vars(lib), "route": lambda a, b: None})
    assert btime.library_path(lib_off, other, None, w) == ("cuBLAS", "no kernel beat cuBLAS")
    assert btime.as_dict(entry)["template"] == "sm90_wgmma" and btime.as_dict(None) == {}


def test_long_rows_get_more_timed_rounds() -> None:
    """Rows of >= 5e11 FLOP (calls of about 0.7 ms and more) get three times the rounds, so that two
    timings of the same call (the library's cuBLAS fallback beside the cuBLAS TN arm) stay close
    under clock drift; the others keep the default."""
    import _bench_time as bt

    assert bt.rounds_for(13679, 13688, 10656, 7) == 21
    assert bt.rounds_for(16367, 3520, 5080, 7) == 21
    assert bt.rounds_for(4096, 4096, 4096, 7) == 7
    assert bt.rounds_for(1, 4096, 4096, 5) == 5
