"""Issue 34's random-shape benchmark (GPU machine): shapes drawn from a seed, evolved, exported, and
re-timed beside cuBLAS in both layouts, the plain peer on decode rows and the pad peer on misaligned
rows, in one process.

    python3 bench/random_shapes_bench.py --seed N [--count 100] [--work DIR] [--out DIR]
                                         [--stages evolve,export,time] [--budget 10m] [options]
    python3 bench/random_shapes_bench.py --seed N --list                # the shapes and their classes (no GPU)
    python3 bench/random_shapes_bench.py --summarize results.json --out DIR   # tables and plot again (no GPU)

Shapes (``_rand_shapes``): ``--count`` (100) draws, M log-uniform in 1-16384, N and K log-uniform in
64-32768 (integers; 40% of rows ragged, the others rounded to a multiple of 8, 16, 64 or 128), TN
(``nn.Linear``) for every row; then rows drawn conditioned on a class until the quotas hold: >= 15
with M <= 16, >= 25 with M 64-2047, >= 10 of >= 1e11 FLOP, >= 30% with N or K % 8 != 0. A draw
over 4e12 FLOP or 1 GiB of fp16 operands (A + W + C) is redrawn, so that one benchmark fits its
time budget (the largest shape is about 5.5 ms of cuBLAS). No table of shapes anywhere: the seed
is the set. ``--seed`` is required: each new measurement takes a seed not used before (the seeds
``bench/RESULTS.md`` records are printed, and a reused one is said so); the seed is in every
output (log lines, summary.md, summary.json, the plot's title).

Stages (``_bench_stages``, ``_bench_time``, shared with ``llm_layers_bench.py``; state in ``WORK/state.json``, so a
cut call resumes):

- ``evolve``: ``python -m evo run`` in a child process over every shape within ``--budget`` in
  total (default 10m, the issue's limit), in two waves (``--anchors`` shapes spread over the
  classes first with ``--anchor-share`` of the budget, then all, seeded by transfer from the
  anchors' elites). ``--operators`` defaults to ``knob:3,optuna:1`` where optuna imports, else
  ``knob``. A wave already done is skipped; an interrupted one is run again with its budget.
- ``export``: ``python -m evo export`` of the archive to ``WORK/lib`` (``--verify auto``: on the
  GPU machine the top candidates of each shape are re-timed beside cuBLAS before the decision).
- ``time``: this script's timer (``_llm_timer``: CUDA-graph replay over rotating operand sets > 2x
  L2, medians, contenders interleaved): cuBLAS TN (``a @ w.t()``) and NN (``a @ wt``), the
  library's ``evo_hgemm`` and the path it took, the plain peer on decode rows (``--peer``); then
  the pad peer on the misaligned rows (``--pad-peer``, its own ``main()`` per row, in this process:
  ``_rand_time``); then per row the best evolved kernel before the export's fallback (the
  manifest's re-timing records, else the archive's elite fitness). Rows timed already are
  skipped (``--retime`` times them again); ``--time-max-seconds`` (from this invocation's start)
  stops starting new ones. Peers are imported from ``../shared/peers/`` or a carried
  ``.carry_shared/peers/`` in the checkout (never copied into the repository).

Writes under ``--out`` (default $OUT, else WORK/out): ``results.json``, ``summary.md`` (per shape,
per class, the issue's targets met or missed by how much: ``_rand_report``), ``summary.json``,
``speedup_vs_roofline.png``; with ``--pack FILE`` a tarball of the work folder (``--restore FILE``
puts it back before the stages, for a second device call). Exit 0; 1 when a stage failed; 2 for
bad arguments (one line).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import _bench_stages as stg  # noqa: E402
import _bench_time as btime  # noqa: E402
import _llm_sample as smp  # noqa: E402
import _rand_shapes as gen  # noqa: E402
import _rand_time as rtime  # noqa: E402
from _bench_stages import run_child  # noqa: E402
from _rand_report import write_report  # noqa: E402

PROG = "random_shapes_bench.py"


def default_operators() -> str:
    """``knob:3,optuna:1`` where optuna imports (the issue's mix), else ``knob``."""
    return "knob:3,optuna:1" if importlib.util.find_spec("optuna") is not None else "knob"


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = stg.OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(__doc__.splitlines()[4:]))
    p.add_argument("--seed", type=int, help="the draw's seed (required; a seed not used before: see bench/RESULTS.md)")
    p.add_argument("--count", type=int, default=100, help="rows drawn before the quotas' conditional draws (default 100, the issue's least)")
    # two picks a template in the second wave: with one, the families that trail at a shape (the
    # portable mma.sync ones on sm_90a) take the own-pick slot after sm90_wgmma's first, and a mid row
    # given four evaluations (seed 20) measured sm80_mma or streamk90 at 0.33-0.67x instead of
    # sm90_wgmma's second pick (_seeding.seed_population's rank order)
    stg.add_stage_args(p, work="/tmp/evo_random_shapes", budget_s=600.0, operators="auto", anchors=12, wave2_seeds=2)
    p.add_argument("--pad-peer", type=Path, help="the pad peer (default ../shared/peers/pad_cublas.py, or the carried copy)")
    p.add_argument("--list", action="store_true", help="print the shapes, their classes and waves; no GPU")
    args = p.parse_args(argv)
    stg.check_stage_args(p, args)
    if args.summarize is None:
        if args.seed is None:
            p.error("--seed is required (no default: a new measurement takes a seed not in bench/RESULTS.md)")
        if args.seed < 0 or args.count < 1:
            p.error("--seed >= 0, --count >= 1")
    if args.operators == "auto":
        args.operators = default_operators()
    return args


def seed_line(seed: int) -> str:
    """The seed, the seeds RESULTS.md records, and whether this one is among them."""
    used = gen.used_seeds()
    return (f"seed {seed}" + (" (USED BEFORE: bench/RESULTS.md records it; a new measurement takes a new seed)"
                              if seed in used else "") + f"; seeds recorded in bench/RESULTS.md: {used or 'none'}")


def print_shapes(rows: list[gen.RandRow], anchors: int, seed: int) -> None:
    first, _ = smp.waves(rows, anchors, seed)
    ids = {r.key for r in first}
    print(f"# random shapes, {seed_line(seed)}")
    for r in rows:
        print(f"{r.shape:>24} {r.flops / 1e9:10.3f} GFLOP {2 * (r.m * r.k + r.n * r.k + r.m * r.n) / 1e6:8.1f} MB  "
              f"{' '.join(r.classes):<30}{'wave 1' if r.key in ids else 'wave 2'}  {r.origin}")
    quotas = gen.quota_counts(rows)
    print(f"seed {seed}: {len(rows)} shapes; quotas (rows, at least): "
          + ", ".join(f"{gen.QUOTA_LABELS[q]} {have}/{least}" for q, (have, least) in quotas.items())
          + "; per class (a shape counts in each of its classes): "
          + ", ".join(f"{gen.LABELS[c]} {sum(c in r.classes for r in rows)}" for c in gen.CLASSES))


def stage_evolve(run: stg.Run) -> bool:
    return stg.evolve(run, run_child)  # this module's run_child, looked up now (tests put a stand-in there)


PAD_S_A_ROW = 0.8  # seconds kept back per misaligned row for the pad peer


def stage_time(run: stg.Run) -> bool:
    args = run.args
    meta = {"seed": args.seed, "shapes": f"_rand_shapes.generate(seed={args.seed}, count={args.count}): {len(run.sample)} rows",
            "operators": args.operators}
    # the pad peer runs after every evo row: its rows' time (about 0.3-0.6 s each on an H100, seed 9)
    # is kept back from the timer's cap, or a capped call times it on a few rows only (seed 9: 2 of 47)
    reserve = PAD_S_A_ROW * sum("misaligned" in r.classes for r in run.sample)
    ok = btime.stage_time(run, meta, peer_ms=list(range(1, 17)), reserve_s=reserve)  # every decode M: one build (and cache) each seed
    ok = rtime.stage_pad(run, args.pad_peer) and ok
    rtime.annotate_best(run)
    return ok


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.summarize is not None:
            return stg.summarize(args.summarize, args.out, write_report)
        try:
            rows = gen.generate(args.seed, args.count)
        except ValueError as exc:
            raise stg.UsageError(str(exc)) from None
        if args.list:
            print_shapes(rows, args.anchors, args.seed)
            return 0
        print(f"random_shapes_bench: {seed_line(args.seed)}; operators {args.operators}", flush=True)
        return stg.run_main(args, rows, gen.RandRow.from_dict,
                            {"evolve": stage_evolve, "export": stg.stage_export, "time": stage_time}, write_report,
                            tag={"seed": args.seed, "count": args.count})
    except stg.UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
