"""bench/operator_ablation.py (issue 25) in its tiny mode: real evo run children on the stand-in
pool (tests/fake_pool.py, the GPU being a boundary we cannot cross here), every figure of the
table computed from their archives, the report and plot written; and the device arms' commands."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import operator_ablation as ab  # noqa: E402
from populations import Shape  # noqa: E402


def test_tiny_ablation_runs_every_arm_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "abl"
    rc = ab.main(["--tiny", "--out", str(out), "--seeds", "0", "--arms", "knob,knob+ranked,knob+llm_adapter,bandit"])
    assert rc == 0
    doc = json.loads((out / "ablation.json").read_text())
    assert doc["format"] == "evo-operator-ablation/1" and doc["shapes"] == ["64x256x512:TN:f32", "8x512x256:TN:f32"]
    knob = doc["arms"]["knob"]
    assert knob["runs"] == 1 and knob["evaluations"]["mean"] > 10
    assert 0 < knob["valid_share"]["mean"] <= 1 and knob["flagged_share"]["mean"] == 0
    assert knob["gpu_s"]["mean"] >= 3.0  # ran to its GPU budget (the stand-in's 0.05 s per evaluation)
    assert knob["improvement_per_gpu_s"]["mean"] is not None and len(knob["best_over_time"]) == len(ab.MARKS)
    assert doc["arms"]["knob+llm_adapter"]["skipped"] == "no --adapter given"
    from populations import Archive
    with Archive(out / "runs" / "knob+ranked" / "s0", mode="r") as ar:
        assert ab.operator_rows(ar)["ranked"]["evaluated"] > 0  # the ranking step's children were timed
    assert doc["arms"]["knob+ranked"]["llm_gpu_wait_s"]["mean"] == 0.0  # no LLM: nothing held, nothing waited
    assert knob["llm_exercised"] is None and knob["llm_evaluated_total"] is None  # no LLM in the arm
    run = next(r for r in doc["runs"] if r["arm"] == "bandit")
    # every evaluated child counts for its operator's arm, parentless Optuna samples too (vs the
    # incumbent); how many each arm gets in a 3 GPU-s run is the bandit's (and the load's) choice
    from populations import Archive
    with Archive(out / "runs" / "bandit" / "s0", mode="r") as ar:
        made = ab.operator_rows(ar)
    assert "tpe" in run["bandit"] and sum(arm["children"] for arm in run["bandit"].values()) > 0
    assert {k: v["children"] for k, v in run["bandit"].items()} == {
        k: made[k]["evaluated"] if k in made else 0 for k in run["bandit"]}
    md = (out / "ablation.md").read_text()
    assert doc["vs_knob"]["knob+ranked"]["improvement_per_gpu_s"]["pairs"] == 1  # one seed: a ratio, no interval
    assert "Against knob alone, paired by seed" in md
    assert "| knob | 1 (0) |" in md and "not run: no --adapter given" in md and "Command: `python bench/" in md
    assert "<svg" in (out / "best_over_time.svg").read_text()
    assert (out / "best_over_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second call resumes: finished runs are read back, not run again
    before = (out / "runs" / "knob" / "s0" / "done.json").stat().st_mtime
    assert ab.main(["--tiny", "--out", str(out), "--seeds", "0", "--arms", "knob"]) == 0
    assert (out / "runs" / "knob" / "s0" / "done.json").stat().st_mtime == before


def test_device_arm_commands(tmp_path: Path) -> None:
    adapter = tmp_path / "v2"
    adapter.mkdir()
    args = ab.parse_args(["--layers", "x.csv", "--out", str(tmp_path), "--adapter", str(adapter),
                          "--llm-device", "cuda", "--gpu-seconds", "90"])
    shapes = [Shape(1, 4096, 4096)]
    cmd = ab.run_command(args, "knob+llm_adapter", 2, shapes, tmp_path / "a")
    assert cmd[cmd.index("--operators") + 1] == "knob:1,llm:1" and cmd[cmd.index("--llm-adapter") + 1] == str(adapter)
    assert cmd[cmd.index("--llm-device") + 1] == "cuda" and cmd[cmd.index("--gpu-seconds") + 1] == "90"
    assert cmd[1:3] == ["-m", "evo"] and cmd[cmd.index("--seed") + 1] == "2"
    bandit = ab.run_command(args, "bandit", 0, shapes, tmp_path / "b")
    assert "--operator-bandit" in bandit and "--llm-adapter" in bandit and "llm" in bandit[bandit.index("--operators") + 1]
    assert "--llm-device" not in ab.run_command(args, "knob", 0, shapes, tmp_path / "c")
    assert "--seeds-per-template" not in bandit
    ranker = ab.run_command(args, "knob+llm_ranker_adapter", 0, shapes, tmp_path / "d")
    assert ranker[ranker.index("--operators") + 1] == "knob:1,llm_ranked:1" and "--llm-device" in ranker
    assert ranker[ranker.index("--llm-adapter") + 1] == str(adapter)
    assert ab.missing_adapter(ab.parse_args(["--tiny", "--out", str(tmp_path)]), "knob+llm_ranker_adapter")
    args.seeds_per_template = 1
    knob = ab.run_command(args, "knob", 0, shapes, tmp_path / "c", wall_cap=33)
    assert knob[knob.index("--seeds-per-template") + 1] == "1" and knob[knob.index("--budget") + 1] == "33.0"


def test_test_shapes_are_spread_over_classes() -> None:
    shapes = [Shape(1, 4096, 4096), Shape(8, 4096, 4096), Shape(512, 4096, 4096), Shape(4096, 4096, 4096),
              Shape(64, 4096, 4096), Shape(8, 2304, 770)]
    picked = ab.sample_shapes(shapes, 5)
    from operators.llm._context import shape_class
    assert len({shape_class(s).name for s in picked}) == 5
    assert ab.sample_shapes(shapes, 5) == picked  # seeded


def test_the_call_clock_starts_only_runs_that_fit() -> None:
    clock = ab.CallClock(100.0, 30.0, start=0.0)
    assert clock.fits(now=60.0) and not clock.fits(now=75.0)  # before any run: the first-run guess
    clock.ran(45.0, "knob")  # a cold first run
    assert not clock.fits("bandit", now=60.0) and clock.fits("bandit", now=50.0)  # then the slowest run so far
    clock.ran(20.0, "knob")
    assert clock.fits("knob", now=75.0) and not clock.fits("knob", now=85.0)  # then the arm's own last run
    assert not clock.fits("bandit", now=75.0)
    assert ab.CallClock(0.0, 30.0, start=0.0).fits(now=1e9)  # no --call-s: no limit


def test_a_call_out_of_time_leaves_whole_seeds_and_says_so(tmp_path: Path) -> None:
    """Whole runs only: a run that would not fit the call's time is not started, and the report
    names the seeds each arm did not get (the fitting rule itself: the test above)."""
    out = tmp_path / "abl"
    # one tiny run takes ~1-2 s here; guess 1000 s so the first run of a call never starts
    rc = ab.main(["--tiny", "--out", str(out), "--seeds", "0,1", "--arms", "knob,bandit", "--call-s", "600",
                  "--first-run-s", "1000"])
    assert rc == 0
    doc = json.loads((out / "ablation.json").read_text())
    assert all("not_started" in r for r in doc["runs"]) and len(doc["runs"]) == 4
    assert doc["arms"]["knob"]["not_started"] == [0, 1] and doc["arms"]["knob"]["runs"] == 0
    assert "not started: 0,1" in (out / "ablation.md").read_text()


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path: Path, capsys) -> None:
    csv = tmp_path / "layers.csv"
    csv.write_text("M,N,K,model,layer\n1,4096,4096,a,q\n8,4096,4096,a,q\n1,2048,2048,b,q\n8,2048,2048,b,q\n"
                   "1,1024,1024,c,q\n8,1024,1024,c,q\n")
    out = tmp_path / "abl"
    assert ab.main(["--layers", str(csv), "--out", str(out), "--shapes", "2", "--seeds", "0,1", "--gpu-seconds", "12",
                    "--arms", "knob,knob+llm_adapter", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    runs = [x for x in lines if " s0: " in x or " s1: " in x]
    assert len(runs) == 4 and sum("-m evo run" in x for x in runs) == 2
    assert "not run (no --adapter given)" in runs[1] and "--gpu-seconds 12" in runs[0]
    assert not out.exists()  # nothing ran, nothing written


# -- the LLM's own counts, and arms that did not exercise it ----------------------------------------
def _llm_run(folder: Path, arm: str, seed: int, children: list[float], proposed: int, tokens: int) -> None:
    """A finished run's folder as evo run leaves it: one seed candidate (speedup 1.0) and LLM
    children of it with the given speedups in a real archive, the stop event, and done.json."""
    from populations import (Archive, Candidate, Evaluation, KernelStats, Launch, LaunchPlan, Status,
                             TimerResult)
    shape = Shape(64, 256, 512)
    plan = LaunchPlan(launches=(Launch("k", (1, 1, 1), (256, 1, 1), ("A", "B", "C", "M", "N", "K")),))

    def cand(tag: str, operator: str, parents: tuple[str, ...] = ()) -> Candidate:
        return Candidate(source=f'extern "C" __global__ void k() {{ /* {tag} */ }}', plan=plan, shapes=(shape,),
                         parents=parents, template="sm80_mma", knobs={"BM": 128, "tag": tag}, operator=operator)

    def ev(c: Candidate, speedup: float) -> Evaluation:
        return Evaluation(c.id, shape, Status.OK, timers={"device": TimerResult(1e-3 / speedup, 0, 0, 1e-3, 0, 0, 20)},
                          kernels=(KernelStats("k", registers=96),))
    archive = folder / arm / f"s{seed}"
    seed_c = cand("seed", "seed")
    with Archive(archive, "w") as ar:
        ar.record(seed_c, [ev(seed_c, 1.0)])
        for i, speedup in enumerate(children):
            child = cand(f"llm{i}", "llm", (seed_c.id,))
            ar.record(child, [ev(child, speedup)])
    stop = {"event": "stop", "reason": "gpu_seconds", "budget": {"gpu_s": 10.5, "tokens": tokens, "llm_gpu_s": 4.2},
            "models": {"llm": {"smollm2-135m": {"proposed": proposed, "tokens": tokens}}}}
    (archive / "events.jsonl").write_text(json.dumps(stop) + "\n")
    command = (f"-m evo run --archive {archive} --operators knob:1,llm:1 --seed {seed} --gpu-seconds 10 "
               f"--shape {shape} --llm-device cuda")
    (archive / "done.json").write_text(json.dumps({"arm": arm, "seed": seed, "rc": 0, "wall_s": 20.0, "command": command,
                                                   "tokens": 0}))


def test_llm_counts_come_from_the_runs_and_too_few_mark_the_arm(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _llm_run(runs, "knob+llm", 0, [1.2, 0.8], proposed=3, tokens=5000)
    _llm_run(runs, "knob+llm", 1, [1.1, 1.3, 0.9], proposed=4, tokens=6000)
    ran = ab.read_run(runs / "knob+llm" / "s0")
    assert (ran["llm_proposals"], ran["llm_evaluated"], ran["llm_improved"], ran["tokens"]) == (3, 2, 1, 5000)
    assert ran["uses_llm"] is True
    out = tmp_path / "report"
    assert ab.main(["--report-only", "--runs", str(runs), "--out", str(out)]) == 0
    doc = json.loads((out / "ablation.json").read_text())
    row = doc["arms"]["knob+llm"]
    assert row["llm_evaluated_total"] == 5 and row["llm_exercised"] is False and ab.MIN_LLM_EVALUATED > 5
    assert row["tokens"]["mean"] == 5500 and row["llm_improved"]["mean"] == 1.5
    assert doc["gpu_seconds"] == 10 and doc["llm_device"] == "cuda" and doc["seeds"] == [0, 1]
    md = (out / "ablation.md").read_text()
    assert "knob+llm **LLM not exercised** (5 LLM children evaluated < " in md
    # enough children over the seeds: the arm is a result
    _llm_run(runs, "knob+llm", 2, [1.05] * (ab.MIN_LLM_EVALUATED - 5), proposed=5, tokens=100)
    assert ab.main(["--report-only", "--runs", str(runs), "--out", str(out)]) == 0
    assert json.loads((out / "ablation.json").read_text())["arms"]["knob+llm"]["llm_exercised"] is True
    assert "not exercised" not in (out / "ablation.md").read_text().split("Seeds run:")[0]


def test_report_only_needs_finished_runs(tmp_path: Path, capsys) -> None:
    assert ab.main(["--report-only", "--runs", str(tmp_path / "none"), "--out", str(tmp_path / "r")]) == 2
    (tmp_path / "runs" / "knob" / "s0").mkdir(parents=True)
    assert ab.main(["--report-only", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "r")]) == 2
    assert "no finished run" in capsys.readouterr().err


def _adapter(folder: Path, version: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "evo-adapter.json").write_text(json.dumps({"format": "evo-adapter/1", "version": version,
                                                         "name": f"v{version}-0123456789ab"}))
    return folder


def test_several_adapter_versions_run_one_arm_each_and_the_bandit_takes_the_latest(tmp_path: Path) -> None:
    v2 = _adapter(tmp_path / "a" / "second", 2)  # versions come from evo-adapter.json, not the folder name
    v1 = _adapter(tmp_path / "a" / "first", 1)
    args = ab.parse_args(["--layers", "x.csv", "--out", str(tmp_path), "--adapter", str(v2), "--adapter", str(v1),
                          "--arms", "knob,knob+llm,knob+llm_adapter,bandit"])
    assert args.arm_list == ["knob", "knob+llm", "knob+llm_adapter@v1", "knob+llm_adapter@v2", "bandit"]
    shapes = [Shape(8, 4096, 4096)]
    for arm, folder in (("knob+llm_adapter@v1", v1), ("knob+llm_adapter@v2", v2), ("bandit", v2)):
        cmd = ab.run_command(args, arm, 0, shapes, tmp_path / "r")
        assert cmd[cmd.index("--llm-adapter") + 1] == str(folder)
    assert "--llm-adapter" not in ab.run_command(args, "knob+llm", 0, shapes, tmp_path / "r")
    assert ab.run_arm(args, "knob+llm_adapter@v3", 0, shapes)["skipped"] == "no adapter of version 3 given"


def test_the_version_table_compares_each_adapter_with_the_one_before(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _llm_run(runs, "knob+llm", 0, [1.2, 0.8, 0.9, 0.7], proposed=4, tokens=100)            # 1 of 4
    _llm_run(runs, "knob+llm_adapter@v1", 0, [1.2, 1.1, 0.9, 0.7], proposed=4, tokens=100)  # 2 of 4
    _llm_run(runs, "knob+llm_adapter@v2", 0, [1.2, 0.8, 0.9, 0.7], proposed=4, tokens=100)  # 1 of 4
    out = tmp_path / "report"
    assert ab.main(["--report-only", "--runs", str(runs), "--out", str(out)]) == 0
    versions = json.loads((out / "ablation.json").read_text())["adapter_versions"]
    assert [(v["version"], v["llm_evaluated"], v["llm_improved"], v["above_previous"]) for v in versions] == [
        (0, 4, 1, None), (1, 4, 2, True), (2, 4, 1, False)]
    md = (out / "ablation.md").read_text()
    assert "| 1 | knob+llm_adapter@v1 | 0 | 4 | 2 | 50.0% | yes |" in md
    assert "| 2 | knob+llm_adapter@v2 | 0 | 4 | 1 | 25.0% | **no** |" in md


def test_paired_bootstrap_intervals_against_knob() -> None:
    from _ablation_stats import paired_ratio, vs_base

    def run(arm: str, seed: int, rate: float, best: float) -> dict:
        return {"arm": arm, "seed": seed, "evaluations": 10, "improvement_per_gpu_s": rate,
                "best_over_time": [None, best * 0.9, best]}

    runs = [run("knob", s, 1.0 + 0.1 * s, 1.2) for s in range(10)]
    runs += [run("twice", s, 2 * (1.0 + 0.1 * s), 1.2) for s in range(10)]
    runs += [run("noisy", s, (1.0 + 0.1 * s) * (0.5 if s % 2 else 1.5), 1.2) for s in range(10)]
    table = vs_base(runs)
    twice, noisy = table["twice"]["improvement_per_gpu_s"], table["noisy"]["improvement_per_gpu_s"]
    assert twice["pairs"] == 10 and twice["ratio"] == 2.0 and twice["lo"] == twice["hi"] == 2.0  # exact pairs
    assert noisy["lo"] < 1.0 < noisy["hi"]  # a seed-to-seed spread this wide cannot be told from 1.0x
    assert table["twice"]["best_speedup_end"]["ratio"] == 1.0
    assert paired_ratio([(1.0, 1.0)])["lo"] is None and paired_ratio([])["ratio"] is None


def test_runs_go_to_their_gpus_concurrently(tmp_path: Path, monkeypatch) -> None:
    """``--gpus 0,1``: one run per GPU at a time, each child with CUDA_VISIBLE_DEVICES set to its
    GPU (recorded by a wrapper around fake_evo written here), every job once, results in job order."""
    wrapper = tmp_path / "mods" / "envrec_evo.py"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "import os, runpy, sys, time\n"
        "archive = sys.argv[sys.argv.index('--archive') + 1]\n"  # notes beside it: evo wants it new or empty
        "open(archive + '.gpu', 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', '-'))\n"
        "open(archive + '.start', 'w').write(str(time.time()))\n"
        "runpy.run_module('fake_evo', run_name='__main__')\n")
    monkeypatch.setenv("PYTHONPATH", str(wrapper.parent))
    out = tmp_path / "abl"
    rc = ab.main(["--tiny", "--out", str(out), "--seeds", "0,1", "--arms", "knob,knob+ranked", "--gpus", "0,1",
                  "--evo-module", "envrec_evo"])
    assert rc == 0
    doc = json.loads((out / "ablation.json").read_text())
    assert [(r["seed"], r["arm"]) for r in doc["runs"]] == [(0, "knob"), (0, "knob+ranked"), (1, "knob"), (1, "knob+ranked")]
    for r in doc["runs"]:
        seen = (out / "runs" / r["arm"] / f"s{r['seed']}.gpu").read_text()
        assert seen == str(r["gpu"]) and r["gpu"] in (0, 1)
    assert {r["gpu"] for r in doc["runs"]} == {0, 1}
    # the first two jobs started together (one per GPU), not one after the other
    starts = sorted(float((out / "runs" / r["arm"] / f"s{r['seed']}.start").read_text()) for r in doc["runs"])
    first_wall = min(r["wall_s"] for r in doc["runs"])
    assert starts[1] - starts[0] < first_wall


def test_gpus_must_be_distinct_indices(tmp_path: Path, capsys) -> None:
    import pytest
    for bad in ("0,0", "a", "-1"):
        with pytest.raises(SystemExit) as exc:
            ab.parse_args(["--tiny", "--out", str(tmp_path), "--gpus", bad])
        assert exc.value.code == 2 and "--gpus" in capsys.readouterr().err
