"""The same-machine throughput comparison of two evaluator trees, summed up (issue 36).

    python bench/throughput_ab.py DIR [--target 0.9]

``bash bench/device.sh throughput-ab`` runs ``bench/eval_bench.py`` for the new tree and an old
one (``OLD_TREE``) at 4096^3 and 64x128x64, ``AB_PAIRS`` times in ABBA order, each leg writing
``DIR/ab_<tree>_<shape>_<pair>/eval_bench.json``. One pair per shape is not enough to call a
10% line: on 2026-12-06 two calls on two H100s gave 0.889 and 0.931 at 4096^3 (RESULTS 29), the
old tree itself moving 6% between them. This reads every leg, pairs the new and old legs of
each shape and pair number, and prints per pair the two rates and their ratio, then per shape
the geometric mean of the ratios, its spread and the verdict against ``--target``. Only pairs
whose two legs both came back count.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from typing import Any, Optional

_LEG = re.compile(r"ab_(new|old)_(\w+?)(?:_(\d+))?$")


def read_legs(root: str) -> dict[tuple[str, str], dict[str, float]]:
    """{(shape tag, pair): {"new": per minute, "old": per minute}} from every leg's eval_bench.json."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for path in sorted(glob.glob(os.path.join(root, "ab_*", "eval_bench.json"))):
        m = _LEG.match(os.path.basename(os.path.dirname(path)))
        if not m:
            continue
        tree, shape, pair = m.group(1), m.group(2), m.group(3) or "1"
        with open(path) as fh:
            data = json.load(fh)
        rates = [v["per_minute"] for v in data.values() if isinstance(v, dict) and "per_minute" in v]
        if rates:
            out.setdefault((shape, pair), {})[tree] = float(rates[0])
    return out


def summarize(legs: dict[tuple[str, str], dict[str, float]], target: float) -> tuple[list[str], dict[str, Any]]:
    """Lines to print and, per shape, the pairs' ratios, their geometric mean and the verdict."""
    lines = ["shape      pair     old/min    new/min   new/old"]
    ratios: dict[str, list[float]] = {}
    for (shape, pair), rates in sorted(legs.items()):
        if "new" not in rates or "old" not in rates:
            lines.append(f"{shape:<10} {pair:>4}  (a leg did not come back: {sorted(rates)})")
            continue
        r = rates["new"] / rates["old"]
        ratios.setdefault(shape, []).append(r)
        lines.append(f"{shape:<10} {pair:>4}  {rates['old']:9.1f}  {rates['new']:9.1f}   {r:7.3f}")
    result: dict[str, Any] = {}
    for shape, rs in sorted(ratios.items()):
        gm = math.exp(sum(math.log(r) for r in rs) / len(rs))
        verdict = "met" if gm >= target else f"missed by {target - gm:.3f}"
        result[shape] = {"ratios": rs, "geomean": gm, "min": min(rs), "max": max(rs), "verdict": verdict}
        lines.append(f"{shape:<10} geomean {gm:.3f} over {len(rs)} pair(s) (range {min(rs):.3f}-{max(rs):.3f}): "
                     f"{verdict} against {target}")
    return lines, result


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the folder the throughput-ab part wrote (its $OUT)")
    ap.add_argument("--target", type=float, default=0.9, help="new/old rate the target asks for")
    ap.add_argument("--json", default=None, help="also write the per-shape figures here")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"throughput_ab: no such folder: {args.dir}", file=sys.stderr)
        return 2
    legs = read_legs(args.dir)
    if not legs:
        print(f"throughput_ab: no ab_*/eval_bench.json under {args.dir}", file=sys.stderr)
        return 2
    lines, result = summarize(legs, args.target)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
