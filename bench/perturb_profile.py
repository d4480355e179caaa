"""Where the device timer's rounds go between timed replays (issue 36's throughput miss).

For each shape: the timing rotation the evaluator builds (:class:`TimingBuffers`, a 256-byte
workspace row per set), then

1. each piece of the perturbation between timed replays (:func:`_perturber`: the dense scramble,
   the hidden cancellation with the draws the harness makes once per candidate and, beside it,
   drawn per call on the host (7165b37 to this change) and on the device (before 7165b37), the
   poisoned C, the workspace refill, and the whole perturbation as the timer calls it) timed alone: host seconds to enqueue a call (no synchronisation) and GPU
   seconds a call (events around a batch);
2. the device timer itself over three cuBLAS arms (the "candidate" is torch.matmul TN, not
   cached, as a candidate's graph is not) with the real perturbation, with none, and with the
   perturbation's pieces left out one at a time: wall seconds of the timed rounds against the
   event seconds of the timed replays, and the rounds drawn;
3. a torch.profiler table of one timed loop with the perturbation (GPU kernels by total time).

``--busy N``: N processes spin on the host's cores throughout, as the compiler children do beside
the GPU worker in an evaluation (host work that waits for torch's CPU threads shows only then).

Run on the GPU machine: ``python3 bench/perturb_profile.py --shapes 4096x4096x4096,64x128x64
--busy 16 --out $OUT/perturb_profile.json``. A measurement script, not a test: its figures go to
bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from evaluators.correctness import workspace_fill  # noqa: E402
from evaluators.run._rotation import TimedSamples, TimingBuffers, WorkspaceRows, _perturber  # noqa: E402
from evaluators.run._timers import Arm, DeviceTiming, device_timer  # noqa: E402
from populations import Shape  # noqa: E402


def _timed(fn: Callable[[], None], n: int) -> dict[str, float]:
    """Host seconds to enqueue ``fn`` (mean of ``n``, no synchronisation between) and GPU seconds
    a call (events around the ``n`` calls)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n
    end.record()
    end.synchronize()
    return {"host_us": host * 1e6, "gpu_us": start.elapsed_time(end) * 1e3 / n}


def profile_shape(shape: Shape, n: int, seed: int) -> dict[str, Any]:
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    tb = TimingBuffers(shape, 0, l2, dev)
    rng = random.Random(seed)
    gen = torch.Generator(device=dev).manual_seed(seed)
    host = torch.Generator().manual_seed(seed)  # per-call draws on the host (7165b37 to the per-candidate draws)
    rows = WorkspaceRows(tb.n_sets, 0, dev, gen, workspace_fill(rng))
    tb.cc_all.fill_(float("nan"))
    out: dict[str, Any] = {"shape": str(shape), "n_sets": tb.n_sets}
    drawn = _perturber(tb, shape, rows.rows, rng)  # the harness's: draws made once per candidate
    pieces = {
        "scramble": lambda: tb.scramble(gen, rng, shape.layout),
        "embed": drawn.embed,
        "embed (host draws)": lambda: tb.embed(host, rng, shape),
        "embed (device draws)": lambda: tb.embed(gen, rng, shape),
        "poison": lambda: tb.poison_outputs(gen, rng, shape),
        "workspace_fill": lambda: rows.rows.fill_(workspace_fill(rng)),
        "perturb": _perturber(tb, shape, rows.rows, rng),
    }
    out["pieces"] = {name: _timed(fn, n) for name, fn in pieces.items()}
    tb.unflip()

    a, b_nk, b_kn, cb, cc = tb.a, tb.b_nk, tb.b_kn, tb.cb, tb.cc

    def arms() -> list[Arm]:
        return [Arm("candidate", lambda i: torch.matmul(a[i], b_nk[i].t(), out=cc[i]), tb.n_sets),
                Arm("torch.matmul NN", lambda i: torch.matmul(a[i], b_kn[i], out=cb[i]), tb.n_sets, cacheable=True),
                Arm("torch.matmul TN", lambda i: torch.matmul(a[i], b_nk[i].t(), out=cb[i]), tb.n_sets, cacheable=True)]

    def leave_out(piece: str) -> Callable[[], None]:
        def perturb() -> None:
            if piece != "scramble":
                tb.scramble(gen, rng, shape.layout)
            if piece != "embed" and rng.random() < 0.25:
                drawn.embed()
            if piece != "poison" and rng.random() < 0.25:
                tb.poison_outputs(gen, rng, shape)
            if piece != "workspace_fill":
                rows.rows.fill_(workspace_fill(rng))
        return perturb

    variants: dict[str, Any] = {"none": None, "perturb": _perturber(tb, shape, rows.rows, rng)}
    variants.update({f"without {p}": leave_out(p) for p in ("scramble", "embed", "poison", "workspace_fill")})
    loops = {}
    cache: dict = {}
    for name, perturb in variants.items():
        runs = []
        for _ in range(3):
            samples = TimedSamples(tb, shape, random.Random(rng.getrandbits(62)))
            st = device_timer(arms(), settings=DeviceTiming(), rng=rng, graph_cache=cache, perturb=perturb,
                              on_replay=samples.note if perturb is not None else None)
            c = st["candidate"]
            runs.append({"sample_ms": c.sample_s * 1e3, "events_ms": sum(s.events_s for s in st.values()) * 1e3,
                         "samples": c.samples, "median_us": c.median * 1e6,
                         "baseline_us": min(st["torch.matmul NN"].median, st["torch.matmul TN"].median) * 1e6})
            tb.unflip()
        loops[name] = runs
    out["loops"] = loops

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        device_timer(arms(), settings=DeviceTiming(), rng=rng, graph_cache=cache, perturb=variants["perturb"])
        torch.cuda.synchronize()
    tb.unflip()
    out["profiler"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    return out


def _spin() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x4096x4096,64x128x64")
    ap.add_argument("--n", type=int, default=100, help="calls per piece")
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--busy", type=int, default=0, help="processes spinning on the host's cores throughout")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("perturb_profile: needs a CUDA GPU", file=sys.stderr)
        return 2
    spinners = [multiprocessing.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    print(f"{args.busy} host processes spinning beside the timer")
    results = []
    for text in args.shapes.split(","):
        m, n, k = (int(x) for x in text.split("x"))
        res = profile_shape(Shape(m, n, k, "TN"), args.n, args.seed)
        res["busy"] = args.busy
        results.append(res)
        print(f"== {res['shape']} ({res['n_sets']} sets)")
        for name, p in res["pieces"].items():
            print(f"  {name:20s} host {p['host_us']:8.1f} us  gpu {p['gpu_us']:8.1f} us")
        for name, runs in res["loops"].items():
            print(f"  loop {name:22s} " + "  ".join(
                f"wall {r['sample_ms']:6.1f} ms gpu {r['events_ms']:6.1f} ms n={r['samples']}" for r in runs))
        print(res["profiler"])
    for p in spinners:
        p.terminate()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
