"""The engine on the real LocalPool: real NVRTC compiles of template candidates, real worker
processes; only the GPU handler inside the worker is the test double ``fake_gpu_worker`` (no GPU here)."""
from __future__ import annotations

from pathlib import Path

import pytest

from evo.cli._orchestrate import expand_operators, make_operators
from evo.search._config import merge
from evo.search._engine import Engine
from evo.search._progress import EVENTS_FILE, EventLog, read_events
from populations import Shape, Status, load_templates
from populations import Archive

pytest.importorskip("evaluators.compile._compile")
from evaluators import LocalPool  # noqa: E402


def test_engine_drives_the_local_pool(tmp_path: Path) -> None:
    shape = Shape.parse("64x64x64")
    cfg = merge({}, {"shapes": [str(shape)], "archive": str(tmp_path / "a"), "operators": "knob",
                     "progress": "none", "max_evals": 4, "pool": {"compile_workers": 2}})
    cfg.operators = expand_operators(cfg.operators)
    deadlines = {"startup": 30.0, "probe": 10.0, "load": 5.0, "correctness": 5.0, "timing": 5.0}
    with LocalPool(gpus=[0], compile_workers=2, target="fake_gpu_worker:make_handler", log_dir=str(tmp_path),
                   deadlines=deadlines, cache_dir=str(tmp_path / "cache"), arch="sm_90a") as pool, \
            Archive(tmp_path / "a", "w") as archive:
        events = EventLog(tmp_path / "a" / EVENTS_FILE)
        tiny = {"tiny": load_templates()["tiny"]}  # the quickest template to compile
        engine = Engine(cfg, archive, pool, make_operators(cfg.operators), tiny, events=events)
        result = engine.run()
        events.close()
        assert engine.max_inflight == 2 * 1 + 2
    assert result.reason == "evals" and result.evaluations == 4 and result.lost == 0
    with Archive(tmp_path / "a", "r") as ar:
        evs = ar.evaluations(shape)
    assert len(evs) == 4 and len({e.candidate_id for e in evs}) == 4
    compiled = [e for e in evs if e.status is Status.OK]
    assert compiled and all(e.compile_s > 0 for e in compiled), [(e.status, e.message[:200]) for e in evs]
    assert [e["event"] for e in read_events(tmp_path / "a" / EVENTS_FILE)].count("evaluation") == 4
