"""Host time and dead ends of the knob-edit grammars of one batched LLM call, without a model (issue 35).

    PYTHONPATH=$PWD python bench/grammar_host.py [--rows 8,64] [--out FILE]

The LLM operator's rows decode under :class:`operators.llm.KnobEditGrammar`s whose options are
Python work outside the GPU lease (issue 35 measured 0.14-0.99 s a call on the H200). This drives
the grammars of one call with no model: a *stand-in chooser* (not a model: each row takes option
i with probability ~ e^-i, so rows crowd the first options as a model's favourite does) steps the
rows in turn, one choice each, as the decoding loop does. Two arms: ``plain`` (the grammars as
before 011593a: rows know the sets other rows finished on) and ``holds`` (the operator's
:class:`operators.llm.BatchClaims`: a row holds a free completion of what it committed to, and
the call's validity checks are memoised). Per template and row count: seconds of grammar work
for the call, rows that dead-ended, and seconds per finished edit. Several seeds, medians.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators.llm import BatchClaims, KnobEditGrammar  # noqa: E402
from populations import Shape, Template, load_templates  # noqa: E402

CASES = (("sm90_wgmma", "4096x4096x4096"), ("sm80_mma", "4096x4096x4096"), ("gemv", "1x4096x4096"))


def plain_grammars(t: Template, parent: dict[str, Any], shape: Shape, rows: int) -> list[KnobEditGrammar]:
    """Rows that know only the sets other rows finished on (the operator's grammars before holds)."""
    taken: set = set()

    class Finishing(KnobEditGrammar):
        def choose(self, option: str) -> None:
            super().choose(option)
            if self.done:
                taken.add(tuple(sorted({**self.parent, **self.edit}.items())))

    return [Finishing(t, parent, shape, 2, known=lambda k: tuple(sorted(k.items())) in taken) for _ in range(rows)]


def drive(grammars: list[KnobEditGrammar], rng: random.Random) -> tuple[float, int, int]:
    """Step every unfinished row one choice at a time until none can go on: (seconds, finished, stuck)."""
    t0 = time.perf_counter()
    live, stuck = list(range(len(grammars))), 0
    while live:
        nxt = []
        for i in live:
            opts = grammars[i].options()
            if not opts:
                stuck += 1
                continue
            grammars[i].choose(opts[min(int(rng.expovariate(1.0)), len(opts) - 1)])
            if not grammars[i].done:
                nxt.append(i)
        live = nxt
    return time.perf_counter() - t0, sum(g.done for g in grammars), stuck


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="8,64", help="rows a call (comma-separated)")
    ap.add_argument("--seeds", type=int, default=5, help="calls per case and arm (the chooser's seeds)")
    ap.add_argument("--out", default="", help="JSON file to write")
    args = ap.parse_args(argv)
    try:
        row_counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        print(f"grammar_host: --rows must be comma-separated integers, got {args.rows!r}", file=sys.stderr)
        return 2
    templates = load_templates()
    results = []
    print(f"{'template':<11} {'shape':<15} {'rows':>4} {'arm':<6} {'grammar s':>9} {'finished':>8} {'stuck':>5} {'ms/edit':>8}")
    for name, shape_text in CASES:
        t, shape = templates[name], Shape.parse(shape_text)
        parent = t.space.complete(t.heuristic(shape, arch=90)[0])
        for rows in row_counts:
            for arm in ("plain", "holds"):
                runs = []
                for seed in range(args.seeds):
                    gs = plain_grammars(t, parent, shape, rows) if arm == "plain" else \
                        BatchClaims().grammars(t, parent, shape, 2, rows)
                    runs.append(drive(gs, random.Random(seed)))
                secs = statistics.median(r[0] for r in runs)
                done = statistics.median(r[1] for r in runs)
                stuck = statistics.median(r[2] for r in runs)
                per = 1000 * secs / done if done else math.inf
                results.append({"template": name, "shape": shape_text, "rows": rows, "arm": arm, "seconds": round(secs, 4),
                                "finished": done, "stuck": stuck, "ms_per_edit": round(per, 2),
                                "runs": [[round(a, 4), b, c] for a, b, c in runs]})
                print(f"{name:<11} {shape_text:<15} {rows:>4} {arm:<6} {secs:>9.3f} {done:>8} {stuck:>5} {per:>8.1f}")
    if args.out:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                              "commit": commit, "machine": platform.machine(),
                                              "command": "python bench/grammar_host.py " + " ".join(argv or sys.argv[1:]),
                                              "seeds": args.seeds, "results": results}, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
