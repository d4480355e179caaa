"""The random-shape benchmark's additions to the time stage (issue 34), after ``_bench_stages.stage_time``
has timed cuBLAS in both layouts, the exported library and the plain peer, in the same process:

- **the pad peer** on the misaligned rows (:func:`stage_pad`): ``../shared/peers/pad_cublas.py``
  (or the carried ``.carry_shared/`` copy), imported at run time and never copied into the
  repository (peers are yardsticks). Its own ``main()`` runs per row, in this process, on a
  one-row CSV with ``--json`` (its timer: graph replay over sets > 3x L2, 12 replays, medians; its
  cuBLAS in both layouts beside its padded paths), and its figures go into the row:
  ``pad_tn_s``/``pad_nn_s`` (its cuBLAS), ``pad_both_s`` (A and B copied into padded buffers every
  call), ``pad_a_s`` (the weights padded once, as a model stores them; only A copied per call),
  ``pad_aligned_s`` (the padded GEMM alone) and ``pad_multiple`` (the best of 8, 64, 128). The
  report compares its speedups over its own cuBLAS with evo's over ours, so the two timers'
  differences cancel. One row per call: a row whose check fails (the peer asserts) or that
  raises is noted and the next goes on; a lost CUDA context ends the pass.
- **the best evolved kernel before the export's fallback** (:func:`annotate_best`, no GPU):
  from the export manifest's re-timing records (``paths[shape].verify.candidates``: the top
  candidates re-timed beside cuBLAS by ``evo export --verify``, whatever the decision), the
  fastest one's speedup over the better cuBLAS layout (``verify_best_x``), over TN
  (``verify_best_x_tn``) and its time; and the archive's elite ranking (``Archive.fitness``: the
  median evaluator speedup of the best elite, ``archive_fitness``). ``best_evolved_x`` is the
  re-timed figure where the export re-timed the shape, else the archive's (``best_evolved_src``).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from _bench_stages import Run, first_file, read_json, shared_files, write_json
from _bench_time import import_peer

__all__ = ["PAD_DEFAULTS", "pad_call", "stage_pad", "best_evolved", "annotate_best"]

PAD_DEFAULTS = shared_files("peers/pad_cublas.py")


def pad_call(module: Any, m: int, n: int, k: int, tmp: Path) -> dict[str, Any]:
    """The pad peer's ``main()`` on M x N x K in this process (its argv patched to a one-row CSV
    and ``--json``); the row's ``pad_*`` fields, in seconds."""
    csv_path, out = tmp / f"{m}x{n}x{k}.csv", tmp / f"{m}x{n}x{k}.json"
    csv_path.write_text(f"M,N,K\n{m},{n},{k}\n")
    argv = sys.argv
    sys.argv = [str(getattr(module, "__file__", "pad_cublas.py")), str(csv_path), "--json", str(out)]
    try:
        module.main()
    finally:
        sys.argv = argv
    rec = next(r for r in json.loads(out.read_text()) if (r["M"], r["N"], r["K"]) == (m, n, k))
    fields = {"tn": "pad_tn_s", "nn": "pad_nn_s", "pad_both": "pad_both_s", "pad_a": "pad_a_s", "aligned": "pad_aligned_s"}
    return {**{f: rec[f"{key}_us"] * 1e-6 for key, f in fields.items()}, "pad_multiple": rec.get("pad")}


def stage_pad(run: Run, path: Optional[Path]) -> bool:
    """The pad peer on every misaligned row of ``WORK/results.json`` that has no figures yet
    (all with ``--retime``); saves after each. False without a GPU or when a row failed."""
    import torch

    if not torch.cuda.is_available():
        run.log("pad peer: no CUDA device")
        return False
    results = read_json(run.results_path, None)
    if results is None:
        run.log("pad peer: no results.json (the time stage's cuBLAS pass comes first)")
        return False
    todo = [r for r in results["rows"] if "misaligned" in r.get("classes", ()) and not r.get("pad_fatal")
            and (run.args.retime or not r.get("pad_both_s"))]
    meta = results.setdefault("meta", {})
    try:
        found = first_file(path, PAD_DEFAULTS, "pad peer")
        meta["pad_peer"] = (f"{found} (its main() per misaligned row, in this process; its own timer: graph replay "
                            "over sets > 3x L2, medians)")
        module = import_peer(found, "pad_cublas_peer") if todo else None
    except Exception as exc:  # no file, no GPU for its import: the pad columns stay empty, with the reason
        meta["pad_peer"] = f"pad peer unavailable: {type(exc).__name__}: {str(exc)[:160]}"
        run.log(meta["pad_peer"])
        todo = []
    write_json(run.results_path, results)
    ok, cap = True, run.cap()
    with tempfile.TemporaryDirectory(prefix="evo-pad-") as tmp:
        for i, r in enumerate(todo):
            if cap is not None and time.monotonic() > cap:
                run.log(f"pad peer: cap reached; {len(todo) - i} row(s) not timed")
                break
            try:
                r.update(pad_call(module, r["M"], r["N"], r["K"], Path(tmp)))
                r.pop("pad_note", None)
            except (Exception, SystemExit) as exc:  # its assert, its argparse: noted, the next row goes on
                r["pad_note"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                ok = False
                if "illegal" in str(exc).lower() or "context" in str(exc).lower():
                    r["pad_fatal"] = True
                    write_json(run.results_path, results)
                    run.log(f"pad peer: CUDA context lost at {r['shape']}: {exc}")
                    break
            write_json(run.results_path, results)
            run.log(f"pad {i + 1}/{len(todo)} {r['shape']:>24} both {_us(r.get('pad_both_s'))}  weights once "
                    f"{_us(r.get('pad_a_s'))}  its cuBLAS TN {_us(r.get('pad_tn_s'))}" + (f"  {r['pad_note']}" if r.get("pad_note") else ""))
    return ok


def _us(s: Optional[float]) -> str:
    return "-" if not s else f"{s * 1e6:.2f} us"


def best_evolved(archive: Path, manifest: dict[str, Any], shapes: list[str]) -> dict[str, dict[str, Any]]:
    """Per shape the best evolved kernel's figures before the export's fallback (module docstring)."""
    from populations import Archive, ArchiveError

    fits: dict[str, tuple[Optional[float], int]] = {}
    try:
        with Archive(archive, "r") as ar:
            present = {str(s) for s in ar.shapes()}
            for shape in shapes:
                ranked = ar.fitness(shape) if shape in present else {}
                fits[shape] = (next(iter(ranked.values()), None), len(ranked))
    except (ArchiveError, OSError):
        pass
    paths = manifest.get("paths", {}) if isinstance(manifest.get("paths"), dict) else {}
    out = {}
    for shape in shapes:
        fit, elites = fits.get(shape, (None, 0))
        rec: dict[str, Any] = {"archive_fitness": fit, "archive_elites": elites}
        verify = (paths.get(shape) or {}).get("verify")
        if isinstance(verify, dict):
            timed = [c for c in verify.get("candidates", []) if c.get("speedup")]
            win = max(timed, key=lambda c: c["speedup"]) if timed else {}
            rec.update(verify_best_x=win.get("speedup"), verify_best_x_tn=win.get("speedup_same_layout"),
                       verify_best_s=win.get("s"), verify_best_candidate=win.get("candidate"),
                       best_evolved_x=win.get("speedup"), best_evolved_src="export re-timing")
        else:
            rec.update(best_evolved_x=fit, best_evolved_src="archive fitness" if fit is not None else "none")
        out[shape] = rec
    return out


def annotate_best(run: Run) -> None:
    """:func:`best_evolved` into every row of ``WORK/results.json`` (no GPU)."""
    results = read_json(run.results_path, None)
    if results is None:
        return
    best = best_evolved(run.archive, read_json(run.lib / "manifest.json", {}), [r["shape"] for r in results["rows"]])
    for r in results["rows"]:
        r.update(best[r["shape"]])
    write_json(run.results_path, results)
