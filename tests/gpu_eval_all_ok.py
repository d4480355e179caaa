"""One GPU check shared by template tests: candidates through the real evaluator, every one ``ok``."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from populations import Candidate


def assert_all_ok(cands: Sequence[Candidate], log_dir: Path) -> None:
    """Evaluate ``cands`` in a :class:`evaluators.LocalPool` (device timer only) and fail with every
    candidate whose status is not ``ok``: its shape, knobs, status and message."""
    from evaluators import LocalPool
    from populations import Status

    with LocalPool(compile_workers=4, timers=("device",), log_dir=str(log_dir)) as pool:
        evals = pool.evaluate(list(cands))
    bad = [(c.template, str(c.shapes[0]), c.knobs, e.status.value, e.message[:300])
           for c, e in zip(cands, evals) if e.status is not Status.OK]
    assert not bad, bad
