"""evo's best evolved kernels vs torch.matmul, cuBLASLt (heuristic, autotuned) and Triton, per shape.

    python bench/peers_bench.py (--archive DIR | --library DIR) SHAPES --out DIR [options]
    python bench/peers_bench.py --summarize peers.csv --out DIR [--cuda-l2 DIR] [--seed-archive DIR]

SHAPES (at least one; their union, in this order, without repeats):
  --shapes 64x64x64,4096x4096x4096:NN   shapes as ``evo`` writes them (TN and f32 by default)
  --shapes-file FILE                    one shape per line, or a CSV with M,N,K columns
  --from-archive                        every shape with a non-flagged ok kernel (f32 contract)
                                        in the archive, or every shape of the library
  --grid-sample N                       N shapes of CUDA-L2's 1000-shape grid, stratified by FLOPs
                                        (``seed_bench.stratified``; --grid FILE for configs.csv)

In one process on one GPU, per shape: the evolved kernel is called through the exported library
(``evo export``, built from ``--archive`` into ``--work``; ctypes with pre-bound pointers) or, where
that fails, through the evaluator's launch path (the CSV's ``evolved_path`` says which and why);
it is rechecked on fresh random inputs against an fp32 reference and timed only if it passes.
Peers: torch.matmul on both layouts, cuBLASLt's heuristic and autotuned algorithms through
nvmath-python (columns empty, with the reason, when nvmath is not importable), and our Triton
matmul with a small config search. All arms are timed together in the three timers of
docs/design.md section 8 (``device``, ``offline``, ``server``) with the evaluator's own timer code
(``_peers_measure``).

Writes under ``--out`` (at most 7 files): ``peers.csv`` (one row per shape, written as measured),
``summary.md`` and ``summary.json`` (a per-decade table of the headline figures, then mean,
geomean, median, min, share of wins, per FLOP decade, per timer and comparison; with
``--seed-archive DIR`` also the archived seed vs archived evolved speedup per shape and decade,
the gain of evolution), ``speedup_vs_flops.png``, ``speedup_per_decade.png``,
``heatmap_device.png`` and, with CUDA-L2's anchors (``--cuda-l2``, default: the shared anchors
directory when it exists), ``cuda_l2_published.csv``: CUDA-L2's published H100 speedups beside
ours on shared shapes, marked published, not re-measured.

``--max-seconds`` (from the start, export included) stops starting new shapes; the summary covers
what was measured and lists the rest as not run. Shapes run interleaved across FLOP decades, so a
cut run still spans the sizes. Exit 0 when the run finished or was cut by the cap; 1 when the
CUDA context was lost (summary still written); 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from populations import Shape, ShapeError  # noqa: E402

from _peers_evolved import Evolved, SourceError, evolved_shapes  # noqa: E402
from _peers_stats import CSV_FIELDS, decade, read_rows, speedup, with_speedups, write_summary  # noqa: E402

#: Where CUDA-L2's anchors may be: a checkout's shared/ (the device copy has one if the repo does),
#: the workplace's shared directory beside the repository.
ANCHORS = (HERE.parent / "shared" / "anchors" / "cuda-l2", HERE.parent.parent / "shared" / "anchors" / "cuda-l2")


class UsageError(Exception):
    """Bad arguments or inputs: printed as one line, exit 2."""


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="peers_bench.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    src = p.add_argument_group("evolved kernels")
    src.add_argument("--archive", type=Path, help="an evo archive: its best kernels are exported, then benchmarked")
    src.add_argument("--library", type=Path, help="an exported library (evo export --out DIR)")
    sh = p.add_argument_group("shapes")
    sh.add_argument("--shapes", default="", help="comma-separated shapes, e.g. 64x64x64,1024x1024x1024:NN")
    sh.add_argument("--shapes-file", type=Path)
    sh.add_argument("--from-archive", action="store_true", help="all shapes with an evolved kernel")
    sh.add_argument("--grid-sample", type=int, default=0, metavar="N", help="N shapes of the 1000-shape grid")
    sh.add_argument("--grid", type=Path, help="configs.csv of the grid (default: generated, the same 1000 shapes)")
    p.add_argument("--out", type=Path, help="output directory (created)")
    p.add_argument("--work", type=Path, help="where the export is built (default: a new temporary directory)")
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop starting new shapes after this (0: no cap)")
    p.add_argument("--shape-timeout", type=float, default=90.0,
                   help="a watchdog ends the run (summary written, exit 1) when one shape takes longer")
    p.add_argument("--host-calls", type=int, default=20, help="calls per arm in the offline and server timers")
    p.add_argument("--qps", type=float, default=2000.0, help="server timer's mean call rate")
    p.add_argument("--device-budget-s", type=float, default=0.05, help="device timer's replay seconds per arm")
    p.add_argument("--lt-autotune-iterations", type=int, default=5, help="timed calls per cuBLASLt algorithm")
    p.add_argument("--no-lt", action="store_true", help="leave the cuBLASLt columns out")
    p.add_argument("--no-triton", action="store_true", help="leave the Triton column out")
    p.add_argument("--seed", type=int, default=3, help="grid sample and timer order")
    p.add_argument("--seed-archive", type=Path, metavar="DIR",
                   help="an archive of the seeds (e.g. seed_bench --archive): its best archived speedup per shape goes "
                        "beside the evolved one, for the evolved-vs-seed columns of the summary")
    p.add_argument("--cuda-l2", type=Path, help="CUDA-L2 anchors directory (eval_results/...) for the published join")
    p.add_argument("--summarize", type=Path, metavar="CSV", help="only rebuild the summary, plots and join from a peers.csv")
    p.add_argument("--list-shapes", action="store_true", help="print the selected shapes and exit (no GPU)")
    args = p.parse_args(argv)
    if args.max_seconds < 0 or args.grid_sample < 0 or args.host_calls < 1 or args.qps <= 0 or args.shape_timeout <= 0:
        p.error("--max-seconds and --grid-sample must be >= 0, --host-calls >= 1, --qps and --shape-timeout > 0")
    if args.summarize is not None:
        if args.out is None:
            p.error("--out DIR is required with --summarize")
        return args
    if args.archive is not None and args.library is not None:
        p.error("give one of --archive DIR and --library DIR, not both")
    if not (args.shapes or args.shapes_file or args.from_archive or args.grid_sample):
        p.error("no shapes: give --shapes, --shapes-file, --from-archive or --grid-sample N")
    if args.from_archive and args.archive is None and args.library is None:
        p.error("--from-archive needs --archive DIR or --library DIR")
    if not args.list_shapes:
        if args.archive is None and args.library is None:
            p.error("give --archive DIR or --library DIR (the evolved kernels to measure)")
        if args.out is None:
            p.error("--out DIR is required")
    return args


def read_shapes_file(path: Path) -> list[Shape]:
    if not path.is_file():
        raise UsageError(f"shapes file {path} not found")
    text = path.read_text()
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    try:
        if "M" in first.split(",") and "K" in first.split(","):
            with open(path, newline="") as fh:
                return [Shape(int(r["M"]), int(r["N"]), int(r["K"]), (r.get("layout") or "TN").upper())
                        for r in csv.DictReader(fh)]
        return [Shape.parse(line.strip()) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    except (ShapeError, ValueError, KeyError) as exc:
        raise UsageError(f"{path}: {exc}") from None


def select_shapes(args: argparse.Namespace) -> tuple[list[Shape], list[str]]:
    """The union of the shape sources, in order, without repeats; plus notes."""
    notes: list[str] = []
    shapes: list[Shape] = []
    try:
        shapes += [Shape.parse(s.strip()) for s in args.shapes.split(",") if s.strip()]
    except ShapeError as exc:
        raise UsageError(f"--shapes: {exc}") from None
    if args.shapes_file:
        shapes += read_shapes_file(args.shapes_file)
    if args.from_archive:
        got, notes = evolved_shapes(args.archive, args.library)
        if not got:
            notes.append("the archive/library has no shape with an evolved kernel")
        shapes += got
    if args.grid_sample:
        import seed_bench  # noqa: PLC0415 (bench/ is on the path; no GPU work at import)

        if args.grid is not None and not args.grid.is_file():
            raise UsageError(f"grid file {args.grid} not found")
        shapes += seed_bench.stratified(seed_bench.read_grid(args.grid), args.grid_sample, args.seed)
    seen: set[Shape] = set()
    out = [s for s in shapes if not (s in seen or seen.add(s))]
    f16 = [s for s in out if s.contract != "f32"]
    if f16:
        notes.append(f"left out {len(f16)} shape(s) of another contract than f32 (not torch.matmul's)")
    return [s for s in out if s.contract == "f32"], notes


def interleave(shapes: list[Shape], seed: int) -> list[Shape]:
    """Round-robin over FLOP decades (shuffled within each), so a cut run still spans the sizes."""
    by: dict[str, list[Shape]] = defaultdict(list)
    for s in shapes:
        by[decade(s.flops)].append(s)
    rng = random.Random(seed)
    queues = [rng.sample(v, len(v)) for _, v in sorted(by.items(), key=lambda kv: int(kv[0][2:]))]
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def find_anchors(arg: Optional[Path]) -> Optional[Path]:
    if arg is not None:
        if not (arg / "eval_results").is_dir():
            raise UsageError(f"--cuda-l2 {arg}: no eval_results directory there")
        return arg
    return next((p for p in ANCHORS if (p / "eval_results").is_dir()), None)


def seed_speedups(path: Optional[Path]) -> dict[Shape, float]:
    """Best archived (device) speedup per shape of a seed archive; {} without one."""
    if path is None:
        return {}
    from populations import Archive, ArchiveError

    try:
        arch = Archive(path, "r")
    except (ArchiveError, OSError) as exc:
        raise UsageError(f"--seed-archive {path}: cannot open the archive ({exc})") from None
    out = {}
    for s in arch.shapes():
        elites = arch.elites(s, top=1)
        if elites and elites[0].fitness is not None:
            out[s] = float(elites[0].fitness)
    return out


def prepare_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)


def summarize_only(args: argparse.Namespace) -> int:
    if not args.summarize.is_file():
        raise UsageError(f"--summarize {args.summarize}: no such file")
    try:
        rows = read_rows(args.summarize)
    except (ValueError, OSError, csv.Error) as exc:
        raise UsageError(str(exc)) from None
    anchors = find_anchors(args.cuda_l2)
    meta = {"source": str(args.summarize)}
    if args.seed_archive is not None:
        seeds = {str(s): v for s, v in seed_speedups(args.seed_archive).items()}
        for r in rows:
            if r["shape"] in seeds:
                r["seed_archived_device_speedup"] = round(seeds[r["shape"]], 4)
        meta["seeds"] = f"archive {args.seed_archive} ({len(seeds)} shapes)"
    prepare_out(args.out)
    write_summary(args.out, rows, meta, anchors)
    print((args.out / "summary.md").read_text())
    return 0


class Watchdog:
    """A thread that ends a stuck run cleanly: when one shape runs longer than
    ``--shape-timeout`` or the run passes ``--max-seconds`` by more than that, it writes the
    summary of the shapes measured so far and exits the process with status 1 (a kernel that
    never finishes cannot be interrupted from Python)."""

    def __init__(self, args: argparse.Namespace, rows: list[dict[str, Any]], meta: dict[str, Any],
                 anchors: Optional[Path], current: dict[str, Any], t0: float, order: list[Shape]) -> None:
        self.args, self.rows, self.meta, self.anchors, self.current, self.t0 = args, rows, meta, anchors, current, t0
        self.order = order
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peers-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        limit = self.args.shape_timeout
        cap = (self.args.max_seconds or float("inf")) + limit
        while not self._stop.wait(1.0):
            shape, since = self.current.get("shape"), self.current.get("since")
            now = time.monotonic()
            why = None
            if shape is not None and since is not None and now - since > limit:
                why = f"{shape} ran longer than --shape-timeout {limit:.0f} s (a kernel that never finishes?)"
            elif now - self.t0 > cap:
                why = f"the run passed --max-seconds by more than {limit:.0f} s"
            if why is None:
                continue
            with self.lock:
                rows = list(self.rows)
            done = {r["shape"] for r in rows}
            self.meta.update({"wall": f"{now - self.t0:.0f} s", "fatal": f"stopped by the watchdog: {why}",
                              "not run": ", ".join(str(s) for s in self.order if str(s) not in done) or "none"})
            print(f"peers_bench: {why}; writing the summary of {len(rows)} shape(s) and exiting", file=sys.stderr,
                  flush=True)
            try:
                write_summary(self.args.out, rows, self.meta, self.anchors)
            finally:
                os._exit(1)


def _fmt(x: Optional[float]) -> str:
    return "   –  " if x is None else f"{x:6.3f}"


def run(args: argparse.Namespace, shapes: list[Shape], notes: list[str]) -> int:
    t0 = time.monotonic()
    cap = args.max_seconds or float("inf")
    anchors = find_anchors(args.cuda_l2)
    seeds = seed_speedups(args.seed_archive)
    prepare_out(args.out)
    work = args.work or Path(tempfile.mkdtemp(prefix="evo_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)  # noqa: E731
    from evaluators import gpu_arch

    arch = gpu_arch() or "sm_90a"
    evolved = Evolved(args.archive, args.library, work, arch, log)
    try:
        evolved.prepare(shapes)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    import torch

    if not torch.cuda.is_available():
        print("peers_bench: no CUDA device visible to torch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.zeros(1, device="cuda")  # make torch's primary context current before any other CUDA user
    evolved.load()
    from evaluators._provenance import static_provenance
    from _peers_measure import Fatal, Options, measure

    prov = static_provenance()
    opts = Options(host_calls=args.host_calls, qps=args.qps, device_budget_s=args.device_budget_s)
    if not args.no_lt:
        from _peers_cublaslt import LtPeer

        opts.lt = LtPeer(args.lt_autotune_iterations)
        if not opts.lt.available:
            log(opts.lt.reason)
    if not args.no_triton:
        try:
            import _peers_triton

            opts.triton = _peers_triton
        except Exception as exc:
            notes.append(f"Triton column missing: {type(exc).__name__}: {exc}")
            log(notes[-1])
    order = interleave(shapes, args.seed)
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    not_run: list[str] = []
    fatal = ""
    l2 = int(prov.get("l2_bytes") or 60 << 20)
    log(f"{len(order)} shapes on {prov.get('gpu')} ({arch}); cap {args.max_seconds or 'none'} s")
    print(f"{'':>6} {'shape':>24} {'path':>9} {'check':>6} | device x vs torch  lt-h   lt-a  triton | offline vs torch",
          flush=True)
    meta = {"gpu": f"{prov.get('gpu')} ({arch}), driver {prov.get('driver', '?')}, torch {prov.get('torch')}, "
                   f"CUDA {prov.get('cuda_runtime')}",
            "evo": prov.get("evo"),
            "source": f"archive {args.archive}" if args.archive else f"library {args.library}",
            **({"seeds": f"archive {args.seed_archive} ({len(seeds)} shapes)"} if args.seed_archive else {}),
            "export": evolved.export_note or (f"library {evolved.library_path}" if evolved.library_path else "none"),
            "cuBLASLt": (opts.lt.reason or "nvmath-python") if opts.lt is not None else "left out (--no-lt)",
            "Triton": "ours, 8-config search" if opts.triton is not None else "missing"}
    if notes:
        meta["notes"] = "; ".join(notes)
    current: dict[str, Any] = {}
    watchdog = Watchdog(args, rows, meta, anchors, current, t0, order)
    with open(args.out / "peers.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_FIELDS), extrasaction="ignore")
        writer.writeheader()
        for i, shape in enumerate(order):
            if fatal or time.monotonic() - t0 > cap:
                not_run.append(str(shape))
                continue
            current.update(shape=shape, since=time.monotonic())
            kernel, why = evolved.kernel(shape)
            try:
                row = measure(shape, kernel, why, opts, rng, l2)
            except Fatal as exc:
                fatal = f"CUDA context lost at {shape}: {exc}"
                log(fatal)
                not_run.append(str(shape))
                continue
            finally:
                current.clear()
            if shape in seeds:
                row["seed_archived_device_speedup"] = round(seeds[shape], 4)
            row = with_speedups(row)
            with watchdog.lock:
                rows.append(row)
            writer.writerow(row)
            fh.flush()
            sp = [speedup(row, "device", "evolved", r) for r in ("torch", "lt_heuristic", "lt_autotuned", "triton")]
            print(f"{i + 1:>3}/{len(order):<3} {str(shape):>24} {row['evolved_path'].split(':')[0]:>9} "
                  f"{(row.get('evolved_check') or '-').split(':')[0]:>6} | {' '.join(_fmt(x) for x in sp)} | "
                  f"{_fmt(speedup(row, 'offline', 'evolved', 'torch'))}  [{time.monotonic() - t0:.0f}s]"
                  + (f"  {row['notes'][:100]}" if row.get("notes") else ""), flush=True)
    watchdog.stop()
    meta.update({"wall": f"{time.monotonic() - t0:.0f} s",
                 "not run": (f"{len(not_run)} shape(s) ({'CUDA context lost' if fatal else 'the --max-seconds cap'}): "
                             + ", ".join(not_run)) if not_run else "none"})
    if fatal:
        meta["fatal"] = fatal
    write_summary(args.out, rows, meta, anchors)
    print((args.out / "summary.md").read_text(), flush=True)
    return 1 if fatal else 0


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.summarize is not None:
            return summarize_only(args)
        shapes, notes = select_shapes(args)
        if args.list_shapes:
            for s in shapes:
                print(s)
            for n in notes:
                print(f"# {n}", file=sys.stderr)
            return 0
        if not shapes:
            raise UsageError("no shapes selected" + (f" ({'; '.join(notes)})" if notes else ""))
        return run(args, shapes, notes)
    except (UsageError, SourceError) as exc:
        print(f"peers_bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
