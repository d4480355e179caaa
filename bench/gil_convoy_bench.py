"""The GIL convoy in the LLM's held slices (issue 35): one decoding step of the real model through
the backend's held path (``ModelSteps._forward_rows``, one lease slice), alone and beside a thread
of the same process busy in Python, with the held slice's short switch interval
(``operators/llm/_gil.py``, as shipped) and with CPython's default 5 ms.

    python bench/gil_convoy_bench.py [--device cpu|cuda:0] [--steps 9] [--rounds 3] [--json OUT]

Conditions, interleaved round by round: ``alone``; ``spin`` (a thread in a pure-Python loop, as an
operator rendering proposals); ``half`` (busy 5 ms, asleep 5 ms). Prints the median step and the
held seconds a step (what a GPU run charges the model) per condition and interval. A measurement
script, not a test: its figures go to bench/RESULTS.md section 24.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.llm import _gil  # noqa: E402
from operators.llm._transformers import load_backend  # noqa: E402

#: The held slice's switch interval as shipped (the runs below set others and restore it).
SHIPPED = _gil.HELD_SWITCH_INTERVAL_S


def _busy(stop: threading.Event, duty: float) -> None:
    """Busy in Python for ``duty`` of every 10 ms (1.0: always)."""
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.01 * duty:
            pass
        if duty < 1.0:
            time.sleep(0.01 * (1.0 - duty))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=9, help="decoding steps per condition and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    for name in ("steps", "rounds", "prompt_tokens"):
        if getattr(args, name) < 1:
            print(f"gil_convoy_bench: --{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}",
                  file=sys.stderr)
            return 2
    backend = load_backend(device=args.device, threads=1)
    backend.count_gpu_s = True  # held seconds counted on the CPU too: what a GPU run charges
    try:
        return _run(backend, args)
    finally:
        del backend.count_gpu_s  # the backend is shared (load_backend caches it): leave it as it was
        _gil.HELD_SWITCH_INTERVAL_S = SHIPPED


def _run(backend: Any, args: argparse.Namespace) -> int:
    torch = backend.torch
    ids = backend.tokenizer("hello " * args.prompt_tokens).input_ids[:args.prompt_tokens]
    past0, _ = backend._forward_rows([ids], None)  # the prompt's cache, copied for every step

    def step() -> tuple[float, float]:
        past = copy.deepcopy(past0)
        held0 = backend.gpu_s
        t0 = time.perf_counter()
        backend._forward_rows([[ids[-1]]], past)
        return time.perf_counter() - t0, backend.gpu_s - held0

    conditions: dict[str, Optional[float]] = {"alone": None, "spin": 1.0, "half": 0.5}
    intervals = {"short (shipped)": SHIPPED, "default 5 ms": 0.005}
    samples: dict[str, list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for cond, duty in conditions.items():
            stop = threading.Event()
            th = threading.Thread(target=_busy, args=(stop, duty), daemon=True) if duty else None
            if th:
                th.start()
            for name, interval in intervals.items():
                _gil.HELD_SWITCH_INTERVAL_S = interval
                samples.setdefault(f"{cond} | {name}", []).extend(step() for _ in range(args.steps))
            _gil.HELD_SWITCH_INTERVAL_S = SHIPPED
            stop.set()
            if th:
                th.join()
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = {k: {"step_ms": statistics.median(s for s, _ in v) * 1e3, "held_ms": statistics.median(h for _, h in v) * 1e3,
                "n": len(v)} for k, v in samples.items()}
    print(f"{'condition | interval in the slice':40s} {'step ms':>9s} {'held ms':>9s}")
    for k, v in rows.items():
        print(f"{k:40s} {v['step_ms']:9.1f} {v['held_ms']:9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "torch": torch.__version__, "rows": rows,
                                         "shipped_interval_s": SHIPPED}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
