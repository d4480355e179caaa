"""bench/false_rejections.py on the CPU with the stand-in pool: the seeds of the LLM-layer
sample and an archive's elites go through ``submit``, every non-ok status is counted as a
false rejection with its message, and the exit status says whether any occurred."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from archive_fixture import build  # noqa: E402
from fake_pool import FakeEvaluatorPool  # noqa: E402


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import false_rejections

    return false_rejections


class _Pool(FakeEvaluatorPool):
    arch = "sm_90a"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _honest_pools():
    """(pools, factory): a factory of honest stand-in pools that keeps each pool it made in ``pools``."""
    pools: list = []

    def honest():
        pools.append(_Pool(fail=0, incorrect=0, crash=0, raise_=0))
        return pools[-1]
    return pools, honest


def _csv(tmp_path: Path) -> Path:
    p = tmp_path / "llm_layers.csv"
    p.write_text("M,N,K,model,layer\n1,2304,768,gpt2,qkv\n8,768,768,gpt2,proj\n128,3072,768,gpt2,fc\n"
                 "2048,768,3072,gpt2,proj2\n4,50257,768,gpt2,lm_head\n")
    return p


def test_every_seed_goes_through_the_pool_and_failures_are_counted(tmp_path):
    fr = _bench()
    pools, honest = _honest_pools()
    out = tmp_path / "fr.json"
    code = fr.main(["--csv", str(_csv(tmp_path)), "--per-template", "2", "--json", str(out)], pool_factory=honest)
    rep = json.loads(out.read_text())["seeds"]
    assert code == 0 and rep["false_rejections"] == 0 and rep["ran"] == rep["planned"] == len(pools[0].submitted)
    assert rep["ran"] >= 2 * rep["shapes"] and set(rep["statuses"]) == {"ok"}
    jobs = fr.seed_jobs(_csv(tmp_path), 2, "sm_90a")
    first = {}
    for i, (key, _, labels) in enumerate(jobs):  # a budget cut keeps every template of a shape
        first.setdefault((key, labels["template"]), i)
    for key in {k for k, _, _ in jobs}:
        mine = [i for i, (k, _, _) in enumerate(jobs) if k == key]
        starts = sorted(i for (k, _), i in first.items() if k == key)
        assert starts == mine[:len(starts)], key

    def lossy():
        return _Pool(fail=0.2, incorrect=0.2, crash=0.1, raise_=0.1)
    code = fr.main(["--csv", str(_csv(tmp_path)), "--per-template", "2", "--json", str(out)], pool_factory=lossy)
    rep = json.loads(out.read_text())["seeds"]
    assert code == 1 and rep["false_rejections"] == len(rep["not_ok"]) > 0
    assert rep["false_rejections"] == rep["ran"] - rep["statuses"].get("ok", 0)
    assert any(r["status"] == "pool error" for r in rep["not_ok"])  # a raising future is counted, not lost


def test_archive_elites_are_reevaluated_at_their_shape(tmp_path):
    fr = _bench()
    build(tmp_path / "arch")
    jobs = fr.archive_jobs(str(tmp_path / "arch"), top=10)
    assert jobs and all(tuple(c.shapes) == (fr.Shape.parse(k),) for k, c, _ in jobs)
    out = tmp_path / "fr.json"
    code = fr.main(["--skip-seeds", "--archive", str(tmp_path / "arch"), "--json", str(out)],
                   pool_factory=lambda: _Pool(fail=0, incorrect=0, crash=0, raise_=0))
    rep = json.loads(out.read_text())["archive"]
    assert code == 0 and rep["ran"] == len(jobs) and rep["statuses"] == {"ok": len(jobs)}


def test_budget_stops_new_submissions_and_counts_what_did_not_run():
    fr = _bench()
    ticks = iter(range(100))
    pool = _Pool(fail=0, incorrect=0, crash=0, raise_=0)
    jobs = [("64x64x64:TN:f32", c, {"template": "t"}) for c in _seeds()]
    rep = fr.run_jobs(pool, jobs, budget_s=2.5, clock=lambda: float(next(ticks)))
    pool.close()
    assert rep["ran"] == 2 and rep["not_run"] == len(jobs) - 2


def _seeds():
    from populations import Shape, load_templates

    shape = Shape.parse("64x64x64")
    t = load_templates()["sm80_mma"]
    return [t.candidate(k, shape) for k in t.heuristic(shape)[:1] + t.sample(__import__("random").Random(1), shape, 4)]


def test_static_mode_compiles_every_seed_generic_and_specialised_and_counts_rejections(tmp_path):
    """``--static`` on a CPU machine: each seed goes through the real compile step (scan, NVRTC,
    PTX scan) twice; a seed the evaluator refuses shows up as a false rejection with its message."""
    fr = _bench()
    jobs = fr.seed_jobs(_csv(tmp_path), 1, "sm_90a")
    key, cand, labels = next(j for j in jobs if j[1].template == "gemv")
    broken = cand.derive(source=cand.source + "\n__device__ int evo_counter;\n")  # writable module state
    out = fr.static_jobs([(key, cand, labels), (key, broken, labels)], "sm_90a", str(tmp_path / "cache"), workers=1)
    assert out["planned"] == 4 and out["ran"] == 4
    assert out["false_rejections"] == 1, out["not_ok"]  # the broken seed's generic copy; its
    # specialised copy is rebuilt from the template's own source, which is honest
    assert out["not_ok"][0]["specialised"] is False and out["not_ok"][0]["status"] != "ok"
    assert out["not_ok"][0]["shape"] == key


def test_parts_split_the_sweep_into_slices_that_cover_it_once(tmp_path):
    fr = _bench()
    jobs = fr.seed_jobs(_csv(tmp_path), 2, "sm_90a")
    parts = [fr.part_slice(jobs, (i, 3)) for i in range(3)]
    assert [j for p in parts for j in p] == jobs and all(parts) and fr.part_slice(jobs, None) == jobs
    pools, honest = _honest_pools()
    out = tmp_path / "fr.json"
    code = fr.main(["--csv", str(_csv(tmp_path)), "--per-template", "2", "--part", "1/3", "--json", str(out)],
                   pool_factory=honest)
    rep = json.loads(out.read_text())["seeds"]
    assert code == 0 and rep["planned"] == rep["ran"] == len(parts[1]) == len(pools[0].submitted)
    for bad in ("3/3", "x/2", "1"):
        with pytest.raises(SystemExit):
            fr.main(["--csv", str(_csv(tmp_path)), "--part", bad], pool_factory=honest)


def test_templates_keep_only_those_seeds_and_refuse_unknown_names(tmp_path):
    fr = _bench()
    pools, honest = _honest_pools()
    out = tmp_path / "fr.json"
    code = fr.main(["--csv", str(_csv(tmp_path)), "--per-template", "2", "--templates", "tiny,gemv", "--json", str(out)],
                   pool_factory=honest)
    rep = json.loads(out.read_text())["seeds"]
    jobs = [j for j in fr.seed_jobs(_csv(tmp_path), 2, "sm_90a") if j[2]["template"] in ("tiny", "gemv")]
    assert code == 0 and rep["planned"] == rep["ran"] == len(jobs) == len(pools[0].submitted) > 0
    assert set(rep["by_template"]) == {"tiny", "gemv"}
    with pytest.raises(SystemExit):
        fr.main(["--csv", str(_csv(tmp_path)), "--templates", "tiny,nope"], pool_factory=honest)
