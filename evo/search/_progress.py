"""What a run tells the world: a JSON-lines event log beside the archive, and live progress.

The event log (``<archive>/events.jsonl``) gets one line per event, each a JSON object with at
least ``t`` (Unix time), ``event`` and ``shape`` (the shape string, or null for run-wide events):
``start``, ``proposal``, ``evaluation``, ``new_best``, ``converged``, ``budget_stop``,
``interrupt`` and ``stop``. Lines are flushed as they are written, so ``tail -f`` works and a
killed run leaves every line but possibly a torn last one (readers skip a line that does not parse).

Progress shows, per shape, the best speedup, evaluations per minute, GPU seconds and status
counts, and the GPU busy fraction of the run (GPU seconds over elapsed time x GPUs): a rich live
table on a terminal, else a plain line per shape every few seconds.
"""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TextIO

from populations import Shape

__all__ = ["EventLog", "ShapeStats", "Progress", "read_events"]

EVENTS_FILE = "events.jsonl"


class EventLog:
    """Append-only JSON-lines log; one line per event, flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: Optional[TextIO] = open(self.path, "a", encoding="utf-8")

    def emit(self, event: str, shape: Optional[Shape] = None, **fields: Any) -> dict[str, Any]:
        record = {"t": round(time.time(), 6), "event": event, "shape": str(shape) if shape is not None else None}
        record.update(fields)
        if self._fh is not None:
            self._fh.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
            self._fh.flush()
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete line of an event log (a torn last line is skipped)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


@dataclass
class ShapeStats:
    """Running numbers of one shape in this run (plus the best carried over from the archive)."""

    shape: Shape
    best: Optional[float] = None
    evals: int = 0
    gpu_s: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    converged: bool = False


class Progress:
    """Live progress: ``mode`` is ``rich`` (a live table), ``plain`` (periodic lines) or ``none``."""

    def __init__(self, shapes: list[Shape], gpus: int, mode: str = "auto", interval_s: float = 5.0,
                 stream: Optional[TextIO] = None) -> None:
        self.stream = stream or sys.stdout
        if mode == "auto":
            mode = "rich" if self.stream.isatty() else "plain"
        self.mode = mode
        self.gpus = max(1, gpus)
        self.interval_s = interval_s
        self.stats = {s: ShapeStats(s) for s in shapes}
        self.started = time.monotonic()
        self._last_line = self.started
        self._live: Any = None

    # -- life cycle ----------------------------------------------------------------------------
    def __enter__(self) -> "Progress":
        if self.mode == "rich":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(file=self.stream), refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(*exc)
            self._live = None
        elif self.mode == "plain":
            self._print_lines()

    # -- updates -------------------------------------------------------------------------------
    def update(self) -> None:
        """Refresh the display (rich) or print when the interval has passed (plain)."""
        if self._live is not None:
            self._live.update(self._table())
        elif self.mode == "plain" and time.monotonic() - self._last_line >= self.interval_s:
            self._print_lines()

    def message(self, text: str) -> None:
        """A one-off line (a new best, a stop) above the live table or in the plain stream."""
        if self._live is not None:
            self._live.console.print(text)
        elif self.mode != "none":
            print(text, file=self.stream, flush=True)

    # -- rendering -----------------------------------------------------------------------------
    def busy(self) -> float:
        """Fraction of GPU time (all GPUs) spent in correctness and timing since the start."""
        elapsed = max(1e-9, time.monotonic() - self.started)
        return min(1.0, sum(s.gpu_s for s in self.stats.values()) / (elapsed * self.gpus))

    def rows(self) -> list[dict[str, Any]]:
        minutes = max(1e-9, (time.monotonic() - self.started) / 60.0)
        return [{"shape": str(s.shape), "best": s.best, "evals": s.evals, "per_min": s.evals / minutes,
                 "gpu_s": s.gpu_s, "statuses": dict(sorted(s.statuses.items())), "converged": s.converged}
                for s in self.stats.values()]

    def _print_lines(self) -> None:
        self._last_line = time.monotonic()
        elapsed = self._last_line - self.started
        for r in self.rows():
            best = f"{r['best']:.3f}x" if r["best"] is not None else "-"
            counts = " ".join(f"{k}={v}" for k, v in r["statuses"].items()) or "-"
            done = " converged" if r["converged"] else ""
            print(f"[evo {elapsed:7.1f}s] {r['shape']} best={best} evals={r['evals']} ({r['per_min']:.1f}/min) "
                  f"{counts} gpu_s={r['gpu_s']:.1f} gpu_busy={self.busy():.0%}{done}", file=self.stream, flush=True)

    def _table(self) -> Any:
        from rich.table import Table

        elapsed = time.monotonic() - self.started
        table = Table(title=f"evo run: {elapsed:.0f}s, GPU busy {self.busy():.0%}")
        for col in ("shape", "best speedup", "evals", "evals/min", "GPU s", "statuses", ""):
            table.add_column(col)
        for r in self.rows():
            best = f"{r['best']:.3f}x" if r["best"] is not None else "-"
            counts = " ".join(f"{k}={v}" for k, v in r["statuses"].items())
            table.add_row(r["shape"], best, str(r["evals"]), f"{r['per_min']:.1f}", f"{r['gpu_s']:.1f}", counts,
                          "converged" if r["converged"] else "")
        return table
