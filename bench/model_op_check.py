"""Device check of the native torch operators (evo.torch) over a small exported library.

    python bench/model_op_check.py --archive DIR --out OUT [--reps 300]
    python bench/model_op_check.py --library LIB --out OUT [--reps 300]

Steps, in one process: build and load ``torch.ops.evo_native`` (cached C++ build with the
compiler here); with ``--archive``, export it over one library with ``keep_slower`` (every
shape's best kernel, for timing the evolved path; the decision ``evo export`` would take by
default, :func:`evo.export._export.choose_path`, is printed beside it); with ``--library``, take an
export as it is (its shapes are exactly those whose library path is an evolved kernel); then
per shape

- correctness of ``evo_native.mm`` and ``evo_native.linear`` (with bias) against an fp32
  reference, eager, replayed from a CUDA graph, and compiled (``torch.compile``, inductor,
  fullgraph);
- host-inclusive time per call (``offline``: synchronize, one call, synchronize; the median over
  ``--reps`` calls, operands rotated over sets larger than 2x L2) and back-to-back time per call
  (``pipelined``: 50 calls queued, fewer for calls over 0.4 ms (~20 ms a round), then one
  synchronize; what eager decode pays per GEMM),
  arms interleaved in random order: ``torch.matmul(a, w.t())``, ``F.linear``, the native op on
  the evolved path (``op_mm``, ``op_linear``), the native op falling back to cuBLAS
  (``op_fallback``: the shape not in its table) and the older ctypes custom op
  ``torch.ops.evo.hgemm`` (``ctypes_op``).

Writes ``op_check.json`` (with a ``summary``: per path the default export takes, the geomean and
minimum of ``op_linear`` vs ``torch.matmul``, and of ``op_fallback`` on the cuBLAS-path shapes)
and prints a table. With ``--max-seconds`` no new shape starts after that many seconds; shapes
are taken smallest first within each FLOP decade, round-robin over the decades, so a cap cuts
every decade a little rather than the largest shapes whole. Exit 1 when a correctness check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

L2_BYTES = 60 * 2**20


def _sets(nbytes: int) -> int:
    return max(2, min(64, -(-2 * L2_BYTES // max(nbytes, 1)) + 1))


def _offline(fn: Callable[[int], Any], n_sets: int, reps: int) -> float:
    import torch

    times = []
    for i in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(i % n_sets)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


#: A pipelined round queues about this many seconds of calls (50 calls at most, 3 at least): the
#: host's share, what the round measures, is gone long before a millisecond GEMM's 50th call, and
#: 50 such calls a round made a 16384x8192x16384 shape take 32 s of the op check's time.
PIPELINED_ROUND_S = 0.02


def _pipelined(fn: Callable[[int], Any], n_sets: int, reps: int, call_s: float = 0.0) -> float:
    """Seconds per call with calls queued back to back (rounds of up to 50, then one synchronize);
    ``call_s`` (one call's offline time) shortens the rounds of long calls."""
    import torch

    per = max(3, min(50, int(PIPELINED_ROUND_S / call_s))) if call_s > 0 else 50
    out = []
    for r in range(max(3, reps // 50)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(per):
            fn(i % n_sets)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / per)
    return statistics.median(out)


def check_shape(key: tuple[int, int, int, str], lib: Any, reps: int, compile_check: bool) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from evo.torch._ops import register

    m, n, k, layout = key
    ops = torch.ops.evo_native
    res: dict[str, Any] = {"shape": f"{m}x{n}x{k}:{layout}"}
    n_sets = _sets(2 * (m * k + n * k + m * n))
    A = [torch.randn(m, k, device="cuda", dtype=torch.half) for _ in range(n_sets)]
    W = [torch.randn(n, k, device="cuda", dtype=torch.half) for _ in range(n_sets)]
    bias = torch.randn(n, device="cuda", dtype=torch.half)
    res["sets"] = n_sets
    ref = torch.matmul(A[0].float(), W[0].t().float())
    tol = 1e-2 * ref.abs().max().item() + 1e-2
    err = lambda got: (got.float() - ref).abs().max().item()  # noqa: E731
    checks = {"mm": err(ops.mm(A[0], W[0].t())), "linear_bias": err(ops.linear(A[0], W[0], bias) - bias)}
    static = torch.empty(m, n, device="cuda", dtype=torch.half)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static.copy_(ops.linear(A[0], W[0], None))
    static.zero_()
    g.replay()
    torch.cuda.synchronize()
    checks["cuda_graph"] = err(static)
    if compile_check:
        f = torch.compile(lambda x, w: ops.linear(x, w, None) * 1.0, fullgraph=True)
        checks["compiled"] = err(f(A[0], W[0]))
    res["max_error"] = checks
    res["tolerance"] = tol
    res["correct"] = all(v <= tol for v in checks.values())
    arms: dict[str, Callable[[int], Any]] = {
        "torch_matmul": lambda i: torch.matmul(A[i], W[i].t()),
        "F_linear": lambda i: F.linear(A[i], W[i]),
        "op_mm": lambda i: ops.mm(A[i], W[i].t()),
        "op_linear": lambda i: ops.linear(A[i], W[i], None),
        "ctypes_op": lambda i: torch.ops.evo.hgemm(A[i], W[i].t()),
    }
    offline: dict[str, list[float]] = {a: [] for a in [*arms, "op_fallback"]}
    piped: dict[str, list[float]] = {a: [] for a in offline}
    for fn in arms.values():  # warm-up (first launches set smem attributes, load modules)
        fn(0)
    rounds = 5
    for _ in range(rounds):
        names = list(offline)
        random.shuffle(names)
        for name in names:
            if name == "op_fallback":
                ops.clear_kernels()
                fn = arms["op_linear"]
            else:
                fn = arms[name]
            offline[name].append(_offline(fn, n_sets, reps // rounds))
            piped[name].append(_pipelined(fn, n_sets, reps // rounds, offline[name][-1]))
            if name == "op_fallback":
                register(lib)
    res["offline_us"] = {a: statistics.median(v) * 1e6 for a, v in offline.items()}
    res["pipelined_us"] = {a: statistics.median(v) * 1e6 for a, v in piped.items()}
    base = res["offline_us"]["torch_matmul"]
    res["offline_vs_matmul"] = {a: base / v for a, v in res["offline_us"].items()}
    base = res["pipelined_us"]["torch_matmul"]
    res["pipelined_vs_matmul"] = {a: base / v for a, v in res["pipelined_us"].items()}
    return res


def _order(keys: list[tuple[int, int, int, str]]) -> list[tuple[int, int, int, str]]:
    """Round-robin over FLOP decades (log10 of 2MNK), smallest first within each."""
    import math

    decades: dict[int, list[tuple[int, int, int, str]]] = {}
    for k in sorted(keys, key=lambda k: (k[0] * k[1] * k[2], k)):
        decades.setdefault(int(math.log10(2 * k[0] * k[1] * k[2])), []).append(k)
    out, queues = [], [decades[d] for d in sorted(decades)]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per default export path: shapes, geomean and min of op_linear / torch.matmul (offline and
    pipelined); on cuBLAS-path shapes also op_fallback's (what the op costs when it falls back)."""
    import math

    def stats(vals: list[float]) -> dict[str, Any]:
        if not vals:
            return {"n": 0}
        return {"n": len(vals), "geomean": math.exp(sum(map(math.log, vals)) / len(vals)), "min": min(vals),
                "at_least_1": sum(v >= 1.0 for v in vals)}

    out: dict[str, Any] = {}
    for path in sorted({r["default_path"][0] for r in results}):
        rows = [r for r in results if r["default_path"][0] == path]
        arm = "op_linear" if path != "cublas" else "op_fallback"
        out[path] = {"arm": arm,
                     "offline": stats([r["offline_vs_matmul"][arm] for r in rows]),
                     "pipelined": stats([r["pipelined_vs_matmul"][arm] for r in rows]),
                     "op_linear_offline": stats([r["offline_vs_matmul"]["op_linear"] for r in rows])}
    return out


def _library(args: argparse.Namespace) -> tuple[Any, dict[str, tuple[str, str]]]:
    """(the library to time, shape -> (path the default export takes, why))."""
    from evo.export._export import _pick, choose_path, export, load_library
    from populations import Archive

    if args.library is not None:
        manifest = json.loads((args.library / "manifest.json").read_text())
        return load_library(args.library), {k: (v["path"], v["why"]) for k, v in manifest.get("paths", {}).items()}
    t0 = time.monotonic()
    manifest = export(args.archive, args.work / "lib", keep_slower=True)
    print(f"exported {len(manifest.kernels)} kernels (keep_slower) in {time.monotonic() - t0:.1f} s", flush=True)
    archive = Archive(args.archive, "r")
    decisions = {}
    for shape in archive.shapes():
        decisions[str(shape)] = choose_path(*_pick(archive, shape, manifest.arch))
        print(f"  default export: {shape}: {decisions[str(shape)][0]} ({decisions[str(shape)][1]})", flush=True)
    return load_library(args.work / "lib"), decisions


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--archive", type=Path, help="an archive: exported here with keep_slower")
    src.add_argument("--library", type=Path, help="an export (evo export ARCHIVE --out LIB), timed as it is")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--work", type=Path, default=Path("/tmp/evo_op_check"))
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile check")
    p.add_argument("--max-seconds", type=float, default=0.0, help="start no new shape after this (0: no cap)")
    p.add_argument("--after", type=Path, default=None,
                   help="an earlier op_check.json of the same archive: its shapes are not timed again, and its "
                        "rows (marked 'earlier') join this run's summary, so a check cut by --max-seconds can go on "
                        "in a second call")
    args = p.parse_args()
    earlier: list[dict[str, Any]] = []
    if args.after is not None:
        try:
            earlier = [dict(r, earlier=str(args.after)) for r in json.loads(args.after.read_text())["shapes"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"model_op_check: cannot read --after {args.after}: {exc}", file=sys.stderr)
            return 2
    done = {r["shape"] for r in earlier}
    import torch

    from evo.torch._ops import load_ops, register

    t0 = time.monotonic()
    so = load_ops()
    print(f"native ops: {so} (has_cuda={torch.ops.evo_native.has_cuda()}) in {time.monotonic() - t0:.1f} s", flush=True)
    lib, decisions = _library(args)
    if not lib.active:
        print(f"library not usable here: {lib.reason}")
        return 1
    print(f"registered {register(lib)} kernels", flush=True)
    results = []
    in_library = [k for k in lib.kernels if k[3] == "TN"]  # nn.Linear's layout: what the op and the patcher serve
    tn = [k for k in in_library if f"{k[0]}x{k[1]}x{k[2]}:{k[3]}" not in done]
    if earlier:
        print(f"--after {args.after}: {len(earlier)} shapes timed earlier, {len(tn)} left", flush=True)
    start = time.monotonic()
    for i, key in enumerate(_order(tn)):
        if args.max_seconds and time.monotonic() - start > args.max_seconds:
            print(f"--max-seconds {args.max_seconds:g}: {len(tn) - i} of {len(tn)} shapes not timed", flush=True)
            break
        t0 = time.monotonic()
        r = check_shape(key, lib, args.reps, compile_check=not args.no_compile and i == 0)
        r["default_path"] = decisions.get(f"{key[0]}x{key[1]}x{key[2]}:{key[3]}:f32", ("?", ""))
        r["kernel_device_speedup"] = lib.kernels[key].fitness
        results.append(r)
        o, q = r["offline_us"], r["pipelined_us"]
        print(f"{r['shape']:>20} ok={r['correct']} dev={r['kernel_device_speedup']:.3f}x  offline us: "
              + " ".join(f"{a}={v:.1f}" for a, v in o.items()) + "  | pipelined us: "
              + " ".join(f"{a}={v:.1f}" for a, v in q.items()) + f"  ({time.monotonic() - t0:.0f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
           "reps": args.reps, "library": str(args.library or args.work / "lib"), "shapes_in_library": len(in_library),
           "summary": summarize(results + earlier), "shapes": results + earlier}
    for path, st in doc["summary"].items():
        o = st["offline"]
        if o["n"]:
            print(f"summary: {o['n']} shapes on the {path} path: {st['arm']} vs torch.matmul offline geomean "
                  f"{o['geomean']:.3f}x, min {o['min']:.3f}x, {o['at_least_1']} at >= 1.0x; pipelined geomean "
                  f"{st['pipelined']['geomean']:.3f}x", flush=True)
    (args.out / "op_check.json").write_text(json.dumps(doc, indent=1))
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
