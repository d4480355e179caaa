#!/usr/bin/env python3
"""Per operator (and per LLM model): how many proposals were evaluated, and the shares that
compiled, passed (status ok, no flags) and improved on their parent, from an evo archive.

"Improved on its parent": the child's fitness at the shape beats the best fitness its parents
have at that shape (a parent with none there, e.g. a failed one given the fix prompt, counts as
beaten by any valid child). Seeds and transfers (no parents) are left out of the improve share.
Where the run's events.jsonl has a stop event, the LLM operators' calls, tokens and proposals
that never reached the GPU (parse failures, duplicates) are printed from it too, with the LLM's
own GPU seconds (inference on a GPU: per operator from the candidates' ``gpu_s``, per run from
the budget; *held* seconds, inside the GPU lease, with the seconds *waited* for the lease and the
calls' wall seconds beside them, issue 35), where the model ran (the ``llm_placement`` event), what the GPU lease cost
(``llm_lease``: slices, seconds held and waited) and, under ``--operator-bandit``, the arms.

    python scripts/operator_shares.py --archive runs/llm [--json]

Exits 2 when the archive cannot be read.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from populations import Archive, ArchiveError, Status  # noqa: E402

NOT_COMPILED = {Status.REJECTED, Status.COMPILE_ERROR}


def shares(archive: Archive) -> dict[str, dict[str, Any]]:
    """Rows keyed by operator, and by ``operator/model`` for candidates that name a model."""
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(float))
    for shape in archive.shapes():
        cands = {c.id: c for c in archive.candidates(shape)}
        latest: dict[str, Any] = {}
        for ev in archive.evaluations(shape):  # in order: the last evaluation of a candidate counts
            latest[ev.candidate_id] = ev
        for cid, ev in latest.items():
            cand = cands.get(cid)
            if cand is None:
                continue
            keys = [cand.operator or "?"]
            if cand.model:
                keys.append(f"{cand.operator}/{cand.meta.get('model_name') or cand.model}")
            parent_fits = [latest[p].fitness for p in cand.parents if p in latest]
            best_parent = max((f for f in parent_fits if f is not None), default=None)
            for key in keys:
                r = rows[key]
                r["evaluated"] += 1
                r["compiled"] += ev.status not in NOT_COMPILED
                r["passed"] += ev.status is Status.OK and not ev.flags
                if cand.parents:
                    r["with_parent"] += 1
                    r["improved"] += ev.fitness is not None and not ev.flags and (
                        best_parent is None or ev.fitness > best_parent)
                r["tokens"] += int(cand.meta.get("tokens", 0) or 0)
                r["llm_seconds"] += float(cand.meta.get("seconds", 0) or 0)
                r["llm_gpu_s"] += float(cand.meta.get("gpu_s", 0) or 0)
                r["llm_gpu_wait_s"] += float(cand.meta.get("gpu_wait_s", 0) or 0)
    out = {}
    for key, r in sorted(rows.items()):
        n, p = r["evaluated"], r["with_parent"]
        out[key] = {"evaluated": int(n), "compiled": int(r["compiled"]), "passed": int(r["passed"]),
                    "with_parent": int(p), "improved": int(r["improved"]),
                    "compile_share": round(r["compiled"] / n, 4) if n else None,
                    "pass_share": round(r["passed"] / n, 4) if n else None,
                    "improve_share": round(r["improved"] / p, 4) if p else None,
                    "tokens": int(r["tokens"]),
                    "mean_llm_seconds": round(r["llm_seconds"] / n, 3) if r["tokens"] and n else None,
                    "llm_gpu_s": round(r["llm_gpu_s"], 3), "llm_gpu_wait_s": round(r["llm_gpu_wait_s"], 3),
                    "llm_wall_s": round(r["llm_seconds"], 3)}
    return out


def last_event(folder: Path, name: str = "stop") -> dict[str, Any]:
    """The last ``name`` event of the run's events.jsonl (empty when there is none)."""
    path = folder / "events.jsonl"
    last: dict[str, Any] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == name:
                last = doc
    return last


def stop_event(folder: Path) -> dict[str, Any]:
    """The last stop event of the run's events.jsonl (empty when there is none)."""
    return last_event(folder, "stop")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", required=True, help="archive directory (read only)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    try:
        with Archive(args.archive, mode="r") as archive:
            table = shares(archive)
    except (ArchiveError, OSError) as exc:
        print(f"operator_shares: {exc}", file=sys.stderr)
        return 2
    stop = stop_event(Path(args.archive))
    llm = {"models": stop.get("models", {}),
           "proposal_failures": {k: v for k, v in stop.get("proposal_failures", {}).items() if k.startswith("llm")},
           "tokens": stop.get("budget", {}).get("tokens"), "llm_gpu_s": stop.get("budget", {}).get("llm_gpu_s"),
           "llm_gpu_wait_s": stop.get("budget", {}).get("llm_gpu_wait_s"),
           "placement": {k: v for k, v in last_event(Path(args.archive), "llm_placement").items() if k not in ("t", "event", "shape")},
           "lease": {k: v for k, v in last_event(Path(args.archive), "llm_lease").items() if k not in ("t", "event", "shape")},
           "bandit": stop.get("bandit")}
    if args.json:
        json.dump({"format": "evo-operator-shares/1", "operators": table, "llm_run": llm}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{'operator':34} {'evaluated':>9} {'compile':>8} {'pass':>8} {'improve':>8} {'tokens':>9}")
    for key, r in table.items():
        def pct(x: Any) -> str:
            return "-" if x is None else f"{100 * x:.1f}%"
        print(f"{key:34} {r['evaluated']:>9} {pct(r['compile_share']):>8} {pct(r['pass_share']):>8} "
              f"{pct(r['improve_share']):>8} {r['tokens']:>9}")
    for name, per_model in llm["models"].items():
        for model, counts in per_model.items():
            print(f"run: {name}/{model}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for reason, n in sorted(llm["proposal_failures"].items(), key=lambda kv: -kv[1]):
        print(f"run: failed proposal x{n}: {reason}")
    if llm["placement"]:
        print(f"run: LLM placement {llm['placement'].get('where')} (device {llm['placement'].get('device') or '-'}); "
              f"LLM GPU seconds held {llm['llm_gpu_s'] or 0}, waited for the lease {llm['llm_gpu_wait_s'] or 0} "
              "(held is charged, waits are not)")
    if llm["lease"]:
        print("run: GPU lease: " + ", ".join(f"{k} {v}" for k, v in llm["lease"].items()))
    for arm, row in (llm["bandit"] or {}).items():
        print(f"run: bandit arm {arm}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
