"""The time stage the evolve-export-time benchmarks share (``_bench_stages``): per row, in one
process, cuBLAS in both layouts (``a @ w.t()``, ``a @ wt``), the exported library's ``evo_hgemm``
(checked against an fp32 reference first, and which path it took) and on decode rows the plain
peer, with the timer of ``_llm_timer`` (CUDA-graph replay over rotating operand sets > 2x L2,
interleaved rounds, medians). Rows are saved to ``WORK/results.json`` after each, so a cut call
resumes; a lost CUDA context ends the stage and its row is skipped the next time.
"""
from __future__ import annotations

import faulthandler
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import _llm_sample as smp
from _bench_stages import Run, first_file, read_json, shared_files, write_json
from _llm_report import derive
from _peer_screen import Screened, import_peer, screen  # import_peer re-exported: the peers' importer lives below both

__all__ = ["manifest_claim", "library_path", "import_peer", "stage_time", "time_shapes", "time_one", "rounds_for"]


def manifest_claim(manifest: dict[str, Any], shape: str) -> tuple[Optional[str], str]:
    """What the export's manifest says of ``shape``: (path, reason), from whichever list names it
    (the exporter decides the fields; ``path``/``dispatch``/``route``/``backend`` and
    ``reason``/``why`` are looked for)."""
    for key, items in manifest.items():
        if not isinstance(items, list):
            continue
        for e in items:
            if isinstance(e, dict) and e.get("shape") == shape:
                path = next((str(e[k]) for k in ("path", "dispatch", "route", "backend") if e.get(k)), None)
                why = next((str(e[k]) for k in ("reason", "why") if e.get(k)), "")
                if path is None and key != "kernels":
                    path = f"not exported ({key})"
                return path, why
    return None, "not in the manifest"


def as_dict(record: Any) -> dict[str, Any]:
    """A manifest or kernel entry as its JSON form: the loader hands frozen records
    (``evo.runtime.ExportManifest``, ``KernelEntry``) with ``to_dict``; a plain dict passes through."""
    if record is None:
        return {}
    return record.to_dict() if hasattr(record, "to_dict") else dict(record)


def library_path(lib: Any, row: Any, a: Any, w: Any) -> tuple[str, str]:
    """("evolved" or "cuBLAS", why) for what ``lib.evo_hgemm(a, w.t())`` runs at ``row``."""
    if lib is None:
        return "cuBLAS", "no exported library"
    if not getattr(lib, "active", True):
        return "cuBLAS", f"library not loaded: {getattr(lib, 'reason', '?')}"
    claim, why = manifest_claim(as_dict(getattr(lib, "manifest", None)), row.shape)
    try:
        routed = lib.route(a, w.t()) if hasattr(lib, "route") else True
    except Exception as exc:
        return "unknown", f"route: {type(exc).__name__}: {exc}"
    if routed is None:
        return "cuBLAS", why or (claim or "not exported")
    if claim and "cublas" in claim.lower():
        return "cuBLAS", why or claim
    entry = as_dict((getattr(lib, "kernels", {}) or {}).get((row.m, row.n, row.k, "TN")))
    return "evolved", f"{entry.get('template') or 'free-form'} {str(entry.get('candidate', ''))[:12]}".strip()


def stage_time(run: Run, meta: Optional[dict[str, Any]] = None, peer_ms: Optional[list[int]] = None,
               reserve_s: float = 0.0) -> bool:
    """Time every row (:func:`time_one`, interleaved over the M classes) into ``WORK/results.json``:
    cuBLAS both layouts, the exported library, the plain peer on decode rows. ``meta`` is added
    to the results' ``meta``; ``peer_ms``: the M values to build the peer for (default: the decode
    rows' own; one fixed list lets a later call reuse cupy's compile cache); ``reserve_s``: seconds
    before the run's cap at which this stage starts no new row, left for a pass that follows it
    (the random-shape benchmark's pad peer). False without a GPU or when a shape failed."""
    args = run.args
    import torch

    if not torch.cuda.is_available():
        run.log("time: no CUDA device")
        return False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.zeros(1, device="cuda")
    from _llm_timer import REL_TOL, PeerRunner, Sets, rel_error, time_arms

    results = read_json(run.results_path, {"meta": {}, "rows": []})
    have = {r["shape"]: r for r in results.get("rows", [])}
    lib = None
    if (run.lib / "manifest.json").is_file():
        from evo.export._export import load_library

        try:
            lib = load_library(run.lib)
            run.log(f"library {run.lib}: {len(lib.kernels)} kernels" + ("" if lib.active else f", not active: {lib.reason}"))
        except Exception as exc:
            run.log(f"library {run.lib} not usable: {type(exc).__name__}: {exc}")
    decode_ms = sorted({r.m for r in run.sample if r.m <= 16 and r.k % 8 == 0})
    decode_ms = peer_ms if peer_ms is not None and decode_ms else decode_ms
    peer, peer_note = None, ""
    try:
        t = time.monotonic()
        peer_path = first_file(args.peer, shared_files("peers/plain_gemv.py"), "peer")
        peer = PeerRunner(import_peer(peer_path), decode_ms) if decode_ms else None
        run.log(f"peer built for M in {decode_ms} in {time.monotonic() - t:.1f} s")
    except Exception as exc:  # no cupy, no file: the peer columns stay empty, with the reason
        peer_note = f"peer unavailable: {type(exc).__name__}: {str(exc)[:160]}"
        run.log(peer_note)
    l2 = int(torch.cuda.get_device_properties(0).L2_cache_size)
    from evo.search._calibration import load_calibration

    cal = load_calibration(run.archive)
    results["meta"] = {"gpu": f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
                       "command": " ".join(sys.argv), "evolve": json.dumps(run.state.get("evolve", {})),
                       "export": json.dumps(run.state.get("export", {})),
                       "calibration": f"{cal.source}: {cal.peak_flops / 1e12:.0f} TFLOP/s, read {cal.read_bw / 1e12:.2f} TB/s, "
                                      f"copy {cal.copy_bw / 1e12:.2f} TB/s, launch {cal.launch_floor_s * 1e6:.2f} us",
                       "timer": f"bench/_llm_timer.py, {args.reps} rounds ({args.reps * LONG_ROUNDS_FACTOR} from {LONG_FLOP:.0e} FLOP), "
                                f"rotation > 2x L2 ({l2 >> 20} MB)",
                       **({"peer": peer_note} if peer_note else {}), **(meta or {})}
    rng = random.Random(args.seed)
    again = getattr(args, "retime_class", None)

    def retime(row: Any) -> bool:  # --retime: every row; --retime-class C: the rows of class C
        return bool(args.retime or (again and again in getattr(row, "classes", ())))

    def save() -> None:
        results["rows"] = [have[r.shape] for r in run.sample if r.shape in have]
        write_json(run.results_path, results)

    screened = Screened(frozenset(), frozenset())
    if peer is not None:  # the peer's configurations that never return, found in a child (bench/_peer_screen.py)
        jobs = [(r.m, r.n, r.k, name) for r in run.sample if r.m <= 16 and r.k % 8 == 0
                and (retime(r) or not have.get(r.shape, {}).get("cublas_tn_s")) for name in peer.names(r.m)]
        t = time.monotonic()
        if jobs:
            screened = screen(peer_path, jobs, log=run.log, deadline_s=SCREEN_DEADLINE_S)
        run.log(f"peer screen: {len(jobs)} launches, {len(screened.hung)} hanging, {len(screened.unscreened)} not "
                f"screened by the deadline, {time.monotonic() - t:.1f} s")
        results["meta"]["peer_hangs"] = sorted(f"{m}x{n}x{k} {name}" for m, n, k, name in screened.hung)
        results["meta"]["peer_unscreened"] = sorted(f"{m}x{n}x{k} {name}" for m, n, k, name in screened.unscreened)

    def one(row: Any) -> dict[str, Any]:
        def of_row(jobs: frozenset) -> frozenset:
            return frozenset(name for m, n, k, name in jobs if (m, n, k) == (row.m, row.n, row.k))
        return time_one(row, lib, peer, l2, args.reps, rng, Sets, rel_error, time_arms, REL_TOL,
                        peer_skip=of_row(screened.hung), peer_unscreened=of_row(screened.unscreened))

    cap = run.cap()
    ok = time_shapes(smp.interleave(run.sample, args.seed), have, one, save, run.log,
                     cap=None if cap is None else cap - reserve_s, retime=retime)
    save()
    return ok


#: seconds one row may take before the process is ended (its row stays marked fatal)
ROW_TIMEOUT_S = int(os.environ.get("EVO_BENCH_ROW_TIMEOUT_S", "90"))
#: seconds the plain peer's hang screen may take; configurations left then are not timed
SCREEN_DEADLINE_S = float(os.environ.get("EVO_BENCH_SCREEN_S", "150"))


def time_shapes(order: list[Any], have: dict[str, dict[str, Any]], one: Callable[[Any], dict[str, Any]],
                save: Callable[[], None], log: Callable[[str], None], *, cap: Optional[float] = None,
                retime: Any = False, clock: Callable[[], float] = time.monotonic) -> bool:
    """Time ``order`` into ``have`` (shape -> row), saving after each: rows timed already are
    skipped (unless ``retime``: True, or a predicate on the row), failed ones are tried again, a
    lost CUDA context ends the loop and marks its shape ``fatal`` (skipped next time); no new
    shape starts after ``cap``. False when a shape failed."""
    ok = True
    for i, row in enumerate(order):
        done = have.get(row.shape, {})
        again = retime(row) if callable(retime) else retime
        if not again and (done.get("cublas_tn_s") or done.get("fatal")):
            continue
        if cap is not None and clock() > cap:
            log(f"time: cap reached; {len(order) - i} shape(s) not timed")
            break
        # A row that hangs (a peer kernel that never returns) must not take the call's remaining
        # rows with it: marked fatal before it starts, so a killed process skips it next time,
        # and past ROW_TIMEOUT_S faulthandler prints where it hung and ends the process.
        have[row.shape] = {**row.to_dict(), "fatal": True, "notes": f"did not finish within {ROW_TIMEOUT_S} s"}
        save()
        faulthandler.dump_traceback_later(ROW_TIMEOUT_S, exit=True)
        try:
            rec = one(row)
        except Exception as exc:  # one shape's failure is recorded; a dead context ends the stage
            rec = {**row.to_dict(), "notes": f"{type(exc).__name__}: {str(exc)[:200]}"}
            ok = False
            if "illegal" in str(exc).lower() or "context" in str(exc).lower():
                have[row.shape] = {**rec, "fatal": True}
                save()
                log(f"time: CUDA context lost at {row.shape}: {exc}")
                break
        finally:
            faulthandler.cancel_dump_traceback_later()
        have[row.shape] = rec
        save()
        d = derive(rec) if rec.get("cublas_tn_s") else rec
        log(f"{i + 1:>3}/{len(order)} {row.shape:>24} cuBLAS {_us(d.get('cublas_s'))} ({d.get('cublas_layout')}, "
            f"roof {_r(d.get('cublas_roof'))})  evo {_us(d.get('evo_s'))} {_r(d.get('evo_x'))}x {rec.get('evo_path')}"
            f"  peer {_us(d.get('peer_s'))} {_r(d.get('peer_x'))}x" + (f"  {rec['notes']}" if rec.get("notes") else ""))
    return ok


def _us(x: Optional[float]) -> str:
    return "-" if not x else f"{x * 1e6:8.2f} us"


#: Rows of at least this many FLOP (calls of about 0.7 ms and more on an H100) get
#: :data:`LONG_ROUNDS_FACTOR` times the timed rounds: few rounds cost little there, and over a run
#: of such calls the clock drifts (seeds 11 and 14 timed the library's cuBLAS fallback, the same
#: call as the cuBLAS TN arm, 2.1% and 2.7% apart at 16367x3520x5080 and 13679x13688x10656 with 7).
LONG_FLOP = 5e11
LONG_ROUNDS_FACTOR = 3


def rounds_for(m: int, n: int, k: int, reps: int) -> int:
    """The timed rounds of one row: ``reps``, times :data:`LONG_ROUNDS_FACTOR` from :data:`LONG_FLOP`."""
    return reps * LONG_ROUNDS_FACTOR if 2.0 * m * n * k >= LONG_FLOP else reps


def _r(x: Optional[float]) -> str:
    return "-" if not x else f"{x:.2f}"


def time_one(row: Any, lib: Any, peer: Any, l2: int, reps: int, rng: random.Random, Sets: Any, rel_error: Any,
             time_arms: Any, tol: float, peer_skip: frozenset = frozenset(),
             peer_unscreened: frozenset = frozenset()) -> dict[str, Any]:
    """One row on the GPU: cuBLAS TN and NN, the library's ``evo_hgemm`` (checked first), the peer."""
    import torch

    sets = Sets(row.m, row.n, row.k, l2, seed=rng.randrange(1 << 30))
    ref = sets.reference()
    rec: dict[str, Any] = {**row.to_dict(), "sets": sets.n_sets, "rotation_mb": round(sets.bytes / 1e6, 1)}
    notes = []
    arms = {"cublas_tn": lambda i: torch.matmul(sets.a[i], sets.w[i].t(), out=sets.c[i]),
            "cublas_nn": lambda i: torch.matmul(sets.a[i], sets.wt[i], out=sets.c[i])}
    path, why = library_path(lib, row, sets.a[0], sets.w[0])
    rec.update(evo_path=path, evo_why=why)
    call = lib.evo_hgemm if lib is not None else (lambda a, b: torch.matmul(a, b))
    err = rel_error(call(sets.a[0], sets.w[0].t()), ref)
    rec["evo_rel_err"] = err
    if err < tol:
        arms["evo"] = lambda i: call(sets.a[i], sets.w[i].t())
    else:
        notes.append(f"evo output wrong (relative error {err:.2e}): not timed")
    entry = as_dict((getattr(lib, "kernels", {}) or {}).get((row.m, row.n, row.k, "TN"))) if path == "evolved" else {}
    if entry.get("prepared_b"):  # the weights padded once, as a model holds them (the pad peer's "A" path)
        prepared = [lib.prepare_weight(w) for w in sets.w]
        err_w = rel_error(lib.evo_hgemm(sets.a[0], prepared[0]), ref)
        rec["evo_wonce_rel_err"] = err_w
        if err_w < tol:
            arms["evo_wonce"] = lambda i: lib.evo_hgemm(sets.a[i], prepared[i])
        else:
            notes.append(f"evo with prepared weights wrong (relative error {err_w:.2e}): not timed")
    if peer is not None and row.m <= 16:
        if row.k % 8:
            rec["peer_note"] = "the peer needs K % 8 == 0"
        else:
            launch, cfg, screened = peer.best(sets, ref, row.m, rng, skip=peer_skip | peer_unscreened)
            if peer_skip:
                rec["peer_hangs"] = sorted(peer_skip)
            if peer_unscreened:  # left by the screen's deadline: not known to hang, not timed either
                rec["peer_unscreened"] = sorted(peer_unscreened)
            rec.update(peer_cfg=cfg, peer_configs=len(screened))
            if launch is not None:
                arms["peer"] = launch
            else:
                rec["peer_note"] = "no peer configuration passed the check"
    rounds = rounds_for(row.m, row.n, row.k, reps)
    if rounds != reps:
        rec["rounds"] = rounds
    times = time_arms(arms, sets.n_sets, rounds=rounds, rng=rng)
    for name, t in times.items():
        rec[f"{name}_s"] = t
    rec["notes"] = "; ".join(notes)
    del sets, ref
    torch.cuda.empty_cache()
    return rec
