"""False rejections of the hardened evaluator (issue 18): honest kernels it must still pass.

    python3 bench/false_rejections.py [--per-template 4] [--archive DIR [--top 10]] [--budget-s S]
                                      [--part I/N] [--json OUT.json]

(a) **Seeds**: every seed of every template (``seed_population``, as ``evo run`` seeds a new
shape: heuristic picks, then spread samples, ``--per-template`` per template) on the 48-shape
LLM-layer sample (``bench/_llm_sample.py`` over ``llm_layers.csv``, as ``llm_layers_bench.py``
picks it), through the real ``LocalPool``; statuses counted per template and per shape class.
With ``--static`` (no GPU needed) part (a) instead runs every seed, all of them, through the
evaluator's compile step only (source scan, NVRTC, the compiled-PTX scan, the machine-code
check), generic and specialised: the static half of "no false rejection", on a CPU machine.
(b) **Archive elites** (``--archive``): the ``--top`` elites of every shape of an archive made
by an earlier evaluator, re-evaluated now at their shape; statuses counted.

Every status other than ``ok`` is a false rejection (honest kernels only go in): each is listed
with its message. Shapes are submitted round-robin, and within a shape templates round-robin
(every template's first seed before any second one), so a ``--budget-s`` cut (no new submissions
after it) leaves every shape and template partly covered; what was not run is counted as such. Timing uses
the device timer only (the host timers flag nothing); the memoisation pass runs for every
candidate (no elite threshold), so a false memo flag would show. Exit status 0 only when every
evaluation that ran is ``ok``.

``--part I/N`` keeps the I-th of N equal slices of each part's job list (in its round-robin
order): a sweep longer than one device call runs as N calls, each reported on its own.
``--templates NAMES`` keeps only those templates' seeds: the sweep again for the templates that
changed since it last ran (the evaluator and the other templates' seeds being the same).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import _llm_sample as smp  # noqa: E402
from populations import Archive, Candidate, Shape, load_templates  # noqa: E402

_SHARED = ("../shared", str(HERE.parent.parent / "shared"), str(HERE.parent / "shared"),
           str(HERE.parent / ".carry_shared"), str(HERE.parent.parent / ".carry_shared"))
CSV_DEFAULTS = tuple(f"{d}/shapes/llm_layers.csv" for d in _SHARED)


def random_rows(seeds: Iterable[int]) -> list:
    """The random-shape benchmark's rows for each of ``seeds`` (``_rand_shapes.generate``, as
    ``random_shapes_bench.py --seed`` draws them), each shape once."""
    import _rand_shapes as gen

    seen: set = set()
    return [r for s in seeds for r in gen.generate(s) if not (r.key in seen or seen.add(r.key))]


def seed_jobs(csv: Optional[Path], per_template: int, arch: str, seed: int = 0,
              rows: Optional[list] = None) -> list[tuple[str, Candidate, dict]]:
    """(shape key, candidate, labels) for every seed of every template on the LLM-layer sample
    (or on ``rows``, anything with ``shape`` and ``classes``), round-robin over shapes."""
    from evo.search._seeding import seed_population  # the engine's own seeding (not re-exported by evo)

    if rows is None:
        rows = smp.sample(smp.candidate_pool(smp.read_rows(csv)))
    templates = list(load_templates().values())
    per_shape = []
    for row in rows:
        shape = Shape.parse(row.shape)
        cands = seed_population(shape, templates, per_template, random.Random(seed), arch=arch)
        by_template: dict[str, list[Candidate]] = defaultdict(list)
        for c in cands:
            by_template[c.template or "?"].append(c)
        ordered = _round_robin(list(by_template.values()))  # every template's first seed, then its second, ...
        per_shape.append([(row.shape, c, {"template": c.template or "?", "classes": list(row.classes),
                                          "seed": (c.meta or {}).get("seed", "")}) for c in ordered])
    return _round_robin(per_shape)


def archive_jobs(path: str, top: int) -> list[tuple[str, Candidate, dict]]:
    """(shape key, candidate at that shape alone, labels) for the ``top`` elites of every shape."""
    per_shape = []
    with Archive(path) as arch:
        for shape in arch.shapes():
            rows = []
            for rank, el in enumerate(arch.elites(shape, top=top), 1):
                if el.candidate is None:
                    continue
                cand = el.candidate if tuple(el.candidate.shapes) == (shape,) else el.candidate.derive(shapes=(shape,))
                rows.append((str(shape), cand, {"template": cand.template or "?", "rank": rank,
                                                "archived_speedup": round(el.fitness, 4)}))
            per_shape.append(rows)
    return _round_robin(per_shape)


def _round_robin(groups: list[list]) -> list:
    return [x for tier in itertools.zip_longest(*groups) for x in tier if x is not None]


def run_jobs(pool: Any, jobs: list[tuple[str, Candidate, dict]], budget_s: float,
             clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Submit ``jobs`` (until ``budget_s`` has passed), wait, and count statuses."""
    t0 = clock()
    futures = []
    for key, cand, labels in jobs:
        if clock() - t0 > budget_s:
            break
        futures.append((key, cand, labels, pool.submit(cand)))
    out: list[dict[str, Any]] = []
    for key, cand, labels, fut in futures:
        try:
            evals = fut.result()
            ev = next((e for e in evals if str(e.shape) == str(Shape.parse(key))), evals[0])
            status, message, speedup = ev.status.value, ev.message, ev.speedup
        except Exception as exc:  # the pool itself failed: counted, never hidden
            status, message, speedup = "pool error", repr(exc), None
        out.append({"shape": key, **labels, "knobs": dict(cand.knobs or {}), "status": status,
                    "message": message[:300], "speedup": speedup})
    return summarise(out, len(jobs), clock() - t0)


def static_jobs(jobs: list[tuple[str, Candidate, dict]], arch: str, cache_dir: Optional[str],
                workers: int = 2) -> dict[str, Any]:
    """Every job's candidate, generic and specialised to its shape, through ``compile_candidate``
    (source scan, compile, compiled-output scan); a status other than ok is a false rejection."""
    from concurrent.futures import ThreadPoolExecutor

    from evaluators import compile_candidate
    from populations import load_templates

    templates = load_templates()
    t0 = time.monotonic()

    def one(job: tuple[str, Candidate, dict]) -> list[dict[str, Any]]:
        key, cand, labels = job
        rows = []
        for spec in (False, True):
            c = templates[cand.template].candidate(dict(cand.knobs), Shape.parse(key), specialize=True) if spec else cand
            r = compile_candidate(c, arch, cache_dir=cache_dir)
            rows.append({"shape": key, **labels, "specialised": spec, "knobs": dict(cand.knobs or {}),
                         "status": r.status.value, "message": (r.message or "")[:300], "speedup": None})
        return rows

    with ThreadPoolExecutor(max_workers=workers) as ex:
        out = [r for rows in ex.map(one, jobs) for r in rows]
    return summarise(out, 2 * len(jobs), time.monotonic() - t0)


def summarise(rows: list[dict[str, Any]], planned: int, wall_s: float) -> dict[str, Any]:
    """Counts by status, template and class; every non-ok row kept whole."""
    by_template: dict[str, Counter] = defaultdict(Counter)
    by_class: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        by_template[r["template"]][r["status"]] += 1
        for c in r.get("classes", ()):
            by_class[c][r["status"]] += 1
    statuses = Counter(r["status"] for r in rows)
    return {"planned": planned, "ran": len(rows), "not_run": planned - len(rows), "wall_s": round(wall_s, 1),
            "shapes": len({r["shape"] for r in rows}), "statuses": dict(statuses),
            "false_rejections": len(rows) - statuses.get("ok", 0),
            "by_template": {k: dict(v) for k, v in sorted(by_template.items())},
            "by_class": {k: dict(v) for k, v in sorted(by_class.items())},
            "not_ok": [r for r in rows if r["status"] != "ok"]}


def part_slice(jobs: list, part: Optional[tuple[int, int]]) -> list:
    """The ``part`` = (i, n) slice of ``jobs``: the i-th of n contiguous, near-equal slices (all of them without one)."""
    if part is None:
        return jobs
    i, n = part
    return jobs[len(jobs) * i // n: len(jobs) * (i + 1) // n]


def _part(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"I/N with integers, not {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"I/N needs 0 <= I < N, not {text!r}")
    return i, n


def _first(path: Optional[str], defaults: Iterable[str]) -> Path:
    for p in ([path] if path else list(defaults)):
        if Path(p).is_file():
            return Path(p)
    raise SystemExit(f"no shapes CSV at {path or ', '.join(defaults)}")


def _print(name: str, part: dict[str, Any]) -> None:
    print(f"{name}: {part['ran']} of {part['planned']} evaluated on {part['shapes']} shapes in {part['wall_s']} s; "
          f"statuses {part['statuses']}; false rejections {part['false_rejections']}", flush=True)
    for t, c in part["by_template"].items():
        print(f"  {t:<12} {c}")
    for r in part["not_ok"]:
        print(f"  NOT OK {r['shape']} {r['template']} {r['knobs']}: {r['status']}: {r['message'][:200]}")


def main(argv: Optional[list[str]] = None, pool_factory: Optional[Callable[..., Any]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", default=None, help="llm_layers.csv (default: ../shared or the carried copy)")
    ap.add_argument("--per-template", type=int, default=4, help="seeds per template and shape (evo run's default 4)")
    ap.add_argument("--archive", default=None, help="archive whose elites are re-evaluated (part b)")
    ap.add_argument("--top", type=int, default=10, help="elites per archived shape")
    ap.add_argument("--skip-seeds", action="store_true", help="part (b) only")
    ap.add_argument("--budget-s", type=float, default=1e9, help="no new submissions after this many seconds, per part")
    ap.add_argument("--compile-workers", type=int, default=min(12, os.cpu_count() or 4))
    ap.add_argument("--static", action="store_true", help="part (a) on the CPU: every seed through scan, compile, PTX scan and SASS check")
    ap.add_argument("--arch", default="sm_90a", help="with --static: the target architecture")
    ap.add_argument("--random-seeds", default="", help="comma-separated seeds: also every template's seeds on "
                    "the random-shape benchmark's shapes of those seeds (a part of its own, its own budget)")
    ap.add_argument("--part", type=_part, default=None, metavar="I/N",
                    help="only the I-th (from 0) of N slices of each part's jobs: a long sweep over N calls")
    ap.add_argument("--templates", default="", metavar="NAMES",
                    help="comma-separated: only these templates' seeds (a sweep again after those templates changed)")
    ap.add_argument("--json", default=None, help="write the summary here")
    args = ap.parse_args(argv)
    names = {x.strip() for x in args.templates.split(",") if x.strip()}
    unknown = names - set(load_templates())
    if unknown:
        ap.error(f"--templates: no template named {', '.join(sorted(unknown))}")

    def seeds(*a: Any, **kw: Any) -> list[tuple[str, Candidate, dict]]:
        jobs = seed_jobs(*a, **kw)  # the round-robin order kept, only other templates' seeds left out
        return [j for j in jobs if j[2]["template"] in names] if names else jobs
    try:
        rand_seeds = [int(x) for x in args.random_seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--random-seeds: comma-separated integers, not {args.random_seeds!r}")
    if args.static:
        import tempfile
        jobs = [] if args.skip_seeds else seeds(_first(args.csv, CSV_DEFAULTS), args.per_template, args.arch)
        if rand_seeds:
            jobs += seeds(None, args.per_template, args.arch, rows=random_rows(rand_seeds))
        with tempfile.TemporaryDirectory() as cache:
            report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "command": " ".join(["python3", "bench/false_rejections.py", *(argv or sys.argv[1:])]),
                      "static": static_jobs(jobs, args.arch, cache, workers=args.compile_workers)}
        _print("static (scan + compile + PTX scan + SASS check)", report["static"])
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        return 0 if report["static"]["false_rejections"] == 0 else 1
    if pool_factory is None:
        from evaluators import LocalPool

        def pool_factory() -> Any:
            return LocalPool(compile_workers=args.compile_workers, timers=("device",))
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "command": " ".join(["python3", "bench/false_rejections.py", *(argv or sys.argv[1:])])}
    with pool_factory() as pool:
        arch = getattr(pool, "arch", None) or "sm_90a"
        if not args.skip_seeds:
            report["seeds"] = run_jobs(pool, part_slice(seeds(_first(args.csv, CSV_DEFAULTS), args.per_template,
                                                              arch), args.part), args.budget_s)
            _print("seeds", report["seeds"])
        if rand_seeds:
            report["random_seeds"] = run_jobs(pool, part_slice(seeds(None, args.per_template, arch,
                                                                     rows=random_rows(rand_seeds)), args.part),
                                              args.budget_s)
            _print(f"seeds on the random shapes of seeds {rand_seeds}", report["random_seeds"])
        if args.archive:
            report["archive"] = run_jobs(pool, part_slice(archive_jobs(args.archive, args.top), args.part), args.budget_s)
            _print("archive elites", report["archive"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    bad = sum(report[p]["false_rejections"] for p in ("seeds", "random_seeds", "archive") if p in report)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
