"""Hardware counters for the decode gap (issue 26): where the decode families' first picks lose to a
pure weight read, profiled with Nsight Compute beside the plain peer, cuBLAS and the read floor.
With ``--templates`` any family's first picks (issue 34's mid shapes: ``--templates
sm90_wgmma,streamk90 --picks 2 --no-peer --no-floor``, and the tensor-pipe columns).

    ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
        -o $OUT/prof -f python3 bench/decode_profile.py --shapes 16x6144x4096 1x3072x3072 --out $OUT
    ncu -i $OUT/prof.ncu-rep --csv --page raw > $OUT/prof.csv
    python3 bench/decode_profile.py --summarize $OUT/prof.csv --order $OUT/profile_order.json   # CPU

Per shape the contenders are each template's first ``--picks`` heuristic picks (``evo seed``'s), the
peer's best launch shape (picked by graph-replay timing outside the profiled range, but under ncu,
whose per-launch overhead can change the pick), cuBLAS TN
(``torch.matmul(a, w.t())``) and the best streaming-read floor (``decode_floors.py``). Each is
launched ``--launches`` times on different rotation sets inside one NVTX range ``prof``, so ncu
profiles only those launches (its default cache control flushes L2 before each: weights come from
HBM, as in a model). The launch order is written to ``profile_order.json``; ``--summarize`` joins it
with ncu's raw-page CSV by kernel name and prints, per contender, kernel time, DRAM throughput (share
of peak and TB/s), L2 throughput, achieved occupancy, registers and the top warp stall reasons.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from populations import Shape, load_templates  # noqa: E402

TEMPLATES = ("gemv", "swab", "swpipe")


def contenders(shape: Shape, templates: dict[str, Any], names: tuple[str, ...] = TEMPLATES,
               picks: int = 1) -> list[tuple[str, Any]]:
    """(label, candidate) for each applicable template's first ``picks`` heuristic picks."""
    out = []
    for name in names:
        t = templates[name]
        if t.applicable(shape, 90):
            for knobs in t.heuristic(shape, 90)[:picks]:
                out.append((f"{name} {json.dumps(knobs, sort_keys=True)}", t.candidate(knobs, shape)))
    return out


def parse_knobs(text: str) -> tuple[str, dict[str, Any]]:
    """``TEMPLATE:K=V,K=V`` -> (template, knobs); values as ints, true/false, else strings.
    E.g. ``sm90_wgmma:SWAP=true,BM=128,BN=72,STAGES=8`` (cuBLAS's own tile at 777x1536x2880)."""
    name, _, rest = text.partition(":")
    knobs: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--knobs {text!r}: {item!r} is not KNOB=VALUE")
        low = value.lower()
        knobs[key] = True if low == "true" else False if low == "false" else int(value) if value.lstrip("-").isdigit() else value
    if not name:
        raise ValueError(f"--knobs {text!r}: no template name before ':'")
    return name, knobs


def explicit(shape: Shape, templates: dict[str, Any], specs: list[str]) -> list[tuple[str, Any]]:
    """(label, candidate) for each ``--knobs`` set that is valid at ``shape`` (the others are said
    and skipped: a set can be for some shapes of the list only)."""
    out = []
    for spec in specs:
        name, knobs = parse_knobs(spec)
        if name not in templates:
            raise ValueError(f"--knobs {spec!r}: unknown template {name!r}")
        t = templates[name]
        full = t.fitted(knobs, shape) or t.space.complete(knobs)
        why = t.check(full, shape, 90)
        if why:
            print(f"decode_profile: --knobs {spec} at {shape}: not valid there ({'; '.join(why)[:200]})", flush=True)
            continue
        out.append((f"{name} {json.dumps(full, sort_keys=True)}", t.candidate(full, shape)))
    return out


def kernel_prefix(cand: Any, shape: Shape) -> str:
    """The name of the candidate's main launch at ``shape`` (the last: a staging pre-pass comes first)."""
    return kernel_sequence(cand, shape)[-1]


def kernel_sequence(cand: Any, shape: Shape) -> list[str]:
    """The names of the kernels one call of the candidate launches at ``shape``, in order (a staging
    pre-pass, the GEMM, a split-K reduce): the profile holds one row for each."""
    launches, _ = cand.plan.resolve(shape)
    return [launch.kernel for launch in launches]


def binder_launch(cubin: bytes, cand: Any, shape: Shape) -> Any:
    """launch(a, b, c) through the evaluator's binder (``evaluators.run._kernels.CandidateKernels``):
    a plan with tensor maps passes each as a 128-byte kernel parameter, which cupy cannot."""
    from align_mid_check import launcher
    from evaluators.run._kernels import CandidateKernels
    from evaluators.run._loader import DriverLoader
    from evaluators.run._tmap import TmapCache

    global _BINDER
    if _BINDER is None:
        _BINDER = (DriverLoader(), TmapCache())
    return launcher(CandidateKernels(_BINDER[0], cubin, cand.plan, _BINDER[1]), shape)


_BINDER: Any = None


def profile(args: argparse.Namespace) -> int:
    import torch
    from decode_dev import Loaded, compile_all, cublas, graph_us, load_peer, peer_best, reference, rel_error, rotation
    from decode_floors import Floors

    templates = load_templates()
    shapes = [Shape.parse(s) for s in args.shapes]
    names = tuple(n.strip() for n in args.templates.split(",") if n.strip())
    unknown = [n for n in names if n not in templates]
    if unknown:
        raise SystemExit(f"decode_profile: unknown template(s) {', '.join(unknown)}; known: {', '.join(sorted(templates))}")
    try:
        plan = {s: contenders(s, templates, names, args.picks) + explicit(s, templates, args.knobs) for s in shapes}
    except ValueError as exc:
        raise SystemExit(f"decode_profile: {exc}")
    compiled = compile_all([c for cs in plan.values() for _, c in cs])
    from _llm_timer import PeerRunner

    peer = None if args.no_peer else load_peer(args.peer)
    runner = PeerRunner(peer, sorted({s.m for s in shapes} & {1, 8, 16})) if peer is not None else None
    floors = None if args.no_floor else Floors()
    tmp = Path(tempfile.mkdtemp())  # cubins for cupy (not under --out: $OUT returns few files)
    order: list[dict[str, Any]] = []
    for s in shapes:
        sets = rotation(s, min_sets=max(2, args.launches))
        ref = reference(sets)
        runs: list[tuple[str, Any]] = []
        sequences: dict[str, list[str]] = {}  # each evo contender's kernels, in launch order
        for label, cand in plan[s]:
            r = compiled[cand.source]
            if not r.ok:
                print(f"{s} {label}: compile failed", flush=True)
                continue
            launch = (binder_launch(r.cubin, cand, s) if cand.plan.tensor_maps  # TMA: the evaluator's binder
                      else Loaded(r.cubin, tmp).launcher(cand, s))
            err = rel_error(sets, launch, ref)
            if not err < 2e-3:
                print(f"{s} {label}: wrong (rel err {err:.2e})", flush=True)
                continue
            runs.append((f"evo {label}", launch))
            sequences[f"evo {label}"] = kernel_sequence(cand, s)
        if runner is not None:
            _, cfg, peer_launch = peer_best(runner, s, sets, ref)
            if peer_launch is not None:
                runs.append((f"peer {cfg}", peer_launch))
        runs.append(("cuBLAS TN", cublas))
        if not args.no_floor:
            _, read_cfg, read_launch = floors.best_read(sets, graph_us)
            runs.append((f"read floor {read_cfg}", read_launch))
        timed = {label: graph_us(sets, launch) for label, launch in runs}  # graph replay, for the table beside
        torch.cuda.synchronize()
        for label, launch in runs:
            for i in range(args.launches):
                a, w, c = sets[(i + 1) % len(sets)]
                torch.cuda.nvtx.range_push("prof")
                launch(a, w, c)
                torch.cuda.nvtx.range_pop()
                order.append({"shape": str(s), "label": label, "graph_us": round(timed[label], 3),
                              **({"prefix": sequences[label][-1], "kernels": sequences[label]} if label in sequences else {})})
            torch.cuda.synchronize()
        print(f"{s}: " + ", ".join(f"{k} {v:.2f} us" for k, v in timed.items()), flush=True)
        del sets, ref
        torch.cuda.empty_cache()
    Path(args.out, "profile_order.json").write_text(json.dumps(order, indent=1))
    return 0


# ncu raw-page columns (one row per kernel, a units row first): column -> title
RAW = {"gpu__time_duration.sum": "us", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
       "dram__bytes.sum.per_second": "DRAM B/s", "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 %",
       "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %", "launch__registers_per_thread": "regs",
       "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
       # Hopper's wgmma runs on the GMMA tensor pipe; mma.sync on the HMMA one (whichever the kernel uses)
       "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "GMMA %",
       "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "HMMA %"}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
PREFIX = {"evo gemv": "evo_gemv", "evo swab": "evo_swab", "evo swpipe": "evo_swpipe", "peer g": "void gemv_tn",
          "peer m": "void mma_tn", "read floor": "evo_floor_read"}


def _prefix(label: str) -> str | None:
    """The kernel-name prefix of a contender's launches; None for cuBLAS (whatever it picked)."""
    return next((v for k, v in PREFIX.items() if label.startswith(k)), None)


def _kernels(csv_path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if csv_path.suffix == ".gz" else open
    with opener(csv_path, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    units = rows[0] if rows and not rows[0].get("ID", "").strip() else {}
    out = []
    for row in rows[1 if units else 0:]:
        k: dict[str, Any] = {"name": row.get("Kernel Name", ""), "grid": row.get("Grid Size", ""),
                             "block": row.get("Block Size", "")}
        for col, title in RAW.items():
            k[title] = _scaled(row.get(col, ""), units.get(col, ""))
        k["stalls"] = {m.group(1): _num(v) for col, v in row.items() if (m := STALL.match(col or ""))
                       and m.group(1) not in ("not_selected", "selected")}
        out.append(k)
    return out


def summarize(csv_path: Path, order_path: Path) -> int:
    """One row per contender and shape from ncu's raw page: medians over its profiled launches. The
    kernels are matched to the launch order by name. A call may be several kernels: evo's staged plan
    is a pre-pass and the GEMM (the run writes the sequence down), a cuBLAS call a split-K GEMM and
    its reduction. Their times add up to one launch; the other columns are the launch's longest
    kernel's."""
    order = json.loads(order_path.read_text())
    kernels = _kernels(csv_path)
    groups: list[tuple[str, str, int]] = []  # (shape, label, launches), in launch order
    named = {o["label"]: o["prefix"] for o in order if o.get("prefix")}  # kernel names the run wrote down
    sequences = {o["label"]: o["kernels"] for o in order if o.get("kernels")}  # a call's kernels, in order
    for o in order:
        if groups and groups[-1][:2] == (o["shape"], o["label"]):
            groups[-1] = groups[-1][:2] + (groups[-1][2] + 1,)
        else:
            groups.append((o["shape"], o["label"], 1))

    def prefix_of(label: str) -> str | None:
        return named.get(label) or _prefix(label)

    def first_of(label: str) -> str | None:  # the name a call of the contender starts with
        return sequences[label][0] if label in sequences else prefix_of(label)

    def call_at(j: int, seq: list[str]) -> bool:
        return j + len(seq) <= len(kernels) and all(kernels[j + t]["name"].startswith(n) for t, n in enumerate(seq))

    print("| shape | contender | kernels | ncu us | DRAM % of peak | DRAM TB/s | L2 % | SM % | tensor pipe % | "
          "achieved occupancy % | regs | grid x block | top stalls (warps per issue) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    i = 0
    for gi, (shape, label, n) in enumerate(groups):
        pre = prefix_of(label)
        launches: list[list[dict[str, Any]]] = []
        if label in sequences:
            seq = sequences[label]
            while len(launches) < n and call_at(i, seq):
                launches.append(kernels[i:i + len(seq)])
                i += len(seq)
        elif pre is not None:  # an order file without sequences: evo pre-passes, then the named kernel
            while len(launches) < n:
                j = i
                while j < len(kernels) and kernels[j]["name"].startswith("evo_") and not kernels[j]["name"].startswith(pre):
                    j += 1
                if j >= len(kernels) or not kernels[j]["name"].startswith(pre):
                    break
                launches.append(kernels[i:j + 1])
                i = j + 1
        else:  # cuBLAS: every kernel up to the next contender's first; a launch starts at the first kernel's name
            nxt = first_of(groups[gi + 1][1]) if gi + 1 < len(groups) else None
            while i < len(kernels) and not (nxt and kernels[i]["name"].startswith(nxt)):
                if not launches or kernels[i]["name"] == launches[0][0]["name"]:
                    launches.append([])
                launches[-1].append(kernels[i])
                i += 1
        if not launches:
            print(f"| {shape} | {label} | not found | | | | | | | | | | |")
            continue
        main = [max(ln, key=lambda k: k["us"] if k["us"] == k["us"] else -1.0) for ln in launches]  # the longest
        med = {t: _median([sum(k[t] for k in ln) if t == "us" else m[t] for ln, m in zip(launches, main)])
               for t in RAW.values()}
        st: dict[str, float] = defaultdict(float)
        for m in main:
            for r, v in m["stalls"].items():
                st[r] += v / len(launches)
        top = ", ".join(f"{r} {v:.1f}" for r, v in sorted(st.items(), key=lambda kv: -kv[1])[:3])
        names = " + ".join(dict.fromkeys(k["name"].split("(")[0].replace("void ", "")[:40] for k in launches[0]))
        first = main[0]
        tensor = med["GMMA %"] if med["GMMA %"] is not None else med["HMMA %"]
        print(f"| {shape.split(':')[0]} | {label} | {names} | {_fmt(med['us'])} | {_fmt(med['DRAM %'], 1, 1)} | "
              f"{_fmt(med['DRAM B/s'], 1e-12)} | {_fmt(med['L2 %'], 1, 1)} | {_fmt(med['SM %'], 1, 1)} | "
              f"{_fmt(tensor, 1, 1)} | {_fmt(med['occupancy %'], 1, 1)} | "
              f"{_fmt(med['regs'], 1, 0)} | {first['grid']} x {first['block']} | {top} |")
    if i != len(kernels):
        print(f"note: {len(kernels) - i} profiled kernels not matched to a launch", file=sys.stderr)
    return 0


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return float("nan")


def _scaled(value: str, unit: str) -> float:
    """Durations in us, throughputs in bytes/s, the rest as given."""
    x = _num(value)
    scale = {"ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3,
             "byte/second": 1, "Kbyte/second": 1e3, "Mbyte/second": 1e6, "Gbyte/second": 1e9,
             "Tbyte/second": 1e12, "byte/s": 1, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12,
             "B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12}.get(unit, 1)
    return x * scale


def _median(xs: list[Any]) -> Any:
    v = [x for x in xs if isinstance(x, (int, float)) and x == x]
    return statistics.median(v) if v else None


def _fmt(x: Any, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["16x6144x4096", "1x3072x3072", "8x4096x4096", "16x4096x14336"])
    p.add_argument("--launches", type=int, default=3, help="profiled launches per contender (different sets)")
    p.add_argument("--peer", help="path of the plain peer (plain_gemv.py)")
    p.add_argument("--templates", default=",".join(TEMPLATES), help="comma-separated templates whose picks compete")
    p.add_argument("--picks", type=int, default=1, help="heuristic picks per template")
    p.add_argument("--knobs", action="append", default=[], metavar="TEMPLATE:K=V,...",
                   help="a knob set to profile beside the picks (repeatable), e.g. cuBLAS's own tile: "
                        "sm90_wgmma:SWAP=true,BM=128,BN=72,STAGES=8")
    p.add_argument("--no-peer", action="store_true", help="leave the plain peer out (it serves M in 1, 8, 16)")
    p.add_argument("--no-floor", action="store_true", help="leave the streaming-read floor out (compute-bound shapes)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--summarize", type=Path, help="ncu's --csv --page raw output: print the table (no GPU)")
    p.add_argument("--order", type=Path, help="profile_order.json of the profiled run (with --summarize)")
    args = p.parse_args()
    if args.summarize:
        return summarize(args.summarize, args.order or args.summarize.with_name("profile_order.json"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return profile(args)


if __name__ == "__main__":
    sys.exit(main())
