"""Archive throughput: durable appends per second, and open+scan time of 100,000 records.

Records are realistic: candidates carry ~6 KB of CUDA source (the head of the sm80_mma template
behind its knob ``#define``s) and a two-launch split-K plan; evaluations carry device and offline
timers, two kernels' ptxas stats and a provenance map. Every figure is wall time on this machine
with a warm page cache (we do not drop caches on a shared machine), best of ``--repeat`` runs.

    python bench/archive_bench.py [--records 100000] [--appends 4096] [--repeat 3] [--dir DIR] [--commands]

``--commands`` also times the user's commands on the big archive, as subprocesses (interpreter
start included): ``evo inspect DIR --json`` and ``evo report DIR --out OUT``. ``EVO_ROOT=CHECKOUT``
runs everything (the archive writing too) with another checkout's code, e.g. the one before a
change: ``EVO_ROOT=/work/main python bench/archive_bench.py --commands``.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("EVO_ROOT") or Path(__file__).resolve().parents[1]).resolve()
sys.path.insert(0, str(ROOT))

from populations import (Archive, Candidate, Evaluation, KernelStats, Launch, LaunchPlan, Shape,  # noqa: E402
                         Status, TimerResult, encode)

SHAPES = (Shape(4096, 4096, 4096), Shape(8192, 1024, 4096), Shape(1, 4096, 4096, "NN"), Shape(127, 3000, 257))
PLAN = LaunchPlan(
    launches=(Launch("evo_gemm", ("cdiv(N, 128)", "cdiv(M, 128)", 4), (256, 1, 1),
                     ("A", "B", "workspace", "M", "N", "K", "lda", "ldb"), "4 * (128 + 128) * (32 + 8) * 2"),
              Launch("evo_splitk_reduce", ("cdiv(M * N, 256)", 1, 1), (256, 1, 1), ("workspace", "C", "M", "N", "ldc"))),
    workspace="M * N * 4 * 4")


def source_body(size: int = 6000) -> str:
    text = (ROOT / "populations" / "templates" / "sm80_mma" / "kernel.cu").read_text()
    return text[: text.rfind("\n", 0, size) + 1] if len(text) > size else text


BODY = source_body()


def candidate(i: int, rng: random.Random) -> Candidate:
    knobs = {"BM": rng.choice([64, 128, 256]), "BN": rng.choice([64, 128, 256]), "BK": 32, "STAGES": rng.randint(2, 5),
             "WM": 64, "WN": 64, "SPLIT_K": 4, "SWIZZLE": rng.choice([0, 1]), "PAD": 8}
    header = "".join(f"#define {k} {v}\n" for k, v in knobs.items()) + "#define EVO_LAYOUT_TN 1\n"
    return Candidate(source=f"{header}// candidate {i}\n{BODY}", plan=PLAN, shapes=(SHAPES[i % len(SHAPES)],),
                     template="sm80_mma", knobs=knobs, parents=(f"{rng.getrandbits(80):020x}",),
                     operator="knob_mutate", generation=i // 1000, meta={"seed": i})


def evaluation(c: Candidate, rng: random.Random) -> Evaluation:
    t = rng.uniform(5e-4, 2e-3)
    timer = TimerResult(t, t * 0.99, t * 1.01, 9e-4, 8.9e-4, 9.1e-4, 50)
    return Evaluation(
        c.id, c.shapes[0], Status.OK, message="", timers={"device": timer, "offline": timer},
        kernels=(KernelStats("evo_gemm", 168, 0, 0, 0, 0, 392), KernelStats("evo_splitk_reduce", 24, 0, 0, 0, 0, 380)),
        max_error=rng.uniform(1e-4, 1e-3), compile_s=0.25, correctness_s=0.4, timing_s=1.2, arch="sm_90a",
        provenance={"gpu": "NVIDIA H200", "driver": "580.95.05", "cuda": "13.0", "sm_clock_mhz": 1980,
                    "mem_clock_mhz": 3201, "evo": "0123abc", "torch": "2.11.0", "host": "gpu-node-17"})


def records(n: int, seed: int = 0, first: int = 0) -> list:
    """n records: candidate, its evaluation, candidate, ... (half and half); candidates are
    numbered from ``first`` (the number is in the source, so ids never collide)."""
    rng, out = random.Random(seed), []
    for i in range(first, first + n // 2):
        c = candidate(i, rng)
        out += [c, evaluation(c, rng)]
    return out


def bench_appends(root: Path, recs: list, batch: int) -> float:
    """Records per second through Archive.add with a commit (write + fsync) every ``batch``."""
    shutil.rmtree(root, ignore_errors=True)
    with Archive(root, "w") as a:
        start = time.perf_counter()
        for i, r in enumerate(recs, 1):
            a.add(r)
            if i % batch == 0:
                a.commit()
        a.commit()
        elapsed = time.perf_counter() - start
    return len(recs) / elapsed


def timed(fn, repeat: int) -> tuple[float, float]:
    """Best wall and best CPU seconds of ``repeat`` calls (CPU time shows what a shared,
    overloaded machine's wall time hides)."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - start), min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def _evo(argv: list[str]) -> float:
    """Run ``python -m evo ARGV`` with ROOT's code, output discarded; raise if it fails. Returns
    the child's CPU seconds (user + system), which a loaded machine's wall time hides."""
    import resource

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-m", "evo", *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode not in (0, 3):
        raise RuntimeError(f"evo {' '.join(argv)} exited {res.returncode}: {res.stderr.strip()[-300:]}")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--appends", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one, removed after)")
    ap.add_argument("--commands", action="store_true", help="also time evo inspect and evo report on the big archive")
    ap.add_argument("--skip-appends", action="store_true", help="skip the append-rate figures")
    ap.add_argument("--skip-decode", action="store_true", help="skip decoding every record (minutes at 1M records)")
    args = ap.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="archive_bench_"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; python {platform.python_version()}; commit {commit}")
    try:
        sample = records(2)
        print(f"record sizes: candidate {len(encode(sample[0]))} B (source {len(sample[0].source)} B), "
              f"evaluation {len(encode(sample[1]))} B")
        recs = records(args.appends, seed=1, first=10**7)
        for batch in (() if args.skip_appends else (64, 1)):
            n = len(recs) if batch > 1 else min(len(recs), 1000)
            rate = max(bench_appends(scratch / f"append{batch}", recs[:n], batch) for _ in range(args.repeat))
            print(f"durable appends, commit every {batch:>2}: {rate:9.0f} records/s ({n} records)")

        big = scratch / "big"
        start = time.perf_counter()
        with Archive(big, "w") as a:
            for i in range(0, args.records, 2000):
                for r in records(min(2000, args.records - i), seed=i, first=i // 2):
                    a.add(r)
                a.commit()
        size = sum(p.stat().st_size for p in big.iterdir())
        print(f"wrote {args.records} records, {size / 1e6:.0f} MB in {len(SHAPES)} shape logs, "
              f"in {time.perf_counter() - start:.1f} s (commit every 2000)")

        def open_scan() -> None:  # every frame read and checksummed, the id/kind index built
            with Archive(big) as r:
                assert sum(len(r.candidate_ids(s)) for s in r.shapes()) == args.records // 2

        def open_scan_elites() -> None:  # plus status counts and the top-10 elites of every shape
            with Archive(big) as r:
                for s in r.shapes():
                    r.status_counts(s)
                    r.elites(s, top=10)

        def open_decode_all() -> None:  # every record decoded into frozen objects
            with Archive(big) as r:
                for s in r.shapes():
                    r.evaluations(s)
                    r.candidates(s)

        def writer_open() -> None:  # a resuming writer: lock, scan, recover
            Archive(big, "w").close()

        for label, fn in [("open+scan (checksum + index)", open_scan), ("writer open (lock + scan + recover)", writer_open),
                          ("open+scan+status counts+top-10 elites", open_scan_elites),
                          *([] if args.skip_decode else [("open+decode everything", open_decode_all)])]:
            wall, cpu = timed(fn, args.repeat)
            print(f"{label:40s}: {wall:6.2f} s wall, {cpu:6.2f} s CPU for {args.records} records")
        if args.commands:
            for label, argv in (("evo inspect DIR --json", ["inspect", str(big), "--json"]),
                                ("evo report DIR --out OUT", ["report", str(big), "--out", str(scratch / "report")])):
                cpus: list[float] = []
                wall, _ = timed(lambda: cpus.append(_evo(argv)), args.repeat)
                print(f"{label:40s}: {wall:6.2f} s wall, {min(cpus):6.2f} s CPU (a subprocess: interpreter start included)")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
