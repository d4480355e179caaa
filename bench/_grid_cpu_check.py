"""CPU rehearsal of ``bench/_grid_device.sh``: the seed and run steps up to the compiler, and the summary.

    python bench/_grid_cpu_check.py [--work DIR] [--run-s 60] [--n 100]

No GPU here, so the GPU half of the evaluator is replaced by :class:`CompileOnlyPool`, a test
double for ``evaluators.LocalPool``: every candidate goes through the real compiler
(``compile_candidate``: static scan, NVRTC, ptxas resource policy), and a compiled one gets a
made-up ``ok`` result (a deterministic speedup from its id, never a measurement) so the engine's
operators have parents to work from. What it checks, on the device plan's 100 shapes:

1. the seeds of every shape compile (seed_bench's candidates, ``--picks 1``) and make a seed
   archive shaped like ``seed_bench --archive``;
2. ``evo run`` over all 100 shapes on a copy of it, twice (the second resumes the first, as the
   two device calls do): operators' candidates compile, every shape gets evaluations;
3. ``peers_bench --summarize`` on a peers CSV made from that archive (synthetic times; the
   archived figures and ``--seed-archive``) writes the per-decade table and the CUDA-L2 join.

Exit 0 when all hold, 1 otherwise; prints what it found.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from evaluators import EvaluatorPool  # noqa: E402
from populations import Archive, Candidate, Evaluation, Shape, Status, TimerResult, load_templates  # noqa: E402

import seed_bench  # noqa: E402


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2 ** 64


class CompileOnlyPool(EvaluatorPool):
    """Test double for ``evaluators.LocalPool`` on a machine without a GPU: real compiles, made-up
    ``ok`` results (speedup 0.6-1.2 from the candidate id and shape; provenance says so)."""

    def __init__(self, config: Any = None, workers: int = 2, arch: str = "sm_90a") -> None:
        self._arch = arch
        self.gpus = [0]
        self._ex = ThreadPoolExecutor(max(1, getattr(config, "compile_workers", workers) or workers))
        self.compiled: Counter = Counter()

    @property
    def arch(self) -> str:
        return self._arch

    def submit(self, candidate: Candidate, *, elite_threshold: Optional[float] = None) -> "Future[list[Evaluation]]":
        return self._ex.submit(self._evaluate, candidate)

    def _evaluate(self, candidate: Candidate) -> list[Evaluation]:
        from evaluators import compile_candidate

        res = compile_candidate(candidate, self.arch)
        self.compiled["ok" if res.ok else res.status.value] += 1
        out = []
        for shape in candidate.shapes:
            common = dict(candidate_id=candidate.id, shape=shape, arch=self.arch, compile_s=res.seconds,
                          kernels=res.kernels, provenance={"pool": "compile-only double (made-up timing)"})
            if not res.ok:
                out.append(Evaluation(status=res.status, message=res.message[:500], **common))
                continue
            fit = 0.6 + 0.6 * _unit(f"{candidate.id}|{shape}")
            t = TimerResult(median=1e-4 / fit, lo=0.99e-4 / fit, hi=1.01e-4 / fit, baseline_median=1e-4,
                            baseline_lo=0.99e-4, baseline_hi=1.01e-4, samples=10)
            out.append(Evaluation(status=Status.OK, timers={"device": t}, max_error=1e-3, correctness_s=0.01,
                                  timing_s=0.01, **common))
        return out

    def close(self) -> None:
        self._ex.shutdown(wait=True)


def seed_archive(path: Path, shapes: list[Shape], workers: int) -> Counter:
    """seed_bench --archive's records (first heuristic pick per template), evaluated by the double."""
    pool = CompileOnlyPool(workers=workers)
    templates = load_templates()
    with Archive(path, "w") as archive:
        for shape in shapes:
            cands = seed_bench.seeds_for(shape, templates, pool.arch, 1)
            for c, f in zip(cands, [pool.submit(c) for c in cands]):
                archive.record(c, f.result())
            archive.commit()
    pool.close()
    return pool.compiled


def evo_run(archive: Path, shapes: list[Shape], seconds: int, workers: int, log: Path) -> int:
    # evo run in a child with the double as its pool, handed over through the library (no flag does that)
    launch = ("import sys, _grid_cpu_check as g; from evo.cli import main; "
              "sys.exit(main(sys.argv[1:], pool_factory=g.CompileOnlyPool))")
    cmd = [sys.executable, "-c", launch, "run", *[a for s in shapes for a in ("--shape", str(s))], "--archive",
           str(archive), "--budget", f"{seconds}s", "--operators", "knob:3,optuna:1", "--compile-workers", str(workers),
           "--converge-window", "12", "--converge-threshold", "0.01", "--progress", "plain"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    with open(log, "a") as fh:
        return subprocess.run(cmd, cwd=HERE.parent, env=env, stdout=fh, stderr=subprocess.STDOUT,
                              timeout=seconds + 120).returncode


def peers_fixture(evolved: Path, path: Path) -> int:
    """A peers CSV over the evolved archive's shapes: synthetic times, the archive's own figures."""
    import _peers_stats as st

    arch = Archive(evolved, "r")
    rows = []
    for s in arch.shapes():
        best = arch.elites(s, top=1)
        if not best:
            continue
        base = 1e-6 * (3 + s.flops / 6e8)
        times = {"torch_nn": base, "torch_tn": base * 1.02, "lt_heuristic": base, "lt_autotuned": base * 0.98,
                 "triton": base * 1.3, "evolved": base / best[0].fitness}
        r = {"shape": str(s), "M": s.m, "N": s.n, "K": s.k, "layout": s.layout, "flops": s.flops,
             "decade": st.decade(s.flops), "candidate": best[0].candidate_id, "template": "x", "evolved_path": "export",
             "evolved_check": "pass", "archived_device_speedup": round(best[0].fitness, 4)}
        for t in st.TIMERS:
            for arm, sec in times.items():
                r[f"{t}_{arm}_us"] = round(sec * 1e6 * (1.0 if t == "device" else 1.2), 4)
        rows.append(r)
    st.write_rows(path, rows)
    return len(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/evo_grid_cpu"))
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--run-s", type=int, default=60, help="each of the two evo run legs")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    shapes = seed_bench.stratified(seed_bench.read_grid(None), args.n, 3)
    problems: list[str] = []
    t0 = time.monotonic()
    seeds = args.work / "seeds"
    counts = seed_archive(seeds, shapes, args.workers)
    print(f"[{time.monotonic() - t0:.0f}s] seeds: {dict(counts)} over {len(shapes)} shapes", flush=True)
    if set(counts) != {"ok"}:
        problems.append(f"seeds did not all compile: {dict(counts)}")
    evolved = args.work / "evolved"
    shutil.copytree(seeds, evolved)
    before = {s: len(Archive(evolved, "r").evaluations(s)) for s in shapes}
    for leg in (1, 2):
        rc = evo_run(evolved, shapes, args.run_s, args.workers, args.work / "run.log")
        print(f"[{time.monotonic() - t0:.0f}s] evo run leg {leg}: exit {rc}", flush=True)
        if rc != 0:
            problems.append(f"evo run leg {leg} exited {rc} (see {args.work / 'run.log'})")
    arch = Archive(evolved, "r")
    statuses: Counter = Counter()
    grown = 0
    operators: Counter = Counter()
    for s in shapes:
        evs = arch.evaluations(s)
        statuses.update(e.status.value for e in evs)
        grown += len(evs) > before[s]
        operators.update((c.operator or "seed") for c in arch.candidates(s))
    print(f"evolved archive: {sum(statuses.values())} evaluations {dict(statuses)}; {grown}/{len(shapes)} shapes got new "
          f"ones; candidates by operator {dict(operators)}", flush=True)
    tail = (args.work / "run.log").read_text().splitlines()
    print("\n".join(line for line in tail if line.startswith("evo run:")), flush=True)
    if statuses.get("compile_error") or statuses.get("rejected"):
        problems.append(f"compile failures in the run: {dict(statuses)}")
    if sum(operators[o] for o in operators if o not in ("seed",)) == 0:
        problems.append("no operator-made candidate was evaluated")
    n = peers_fixture(evolved, args.work / "peers.csv")
    out = args.work / "summary"
    rc = subprocess.run([sys.executable, str(HERE / "peers_bench.py"), "--summarize", str(args.work / "peers.csv"),
                         "--out", str(out), "--seed-archive", str(seeds)], capture_output=True, text=True).returncode
    md = (out / "summary.md").read_text() if (out / "summary.md").is_file() else ""
    table = md.split("## Per FLOP decade")[1].split("## device timer")[0] if "## Per FLOP decade" in md else ""
    print(f"peers --summarize on {n} rows: exit {rc}\n{table}", flush=True)
    join = json.loads((out / "summary.json").read_text()).get("cuda_l2") if (out / "summary.json").is_file() else None
    print(f"CUDA-L2 join: {join and {k: v['n'] for k, v in join.items()}}", flush=True)
    if rc != 0 or "evolved / seed" not in table:
        problems.append("the summary has no evolved-vs-seed decade table")
    with open(args.work / "check.json", "w") as fh:
        json.dump({"problems": problems, "statuses": dict(statuses), "operators": dict(operators)}, fh, indent=1)
    for line in problems:
        print(f"PROBLEM: {line}", flush=True)
    print(f"[{time.monotonic() - t0:.0f}s] {'ok' if not problems else 'FAILED'}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
