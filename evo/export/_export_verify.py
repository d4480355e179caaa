"""Re-timing before the export decision (``evo export --verify``): the decision, and the child it times in.

The archive's speedups come from the evaluator's timer; on 4096x18432x2304 an elite it timed
faster than cuBLAS was 7% slower in the benchmark's independent re-timing. So with ``--verify``
the export builds the top ``top_k`` exportable candidates of every shape into a trial library,
re-times their launchers and cuBLAS in both layouts in one process (``evo.export._export_timer``:
CUDA-graph replay over operand sets rotated through more than 2x L2, interleaved rounds, medians),
and :func:`decide` keeps the fastest candidate only when it beats cuBLAS by ``margin`` (2% by
default, about the spread of two medians of one kernel); otherwise the shape goes to cuBLAS. A kept
kernel is then re-timed once more, alone beside cuBLAS, in a second timer call (a fresh child
process) and stays only if it beats cuBLAS by the margin there too (:func:`confirm`): on the
random-shape benchmark (seeds 10-15, H100) cuBLAS's time at one shape differed by 10-37% between
two processes on 0-3 of about 100 shapes a seed, the kernel's by about 1%, so one re-timing that
caught cuBLAS slow exported a kernel 13% slower than the fallback (1310x184x6894, seed 15). The
cuBLAS to beat is, by default, the call the fallback would make: cuBLAS in the shape's own layout
(the library cannot run the other layout's cuBLAS without copying the weights, so a kernel slower
than cuBLAS NN but faster than cuBLAS TN is still the faster path for a TN caller);
``against="best"`` asks for the better of both layouts instead. Both layouts' timings, the
speedups over each and the decision go into the manifest (``verify`` per shape).

The timer is a seam (:data:`Timer`): :func:`child_timer` runs ``python -m evo.export._export_timer`` in a
child process (it initialises CUDA; a kernel that kills its context kills only the child). When
the child dies, the candidate it was trying is marked as having crashed it and the child is run
again over what is left; a shape whose timing itself died goes to cuBLAS. Tests pass a named
stand-in timer (no GPU on the CPU machine).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["Verify", "Timer", "decide", "confirm", "child_timer", "MARGIN", "TOP_K"]

MARGIN = 0.02
TOP_K = 3
REPO = Path(__file__).resolve().parents[2]  # the checkout: evo/<wing>/ is two folders down

#: ``timer(trial_library, plan) -> {shape: timing}``. ``plan`` items: ``shape``, ``m``, ``n``, ``k``,
#: ``layout``, ``candidates`` (``symbol``, ``workspace``). A timing: ``cublas_tn_s``, ``cublas_nn_s``
#: and ``candidates`` {symbol: {``s`` (None: not timed), ``rel_err``, ``rc``, ``error``}}; a shape
#: that could not be timed has an ``error`` instead.
Timer = Callable[[Path, list[dict[str, Any]]], dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class Verify:
    """How ``export`` re-times: the timer, how many candidates per shape, the margin to beat cuBLAS by."""

    timer: Timer
    top_k: int = TOP_K
    margin: float = MARGIN
    against: str = "layout"  # the cuBLAS to beat: the shape's own layout (the fallback's) or the better one
    confirm: bool = True  # re-time each kept kernel once more in a second timer call; keep it only if it wins again
    name: str = "evo.export._export_timer (CUDA-graph replay, operands rotated over > 2x L2, medians)"

    def __post_init__(self) -> None:
        if self.top_k < 1 or not 0 <= self.margin < 1 or self.against not in ("layout", "best"):
            raise ValueError(f"verify: top_k >= 1, margin in [0, 1), against 'layout' or 'best'; got {self.top_k}, "
                             f"{self.margin}, {self.against!r}")


def _us(s: Optional[float]) -> str:
    return "-" if s is None else f"{s * 1e6:.2f} us"


def decide(trials: list[dict[str, Any]], timing: dict[str, Any], layout: str = "TN", margin: float = MARGIN,
           keep_slower: bool = False, against: str = "layout") -> dict[str, Any]:
    """The verified decision for one shape.

    ``trials``: the shape's candidates in archive order (``symbol``, ``candidate``, ``rank``,
    ``fitness``); ``timing``: what the timer measured (see :data:`Timer`). The fastest candidate
    that passed its check is kept when it beats, by ``margin``, cuBLAS in the shape's own
    ``layout`` (``against="layout"``: the cuBLAS call the library's fallback would make, so the
    user never gets the slower of the two) or cuBLAS in its better layout (``"best"``: the
    benchmark's reference, which the fallback cannot reach when the better layout is the other).
    Returns ``path`` (``evolved`` or ``cublas``), ``symbol`` and ``candidate`` of the kept
    kernel (None for cuBLAS), ``why``, and the figures: both cuBLAS layouts, the better one, and
    per candidate its time, its speedup over the better layout and over the shape's layout, its
    check and its status."""
    if against not in ("layout", "best"):
        raise ValueError(f"verify: against is 'layout' or 'best', got {against!r}")
    tn, nn = timing.get("cublas_tn_s"), timing.get("cublas_nn_s")
    layouts = {name: t for name, t in (("TN", tn), ("NN", nn)) if _positive(t)}
    record: dict[str, Any] = {"cublas_tn_s": tn, "cublas_nn_s": nn, "margin": margin, "against": against,
                              "candidates": []}
    if timing.get("error") or layout not in layouts:
        why = f"re-timing failed ({timing.get('error') or 'no cuBLAS time'}): left to cuBLAS"
        return {**record, "path": "cublas", "symbol": None, "candidate": None, "why": why}
    best_layout = min(layouts, key=layouts.__getitem__)
    best, own = layouts[best_layout], layouts[layout]
    record.update(cublas_s=best, cublas_layout=best_layout)
    measured = timing.get("candidates") or {}
    for t in trials:
        m = measured.get(t["symbol"], {"error": "not re-timed"})
        s = m.get("s")
        ok = _positive(s)
        record["candidates"].append({
            "candidate": t["candidate"], "rank": t["rank"], "archive_fitness": t.get("fitness"), "s": s,
            "speedup": best / s if ok else None, "speedup_same_layout": own / s if ok else None,
            "rel_err": m.get("rel_err") if _finite(m.get("rel_err")) else None,  # the manifest is standard JSON
            "status": "timed" if ok else _why_not(m)})
    key = "speedup_same_layout" if against == "layout" else "speedup"
    timed = [c for c in record["candidates"] if c[key] is not None]
    cublas = f"cuBLAS TN {_us(tn)}, NN {_us(nn)}"
    if not timed:
        return {**record, "path": "cublas", "symbol": None, "candidate": None,
                "why": f"no candidate passed the re-timing's check ({record['candidates'][0]['status'] if trials else 'none'}); "
                       f"{cublas}"}
    win = max(timed, key=lambda c: c[key])
    sym = next(t["symbol"] for t in trials if t["candidate"] == win["candidate"] and t["rank"] == win["rank"])
    ref = f"cuBLAS in the shape's layout ({layout})" if against == "layout" else f"cuBLAS in its better layout ({best_layout})"
    other = (f"; {win['speedup']:.3f}x of the better layout ({best_layout})" if against == "layout" and best_layout != layout
             else f"; {win['speedup_same_layout']:.3f}x of the shape's layout ({layout})" if best_layout != layout else "")
    figures = (f"re-timed {win[key]:.3f}x of {ref}{other} ({_us(win['s'])} against {cublas}), "
               f"best of {len(timed)} re-timed")
    if win[key] >= 1 + margin or keep_slower:
        kept = "" if win[key] >= 1 + margin else f"; kept by keep_slower (needs >= {1 + margin:.2f}x)"
        return {**record, "path": "evolved", "symbol": sym, "candidate": win["candidate"],
                "why": f"{win['candidate']}: {figures}{kept}"}
    return {**record, "path": "cublas", "symbol": None, "candidate": None,
            "why": f"best re-timed kernel {win['candidate']} does not beat {ref} by {margin:.0%}: {figures}"}


def confirm(first: dict[str, Any], timing: dict[str, Any], layout: str = "TN", margin: float = MARGIN,
            against: str = "layout") -> dict[str, Any]:
    """The decision ``first`` (an ``evolved`` one from :func:`decide`) after a second, independent
    re-timing ``timing`` of its kept kernel (``first["symbol"]``) beside cuBLAS: kept when it beats
    cuBLAS by ``margin`` there too, else the shape goes to cuBLAS. The second figures go into the
    record (``confirm``); the kernel's speedup stands at the lower of the two re-timings, so that
    one process that caught cuBLAS slow cannot carry a kernel alone."""
    if first.get("path") != "evolved":
        return first
    sym = first["symbol"]
    second = decide([{"symbol": sym, "candidate": first["candidate"], "rank": 0, "fitness": None}], timing, layout,
                    margin, False, against)
    c = second["candidates"][0] if second["candidates"] else {}
    record = {"cublas_tn_s": timing.get("cublas_tn_s"), "cublas_nn_s": timing.get("cublas_nn_s"), "s": c.get("s"),
              "speedup": c.get("speedup"), "speedup_same_layout": c.get("speedup_same_layout"), "status": c.get("status"),
              "path": second["path"]}
    if second["path"] == "evolved":
        key = "speedup_same_layout" if against == "layout" else "speedup"
        was = next(x[key] for x in first["candidates"] if x["candidate"] == first["candidate"])
        why = f"{first['why']}; confirmed in a second re-timing at {c[key]:.3f}x (the lower, {min(was, c[key]):.3f}x, stands)"
        return {**first, "confirm": record, "why": why}
    return {**first, "path": "cublas", "symbol": None, "candidate": None, "confirm": record,
            "why": f"not confirmed: {second['why']}; the first re-timing had {first['why']}"}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _positive(x: Any) -> bool:
    return _finite(x) and x > 0


def _why_not(m: dict[str, Any]) -> str:
    if m.get("error"):
        return str(m["error"])
    if m.get("rc"):
        return f"launcher returned {m['rc']}"
    if m.get("rel_err") is not None:
        return f"wrong output (relative error {m['rel_err']:.2e})"
    return "not timed"


# -- the child process ----------------------------------------------------------------------------
def _read_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # a line cut by the child's death
    return out


def child_timer(timeout_s: float = 900.0, rounds: Optional[int] = None, log: Callable[[str], None] = lambda m: None) -> Timer:
    """A :data:`Timer` running ``python -m evo.export._export_timer`` in a child, again after a crash."""
    def timer(lib: Path, plan: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        done: dict[str, dict[str, Any]] = {}
        crashed: dict[str, dict[str, str]] = {}  # shape -> {symbol: why}
        todo = [dict(item) for item in plan]
        with tempfile.TemporaryDirectory(prefix="evo-verify-") as tmp:
            for attempt in range(1 + sum(len(i["candidates"]) for i in plan)):
                if not todo:
                    break
                plan_path, out = Path(tmp) / f"plan{attempt}.json", Path(tmp) / f"out{attempt}.jsonl"
                plan_path.write_text(json.dumps(todo))
                rc, tail = _run_child(lib, plan_path, out, timeout_s, rounds)
                lines = _read_lines(out)
                for rec in lines:
                    if "cublas_tn_s" in rec:
                        rec["candidates"].update(crashed.get(rec["shape"], {}))
                        done[rec["shape"]] = rec
                todo = [i for i in todo if i["shape"] not in done]
                if rc == 0 or not todo:
                    continue
                last = lines[-1] if lines else {}
                log(f"re-timing child exit {rc} at {last or 'start'}: {tail}")
                if rc == 124 or not lines:  # a hang, or it never got going: trying again would not help
                    for i in todo:
                        done[i["shape"]] = {"shape": i["shape"], "error": f"re-timing process exit {rc}: {tail}"}
                    break
                if "trying" in last:  # that candidate killed it: leave it out, time the rest again
                    shape, sym = last["trying"], last["symbol"]
                    crashed.setdefault(shape, {})[sym] = {"error": f"crashed the re-timing process (exit {rc}: {tail})"}
                    item = next(i for i in todo if i["shape"] == shape)
                    item["candidates"] = [c for c in item["candidates"] if c["symbol"] != sym]
                else:  # died elsewhere (the timed replays, cuBLAS, start-up): that shape is not verified
                    shape = last.get("timing") or todo[0]["shape"]
                    done[shape] = {"shape": shape, "error": f"re-timing process exit {rc}: {tail}"}
                    todo = [i for i in todo if i["shape"] != shape]
        for item in plan:
            done.setdefault(item["shape"], {"shape": item["shape"], "error": "not re-timed"})
        return done
    return timer


def _run_child(lib: Path, plan: Path, out: Path, timeout_s: float, rounds: Optional[int]) -> tuple[int, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "evo.export._export_timer", str(lib), str(plan), str(out)] + ([str(rounds)] if rounds else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return 124, f"ran past {timeout_s:.0f} s"
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
    return proc.returncode, tail[0][:200]
