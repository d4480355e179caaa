"""The red-team corpus on a GPU (issue 5): every hostile case, twice, through the real LocalPool
interleaved with the honest control kernel; each must get its expected status (or an accepted
alternative), the pool must still evaluate the control afterwards, and the control's device
time must stay within 2% of its time before the corpus.

A case whose data file names a ``hole`` (a confirmed gap in the evaluator) is an xfail; an XPASS
means the evaluator closed the gap and the ``hole`` line should go (not strict: far stores fault
or not depending on what the allocator mapped there).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hostile_corpus import load_corpus

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
CASES = load_corpus()


def _redteam():
    spec = importlib.util.spec_from_file_location("redteam", ROOT / "bench" / "redteam.py")
    module = importlib.util.module_from_spec(spec)
    # dataclasses with string annotations look their module up in sys.modules (Python 3.12)
    sys.modules.setdefault("redteam", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    redteam = _redteam()
    res = redteam.run_redteam(rounds=2, log_dir=str(tmp_path_factory.mktemp("redteam-logs")))
    print(redteam.table(res))
    return res


def test_pool_alive_and_control_timing_held(run: dict) -> None:
    assert run["alive"], run["control"]
    assert all(s == "ok" for s in run["control"]["statuses"]), run["control"]
    drift = run["control"]["drift"]
    assert drift is not None and abs(drift) <= 0.02, run["control"]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(reason=c.hole, strict=False)]
                                               if c.hole else []) for c in CASES])
def test_case_is_caught_in_every_round(case, run: dict) -> None:
    rows = [r for r in run["rows"] if r.name == case.name]
    assert len(rows) == 2, rows
    for r in rows:
        assert r.caught, f"{case.name} round {r.round}: expected {case.expected.value}, got {r.got}: {r.message[:300]}"
