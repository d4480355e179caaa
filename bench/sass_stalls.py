"""Where a kernel's warps wait, by SASS instruction: Nsight Compute's source page (PC sampling, the
``SourceCounters`` section) summed per instruction and listed from the most sampled down, with each
row's share of all samples, until ``--cover`` of them is listed.

    ncu --section SourceCounters --section WarpStateStats -k regex:evo_wgmma_ragged -c 1 -o $OUT/src -f ...
    ncu -i $OUT/src.ncu-rep --page source --csv --print-source sass > $OUT/src_sass.csv
    python3 bench/sass_stalls.py $OUT/src_sass.csv          # CPU; .csv.gz too

(``bash bench/device.sh source-profile`` runs all three.) The aggregate stall reasons of the raw
page say what the warps wait for; this says where, which is what separates, in a warp-specialised
kernel, the producer's waits from the consumers' (issue 34's in-place ragged producer:
bench/RESULTS.md section 27 (i)). Columns are found by name: the SASS text (``Source``), the address
(``Address``, when there is one) and every column whose name holds ``Warp Stall Sampling`` (the
first holding ``All Samples`` ranks the rows). A file without them is said, with its header, so a
changed ncu version is seen at once rather than read as a kernel without stalls.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys
from pathlib import Path
from typing import Any, Optional


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def read_source_page(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of ncu's ``--page source --csv`` output (plain or gzip), skipping any
    lines before the header (ncu prints ``==PROF==`` notes first when it writes to stdout)."""
    raw = gzip.open(path, "rt", newline="").read() if path.suffix == ".gz" else path.read_text()
    lines = raw.splitlines()
    start = next((i for i, line in enumerate(lines) if "Source" in next(csv.reader([line]), [])), None)
    if start is None:
        raise ValueError(f"{path}: no header with a 'Source' column (first line: {lines[0][:200] if lines else ''!r})")
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    return list(reader.fieldnames or []), list(reader)


def stall_columns(header: list[str]) -> tuple[str, list[str]]:
    """(the ranking column, every stall-sampling column): ``Warp Stall Sampling`` columns, ranked by
    the first with ``All Samples`` (else the first of them)."""
    cols = [h for h in header if "Warp Stall Sampling" in h]
    if not cols:
        raise ValueError(f"no 'Warp Stall Sampling' column: the profile lacks SourceCounters? header: {header}")
    rank = next((h for h in cols if "All Samples" in h), cols[0])
    return rank, cols


def ledger(rows: list[dict[str, str]], rank: str, cols: list[str], cover: float = 0.9,
           limit: int = 40) -> tuple[float, list[dict[str, Any]]]:
    """(all samples, the rows that cover ``cover`` of them, most sampled first, at most ``limit``)."""
    total = sum(_num(r.get(rank, "")) for r in rows)
    ranked = sorted(rows, key=lambda r: -_num(r.get(rank, "")))
    out: list[dict[str, Any]] = []
    seen = 0.0
    for r in ranked:
        n = _num(r.get(rank, ""))
        if n <= 0 or len(out) >= limit or (total and seen >= cover * total):
            break
        seen += n
        out.append({"address": r.get("Address", ""), "sass": (r.get("Source") or "").strip(),
                    "samples": n, "share": n / total if total else 0.0,
                    **{c: _num(r.get(c, "")) for c in cols if c != rank}})
    return total, out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", type=Path, help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    p.add_argument("--cover", type=float, default=0.9, help="list rows until this share of all samples")
    p.add_argument("--limit", type=int, default=40, help="at most this many rows")
    args = p.parse_args(argv)
    try:
        header, rows = read_source_page(args.csv)
        rank, cols = stall_columns(header)
    except (OSError, ValueError) as exc:
        print(f"sass_stalls: {exc}", file=sys.stderr)
        return 2
    total, top = ledger(rows, rank, cols, args.cover, args.limit)
    others = [c for c in cols if c != rank]
    print(f"{len(rows)} SASS rows, {total:.0f} samples ({rank}); the rows covering {args.cover:.0%}:\n")
    print("| address | SASS | samples | share | " + " | ".join(others) + (" |" if others else "|"))
    print("|---|---|---:|---:|" + "---:|" * len(others))
    for r in top:
        rest = " | ".join(f"{r[c]:.0f}" for c in others)
        print(f"| {r['address']} | `{r['sass'][:70]}` | {r['samples']:.0f} | {r['share']:.1%} |" + (f" {rest} |" if others else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
