"""Red-team run (issue 5): the hostile corpus through the real LocalPool, interleaved with honest
kernels, on a GPU machine.

Every case of ``tests/hostile`` goes through the pool ``--rounds`` times in a shuffled order with
the honest control (the corpus base HGEMM) between every ``--every`` cases. The table says, per
case and round, the status expected, the status got and the GPU seconds it cost; afterwards the
pool must still evaluate the control as ``ok`` and the control's device time must be within
``--tolerance`` of its time before the corpus (a hostile kernel must not leave the GPU slower:
clocks, L2 persistence, a stuck context, leaked memory).

    PYTHONUNBUFFERED=1 python3 bench/redteam.py --out $OUT          # on the device machine

Deadlines are short (``--deadline-s``) so that hangs cost seconds, and the compile timeout is
``--compile-timeout-s``; ceilings are not re-measured at each worker restart unless
``--measure-ceilings`` (the floor then uses the harness's defaults). Exit status 0 only when every
case was caught, the pool is alive and the control's timing held.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hostile_corpus import HostileCase, load_corpus, load_good  # noqa: E402
from populations import Candidate, Evaluation, Status  # noqa: E402

GOOD = "_good"


@dataclass
class Row:
    """One submission: a hostile case (or the control) in one round."""

    name: str
    round: int
    expected: str
    acceptable: tuple[str, ...] = ()
    got: str = ""
    seconds: float = 0.0
    message: str = ""
    flags: tuple[str, ...] = ()
    device_us: Optional[float] = None
    caught: Optional[bool] = None
    done_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _summarise(row: Row, evals: list[Evaluation]) -> None:
    worst = next((e for e in evals if e.status is not Status.OK), evals[0])
    row.got, row.message, row.flags = worst.status.value, worst.message, tuple(worst.flags)
    dev = worst.timers.get("device")
    if dev is not None:
        row.device_us = dev.median * 1e6
        row.extra["baseline_us"] = dev.baseline_median * 1e6
    row.extra.update(compile_s=worst.compile_s, correctness_s=worst.correctness_s, timing_s=worst.timing_s,
                     max_error=worst.max_error, checks=list(worst.measurement.checks))


def schedule(cases: list[HostileCase], rounds: int, every: int, seed: int,
             repeat: Optional[dict[str, int]] = None) -> list[tuple[int, Optional[HostileCase]]]:
    """(round, case or None for the control): control first, between every ``every`` cases, and last.
    ``repeat`` names cases submitted that many times per round (a fault that depends on luck)."""
    rng = random.Random(seed)
    out: list[tuple[int, Optional[HostileCase]]] = [(0, None)]
    for r in range(1, rounds + 1):
        order = [c for c in cases for _ in range(max(1, (repeat or {}).get(c.name, 1)))]
        rng.shuffle(order)
        for i, case in enumerate(order, 1):
            out.append((r, case))
            if i % every == 0:
                out.append((r, None))
    out.append((rounds, None))
    return out


def run_redteam(*, rounds: int = 2, every: int = 8, only: Optional[list[str]] = None, seed: int = 5,
                budget_s: float = 1e9, deadline_s: float = 15.0, compile_timeout_s: float = 20.0,
                measure_ceilings: bool = False, good_shape: str = "1024x1024x1024",
                log_dir: Optional[str] = None, pool: Any = None, repeat: Optional[dict[str, int]] = None,
                buffers: Optional[str] = None, rotations: int = 2) -> dict[str, Any]:
    """Run the corpus; return {"rows", "control", "alive", "timing_ok", "holes", "seconds"}.

    ``rotations``: the device timer runs on that many rotations (the cached one and fresh ones, as
    the precise preset does), so that attacks idle on rotations after the first meet the checks."""
    from evaluators.pools._pool import LocalPool

    cases = load_corpus()
    if only:
        cases = [c for c in cases if c.name in only]
    good = load_good(good_shape)
    t_start = time.monotonic()
    own_pool = pool is None
    if own_pool:
        pool = LocalPool(compile_workers=4, timers=("device",), compile_timeout_s=compile_timeout_s,
                         job_options={"rotations": rotations} if rotations > 1 else None,
                         deadlines={"load": deadline_s, "correctness": deadline_s, "timing": 4 * deadline_s},
                         worker_options={"measure_ceilings": measure_ceilings,
                                         **({"buffers": buffers} if buffers else {})}, log_dir=log_dir)
    rows: list[Row] = []
    lock = threading.Lock()
    last_done = [time.monotonic()]
    pending = []
    buffers_info: list = []
    try:
        for rnd, case in schedule(cases, rounds, every, seed, repeat):
            if time.monotonic() - t_start > budget_s and case is not None:
                rows.append(Row(case.name, rnd, case.expected.value, got="not run", message="budget spent"))
                continue
            if case is None:
                row, cand = Row(GOOD, rnd, "ok"), good
            else:
                row = Row(case.name, rnd, case.expected.value, tuple(s.value for s in case.acceptable))
                cand = case.candidate
                if cand is None:  # the contract refused it before any evaluator saw it
                    row.got, row.message, row.caught = "rejected", f"{type(case.error).__name__}: {case.error}", True
                    row.extra["at"] = "Candidate construction"
                    rows.append(row)
                    continue
            rows.append(row)
            submitted = time.monotonic()

            def done(fut: Any, row: Row = row, submitted: float = submitted) -> None:
                now = time.monotonic()
                with lock:
                    row.seconds = now - max(submitted, last_done[0])
                    last_done[0] = now
                row.done_at = now
                try:
                    _summarise(row, fut.result())
                except Exception as exc:  # the pool itself failed: record it, the table shows it
                    row.got, row.message = "pool error", repr(exc)

            fut = pool.submit(cand)
            fut.add_done_callback(done)
            pending.append(fut)
            print(f"submitted {row.name} (round {rnd}) at {submitted - t_start:.1f}s", flush=True)
        for fut in pending:
            try:
                fut.result()
            except Exception:
                pass
        final = Row(GOOD, rounds + 1, "ok")
        try:
            _summarise(final, pool.submit(good).result(timeout=max(60.0, 8 * deadline_s)))
        except Exception as exc:
            final.got, final.message = "pool error", repr(exc)
        rows.append(final)
        buffers_info = [dict(getattr(s, "info", {}) or {}).get("buffers") for s in getattr(pool, "supervisors", ())]
    finally:
        if own_pool:
            pool.close()
    for row in rows:
        if row.name != GOOD and row.caught is None and row.got not in ("", "not run"):
            row.caught = row.got == row.expected or row.got in row.acceptable
    control = [r for r in rows if r.name == GOOD]
    before = next((r.device_us for r in control if r.device_us), None)
    after = next((r.device_us for r in reversed(control) if r.device_us), None)
    drift = (after / before - 1.0) if before and after else None
    alive = final.got == "ok"
    holes = sorted({r.name for r in rows if r.caught is False})
    return {"rows": rows, "control": {"before_us": before, "after_us": after, "drift": drift,
                                      "statuses": [r.got for r in control]},
            "alive": alive, "holes": holes, "seconds": time.monotonic() - t_start, "buffers": buffers_info}


def table(result: dict[str, Any]) -> str:
    lines = ["| case | round | expected | got | caught | seconds | note |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        mark = {True: "yes", False: "**NO**", None: ""}[r.caught]
        note = (r.message or "").replace("|", "/").replace("\n", " ")[:110]
        if r.name == GOOD and r.device_us:
            note = f"device {r.device_us:.1f} us (cuBLAS {r.extra.get('baseline_us', 0):.1f} us) {note}"
        exp = r.expected + (f" (or {', '.join(r.acceptable)})" if r.acceptable else "")
        lines.append(f"| {r.name} | {r.round} | {exp} | {r.got} | {mark} | {r.seconds:.2f} | {note} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--every", type=int, default=8, help="control kernel after this many hostile cases")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop submitting new cases after this many seconds")
    ap.add_argument("--deadline-s", type=float, default=15.0, help="load/correctness deadline (timing: 4x)")
    ap.add_argument("--compile-timeout-s", type=float, default=20.0)
    ap.add_argument("--measure-ceilings", action="store_true")
    ap.add_argument("--good-shape", default="1024x1024x1024")
    ap.add_argument("--tolerance", type=float, default=0.02, help="allowed drift of the control's device time")
    ap.add_argument("--repeat", default="", help="NAME=K,...: submit these cases K times per round")
    ap.add_argument("--buffers", default=None, choices=["vmm", "torch"],
                    help="worker buffers (default: the worker's, EVO_EVAL_BUFFERS)")
    ap.add_argument("--rotations", type=int, default=2, help="rotations the device timer runs on (job option)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for redteam.json and redteam.md")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    res = run_redteam(rounds=args.rounds, every=args.every, only=[s for s in args.only.split(",") if s] or None,
                      seed=args.seed, budget_s=args.budget_s, deadline_s=args.deadline_s,
                      compile_timeout_s=args.compile_timeout_s, measure_ceilings=args.measure_ceilings,
                      good_shape=args.good_shape, log_dir=str(out / "logs") if out else None,
                      repeat={k: int(v) for k, v in (x.split("=") for x in args.repeat.split(",") if x)},
                      buffers=args.buffers, rotations=args.rotations)
    text = table(res)
    ctl = res["control"]
    drift = ctl["drift"]
    timing_ok = drift is not None and abs(drift) <= args.tolerance
    summary = (f"\npool alive after the corpus: {res['alive']}; control device time before {ctl['before_us']} us, "
               f"after {ctl['after_us']} us, drift {drift if drift is None else f'{100 * drift:+.2f}%'} "
               f"(limit {100 * args.tolerance:.0f}%): {'ok' if timing_ok else 'NOT OK'}\n"
               f"control statuses: {ctl['statuses']}\n"
               f"holes (not caught): {', '.join(res['holes']) or 'none'}\nbuffers: {res.get('buffers')}\n"
               f"wall {res['seconds']:.1f} s")
    print(text + summary, flush=True)
    if out:
        (out / "redteam.md").write_text(text + "\n" + summary + "\n")
        rows = [{**{k: v for k, v in r.__dict__.items() if k != "done_at"}} for r in res["rows"]]
        (out / "redteam.json").write_text(json.dumps({**{k: v for k, v in res.items() if k != "rows"}, "rows": rows,
                                                      "timing_ok": timing_ok}, indent=1, default=str))
    return 0 if (res["alive"] and timing_ok and not res["holes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
