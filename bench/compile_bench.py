#!/usr/bin/env python3
"""Compile throughput on this CPU machine: NVRTC vs nvcc, cold vs cached, serial vs the pool.

Kernels: knob sets sampled (seeded) from every seed template at a few shapes, so the set
mixes mma.sync, tiny latency kernels and (for sm_90a) wgmma/TMA kernels, specialised and not.
Each mode starts from an empty cache folder unless it is the cached mode. Also measured: the
same NVRTC compiles in-process, without the isolated child, to price the isolation.

    /work/venv/bin/python bench/compile_bench.py [--kernels 20] [--arch sm_90a]

Prints one table row per mode (compiles, wall seconds, compiles/s, median seconds per compile),
the paired nvcc/NVRTC ratio over kernels both compiled, and the price of the isolated child.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from populations import Candidate, Shape, load_templates  # noqa: E402
from evaluators import CompilePool, compile_candidate  # noqa: E402
from evaluators.compile._backends import flags_for  # noqa: E402
from evaluators.compile._isolate import _nvrtc_compile  # noqa: E402
from evaluators.compile._toolkit import nvrtc_library  # noqa: E402

SHAPES = (Shape(4096, 4096, 4096), Shape(64, 4096, 4096), Shape(333, 517, 129, "NN"), Shape(8, 8192, 1024))


def kernels(n: int, arch: str, rev: str, seed: int = 0) -> list[Candidate]:
    """``n`` candidates from the templates as committed at ``rev`` (not the working tree, which
    other people edit while this runs)."""
    rng = random.Random(seed)
    out: list[Candidate] = []
    root = Path(__file__).resolve().parents[1]
    snap = Path(tempfile.mkdtemp(prefix="evo-bench-templates-"))
    archive = subprocess.run(["git", "-C", str(root), "archive", rev, "populations/templates"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive, check=True)
    loaded = load_templates(snap / "populations" / "templates")
    templates = [t for t in loaded.values() if arch == "sm_90a" or "sm_90a" not in t.arch_features]
    i = 0
    while len(out) < n and i < 50 * n:
        t = templates[i % len(templates)]
        shape = SHAPES[(i // len(templates)) % len(SHAPES)]
        i += 1
        if not t.applicable(shape, int(arch[3:5])):
            continue
        for knobs in t.sample(rng, shape, 1):
            out.append(t.candidate(knobs, shape, specialize=bool(rng.getrandbits(1))))
    return out[:n]


def run_mode(name: str, cands: list[Candidate], arch: str, workers: int, backend: str, cache: str) -> dict:
    t0 = time.monotonic()
    if workers == 1:
        results = [compile_candidate(c, arch, backend=backend, cache_dir=cache) for c in cands]
    else:
        with CompilePool(workers=workers, backend=backend, cache_dir=cache) as pool:
            results = pool.map(cands, arch)
    wall = time.monotonic() - t0
    bad = [r.message[:200] for r in results if not r.ok]
    return {"mode": name, "n": len(results), "wall": wall, "per_s": len(results) / wall,
            "median": statistics.median(r.seconds for r in results), "failed": len(bad),
            "cached": sum(r.cached for r in results), "first_failure": bad[0] if bad else "",
            "each": [(r.ok, r.seconds) for r in results]}


def in_process(cands: list[Candidate], arch: str) -> dict:
    flags = list(flags_for("nvrtc", arch))
    lib = nvrtc_library()
    _nvrtc_compile(cands[0].source, flags, lib)  # load the library once, as a warm child would
    times = []
    t0 = time.monotonic()
    for c in cands:
        t = time.monotonic()
        ok, _, _ = _nvrtc_compile(c.source, flags, lib)
        times.append(time.monotonic() - t)
    wall = time.monotonic() - t0
    return {"mode": "nvrtc in-process (no isolation, no scan)", "n": len(cands), "wall": wall,
            "per_s": len(cands) / wall, "median": statistics.median(times), "failed": 0, "cached": 0,
            "first_failure": "", "times": times}


def paired_overhead(cands: list[Candidate], arch: str) -> str:
    """Price of isolation, measured interleaved (the machine's load drifts between modes).

    Per kernel, in a rotating order: NVRTC in this process, in a child forked from the warm
    server, and in a freshly spawned child; plus the static scan alone.
    """
    from evaluators import scan
    from evaluators.compile._isolate import run_compile_isolated

    flags, lib = flags_for("nvrtc", arch), nvrtc_library()
    modes = {
        "in-process": lambda src: _nvrtc_compile(src, list(flags), lib),
        "fork server": lambda src: run_compile_isolated("nvrtc", src, flags, timeout_s=120, library=lib, zygote=True),
        "spawned": lambda src: run_compile_isolated("nvrtc", src, flags, timeout_s=120, library=lib, zygote=False),
    }
    modes["fork server"](cands[0].source)  # start the server outside the measurement
    times: dict[str, list[float]] = {m: [] for m in modes}
    scans = []
    for i, c in enumerate(cands):
        order = list(modes)[i % 3:] + list(modes)[:i % 3]
        for m in order:
            t = time.perf_counter()
            modes[m](c.source)
            times[m].append(time.perf_counter() - t)
        t = time.perf_counter()
        scan(c, arch=arch)
        scans.append(time.perf_counter() - t)
    base = times["in-process"]
    fork = statistics.median(b - a for a, b in zip(base, times["fork server"]))
    spawn = statistics.median(b - a for a, b in zip(base, times["spawned"]))
    return (f"isolation, interleaved over {len(cands)} kernels (median in-process compile "
            f"{statistics.median(base):.3f} s): fork-server child +{fork:.3f} s, spawned child +{spawn:.3f} s; "
            f"static scan {statistics.median(scans):.3f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=20)
    ap.add_argument("--arch", default="sm_90a", choices=("sm_80", "sm_90a"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rev", default="HEAD", help="git revision whose templates to compile")
    ap.add_argument("--paired", type=int, default=8, help="kernels for the interleaved isolation measurement")
    args = ap.parse_args()
    cands = kernels(args.kernels, args.arch, args.rev)
    lines = sum(c.source.count("\n") for c in cands) / len(cands)
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], capture_output=True, text=True).stdout.strip()
    print(f"templates at {rev}: {len(cands)} kernels ({', '.join(sorted({c.template or '?' for c in cands}))}), "
          f"{lines:.0f} lines on average, arch {args.arch}, {os.cpu_count()} CPUs, "
          f"load average before {os.getloadavg()[0]:.1f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="evo-bench-") as tmp:
        rows.append(in_process(cands, args.arch))
        rows.append(run_mode("nvrtc cold, serial", cands, args.arch, 1, "nvrtc", f"{tmp}/a"))
        rows.append(run_mode("nvrtc cached, serial", cands, args.arch, 1, "nvrtc", f"{tmp}/a"))
        rows.append(run_mode(f"nvrtc cold, pool({args.workers})", cands, args.arch, args.workers, "nvrtc", f"{tmp}/b"))
        rows.append(run_mode("nvcc cold, serial", cands, args.arch, 1, "nvcc", f"{tmp}/c"))
        rows.append(run_mode("nvcc cached, serial", cands, args.arch, 1, "nvcc", f"{tmp}/c"))
    print("| mode | compiles | wall s | compiles/s | median s/compile | failed | cache hits |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['n']} | {r['wall']:.1f} | {r['per_s']:.2f} | {r['median']:.3f} | "
              f"{r['failed']} | {r['cached']} |")
    nvrtc, nvcc = rows[1]["each"], rows[4]["each"]
    both = [(a[1], b[1]) for a, b in zip(nvrtc, nvcc) if a[0] and b[0]]
    if both:
        ratios = sorted(b / a for a, b in both)
        print(f"nvcc / nvrtc seconds per kernel, serial, over the {len(both)} kernels both compiled: "
              f"median {statistics.median(ratios):.2f} (range {ratios[0]:.2f}-{ratios[-1]:.2f})")
    print(paired_overhead(cands[:args.paired], args.arch))
    for r in rows:
        if r["first_failure"]:
            print(f"{r['mode']}: first failure: {r['first_failure'].splitlines()[0]}")
    print(f"load average after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
