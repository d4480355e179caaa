"""Issue 26's benchmark (GPU machine, one command): evolve a sample of llm_layers.csv, export it,
re-time the exported library beside cuBLAS and the plain peer.

    python3 bench/llm_layers_bench.py [--csv CSV] [--work DIR] [--out DIR] [--stages evolve,export,time]
                                      [--budget 20m] [--peer PATH] [options]
    python3 bench/llm_layers_bench.py --list                          # the sample and its classes (no GPU)
    python3 bench/llm_layers_bench.py --summarize results.json --out DIR   # tables and plot again (no GPU)

Sample (``_llm_sample``): at least ``--total`` shapes (48) with at least ``--per-class`` (8) in each
class of issue 26 (decode M <= 16, M 17-128, M 129-1024, M >= 2048, under 1e8 FLOP, misaligned);
a shape counts in every class it is in; the M=8 rows also at M=16, and the misaligned rows at
more token counts where the CSV has too few (marked in ``origin``).

Stages (each can be run alone; state in ``WORK/state.json``, so a cut call resumes; the machinery is
``_bench_stages`` and ``_bench_time``, shared with ``random_shapes_bench.py``):

- ``evolve``: ``evo run`` over the sample through the engine (the ``python -m evo run`` command in
  a child process, so a hang cannot take the benchmark with it), in two waves: ``--anchors``
  shapes spread over the classes first with ``--anchor-share`` of ``--budget``, then every shape
  with the rest, the new ones seeded by transfer from the anchors' elites (plus
  ``--wave2-seeds`` heuristic picks per template). The engine spends its slots by headroom
  against the roofline (issue 26). A wave already done is skipped; an interrupted one is run
  again with its whole budget.
- ``export``: ``python -m evo export`` of the archive to ``WORK/lib`` (the library decides per
  shape whether its kernel or cuBLAS runs; on the GPU machine ``--verify auto`` first re-times the
  top candidates beside cuBLAS with the same timer as the ``time`` stage).
- ``time``: this script's own timer (``_llm_timer``: CUDA-graph replay over rotating operand sets
  > 2x L2, medians, all contenders interleaved in one process): cuBLAS in both layouts
  (``a @ w.t()`` and ``a @ wt``, the better taken), the exported library's ``evo_hgemm`` (and which
  path it took), and on decode rows the plain peer imported from ``--peer`` at run time. Shapes
  timed already in ``WORK/results.json`` are not timed again (``--retime`` does); one that failed
  is tried again; one that lost the CUDA context ends the stage and is skipped the next time (so
  the call after it goes on with the rest). ``--time-max-seconds`` (from the start of this
  invocation) stops starting new shapes.

Writes under ``--out`` (default $OUT, else WORK/out): ``results.json``, ``summary.md`` (per shape:
GPU time, speedup and roofline fraction of cuBLAS, peer and evo, the library's path; per class;
the issue's targets met or missed by how much), ``summary.json``, ``speedup_vs_roofline.png``,
and with ``--pack FILE`` a tarball of the work folder's archive, library and state (``--restore FILE``
puts it back before the stages run, for a second device call). Exit 0; 1 when a stage failed; 2 for
bad arguments.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import _llm_sample as smp  # noqa: E402
from _bench_stages import (OneLineParser, Run, UsageError, add_stage_args, check_stage_args, evolve,  # noqa: E402,F401
                           first_file, pack, restore, run_child, run_main, shared_files, stage_export, summarize)
from _bench_time import library_path, manifest_claim, stage_time, time_shapes  # noqa: E402,F401
from _llm_report import write_report  # noqa: E402

CSV_DEFAULTS = shared_files("shapes/llm_layers.csv")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = OneLineParser(prog="llm_layers_bench.py", description=__doc__.splitlines()[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--csv", type=Path, help="shapes CSV (default ../shared/shapes/llm_layers.csv, or the carried copy)")
    add_stage_args(p, work="/tmp/evo_llm_layers", budget_s=1200.0, operators="knob", anchors=12)
    p.add_argument("--total", type=int, default=48, help="shapes in the sample (at least)")
    p.add_argument("--per-class", type=int, default=8, help="shapes per class (at least, where the CSV allows)")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--list", action="store_true", help="print the sample, its classes and waves; no GPU")
    args = p.parse_args(argv)
    check_stage_args(p, args)
    if args.total < 1 or args.per_class < 0:
        p.error("--total >= 1, --per-class >= 0")
    return args


def choose_sample(args: argparse.Namespace) -> list[smp.Row]:
    rows = smp.read_rows(first_file(args.csv, CSV_DEFAULTS, "shapes CSV"))
    return smp.sample(smp.candidate_pool(rows, args.per_class), args.total, args.per_class, args.seed)


def print_sample(sample: list[smp.Row], anchors: int, seed: int) -> None:
    first, _ = smp.waves(sample, anchors, seed)
    ids = {r.key for r in first}
    for r in sample:
        print(f"{r.shape:>24} {r.model:>14} {r.layer:>8} {r.weight_bytes / 1e6:8.1f} MB  {' '.join(r.classes):<28}"
              f"{'wave 1' if r.key in ids else 'wave 2'}  {r.origin}")
    counts = smp.class_counts(sample)
    print(f"{len(sample)} shapes; per class (a shape counts in each of its classes): "
          + ", ".join(f"{smp.LABELS[c]} {n}" for c, n in counts.items()))


def stage_evolve(run: Run) -> bool:
    return evolve(run, run_child)  # this module's run_child, looked up now (tests put a stand-in there)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.summarize is not None:
            return summarize(args.summarize, args.out, write_report)
        sample = choose_sample(args)
        if args.list:
            print_sample(sample, args.anchors, args.seed)
            return 0
        return run_main(args, sample, smp.Row.from_dict,
                        {"evolve": stage_evolve, "export": stage_export, "time": stage_time}, write_report)
    except UsageError as exc:
        print(f"llm_layers_bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
