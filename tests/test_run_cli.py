"""``evo run`` as a user runs it: real subprocesses, real signals, the archive read back after.

The evaluator pool is the test double ``fake_pool.FakeEvaluatorPool``, given to ``evo run``
through the library (``python -m fake_evo run ...`` in a child, ``main(argv, pool_factory=...)``
in this process: no command-line flag exists for it); ``EVO_FAKE_DELAY_S`` slows its evaluations
down so that signals land while work is in flight.
"""
from __future__ import annotations

import io
import os
import socket
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from fake_pool import FakeEvaluatorPool
from evo.cli import main
from evo.search._progress import EVENTS_FILE, Progress, read_events
from populations import Shape
from populations import Archive

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ["--shape", "4096x4096x4096", "--shape", "64x128x64"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _start(archive: Path, *args: str, **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fake_evo", "run", *SHAPES, "--archive", str(archive),
           "--progress", "plain", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(archive: Path) -> list[dict[str, Any]]:
    path = archive / EVENTS_FILE
    return read_events(path) if path.exists() else []


def _wait_for(pred: Callable[[], bool], proc: subprocess.Popen, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"evo run exited early ({proc.returncode}): {proc.stderr.read()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("timed out waiting for evo run")


def _count(archive: Path, event: str) -> int:
    return sum(e["event"] == event for e in _events(archive))


def _archived(archive: Path) -> dict[Shape, tuple[list[str], list[str]]]:
    """shape -> (candidate ids, evaluated candidate ids), read as a reader would."""
    with Archive(archive, "r") as ar:
        return {s: (ar.candidate_ids(s), [e.candidate_id for e in ar.evaluations(s)]) for s in ar.shapes()}


# -- whole runs --------------------------------------------------------------------------------
def test_run_to_budget_prints_plain_progress(tmp_path: Path) -> None:
    proc = _start(tmp_path / "a", "--max-evals", "20")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "[evo" in out and "best=" in out and "gpu_busy=" in out  # plain lines: stdout is no terminal
    assert "stopped (evals) after 20 evaluation(s)" in out
    assert sum(len(ev) for _, ev in _archived(tmp_path / "a").values()) == 20


def test_config_file_with_flag_override(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(
        'shapes = ["256x256x256"]\narchive = "arch"\nmax_evals = 50\nseed = 7\n'
        'operators = { knob_mutation = 2, knob_random = 1 }\n'
        '[selection]\nmethod = "power"\npower_alpha = 2.0\n[pool]\nmax_inflight = 3\n')
    cmd = [sys.executable, "-m", "fake_evo", "run", "--config", str(tmp_path / "run.toml"), "--max-evals", "7",
           "--progress", "none"]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    archive = tmp_path / "arch"  # relative to the config file, not the working directory
    start = next(e for e in _events(archive) if e["event"] == "start")
    assert start["shapes"] == ["256x256x256:TN:f32"] and start["seed"] == 7 and start["inflight"] == 3
    assert start["operators"] == {"knob_mutation": 2.0, "knob_random": 1.0}
    assert start["limits"]["evals"] == 7  # the flag won over the file's 50
    assert sum(len(ev) for _, ev in _archived(archive).values()) == 7


# -- signals ---------------------------------------------------------------------------------------
def test_sigint_finishes_in_flight_work_then_commits(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    proc = _start(archive, "--budget", "60s", "--max-inflight", "4", EVO_FAKE_DELAY_S="0.3")
    _wait_for(lambda: _count(archive, "evaluation") >= 4, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    events = _events(archive)
    stop = events[-1]
    assert stop["event"] == "stop" and stop["reason"] == "interrupted" and stop["lost"] == 0
    interrupt = next(e for e in events if e["event"] == "interrupt")
    after = events[events.index(interrupt):]
    assert not [e for e in after if e["event"] == "proposal"]  # nothing new after the press
    assert sum(e["event"] == "evaluation" for e in after) == interrupt["inflight"] > 0
    for cands, evaluated in _archived(archive).values():  # every submitted candidate has its result
        assert sorted(cands) == sorted(evaluated)


def test_second_sigint_abandons_in_flight_work_and_resume_recovers_it(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    proc = _start(archive, "--budget", "60s", "--max-inflight", "4", EVO_FAKE_DELAY_S="30")
    _wait_for(lambda: _count(archive, "proposal") >= 4, proc)
    proc.send_signal(signal.SIGINT)
    _wait_for(lambda: _count(archive, "interrupt") == 1, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 10  # did not wait for the 30 s evaluations
    stop = _events(archive)[-1]
    assert stop["event"] == "stop" and stop["reason"] == "abandoned" and stop["lost"] == 4
    orphans = {c for cands, _ in _archived(archive).values() for c in cands}
    assert len(orphans) == 4  # committed, unevaluated: the archive stays consistent
    done = subprocess.run([sys.executable, "-m", "fake_evo", "run", *SHAPES, "--archive", str(archive),
                           "--progress", "none", "--max-evals", "6"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    resumed = {e["candidate"] for e in _events(archive) if e["event"] == "proposal" and e["operator"] == "archived"}
    assert resumed == orphans


def test_first_sigint_waits_at_most_the_drain_deadline(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    (tmp_path / "run.toml").write_text("[pool]\ndrain_s = 1.0\nmax_inflight = 3\n")
    proc = _start(archive, "--config", str(tmp_path / "run.toml"), "--budget", "60s", EVO_FAKE_DELAY_S="30")
    _wait_for(lambda: _count(archive, "proposal") >= 3, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert 1.0 <= time.monotonic() - t0 < 10
    events = _events(archive)
    abandon = next(e for e in events if e["event"] == "abandon")
    assert abandon["reason"] == "interrupted" and abandon["lost"] == 3
    assert events[-1]["reason"] == "interrupted" and events[-1]["lost"] == 3


def test_sigkill_loses_at_most_the_in_flight_work_and_resume_continues(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    proc = _start(archive, "--budget", "60s", "--max-inflight", "6", EVO_FAKE_DELAY_S="0.05")
    _wait_for(lambda: _count(archive, "evaluation") >= 20, proc)
    proc.kill()
    proc.communicate(timeout=10)
    proposed = {e["candidate"] for e in _events(archive) if e["event"] == "proposal"}
    state = _archived(archive)  # readable after the kill
    evaluated = {c for _, ev in state.values() for c in ev}
    assert evaluated <= proposed and len(proposed - evaluated) <= 6
    before = sum(len(ev) for _, ev in state.values())
    assert before >= 14
    done = subprocess.run([sys.executable, "-m", "fake_evo", "run", *SHAPES, "--archive", str(archive),
                           "--progress", "none", "--max-evals", "10"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    after = _archived(archive)
    assert sum(len(ev) for _, ev in after.values()) == before + 10  # counts add up
    for _, ev in after.values():
        assert max(Counter(ev).values()) == 1  # no candidate evaluated twice at a shape


# -- bad input -------------------------------------------------------------------------------------
BAD = [
    (["--shape", "12x", "--archive", "{a}"], "cannot parse shape"),
    (["--shape", "0x8x8", "--archive", "{a}"], "must be >= 1"),
    (["--shape", "64x64x64", "--archive", "{a}", "--budget", "20q"], "cannot read duration"),
    (["--shape", "64x64x64", "--archive", "{a}", "--budget", "0s"], "must be positive"),
    (["--shape", "64x64x64", "--archive", "{a}", "--operators", "nope"], "unknown operator 'nope'"),
    (["--shape", "64x64x64", "--archive", "{a}", "--operators", "knob:-1"], "must be positive"),
    (["--shape", "64x64x64"], "--archive"),
    (["--archive", "{a}"], "at least one --shape"),
    (["--shape", "64x64x64", "--archive", "{a}", "--max-evals", "0"], "max_evals"),
    (["--shape", "64x64x64", "--shape", "64x64x64:TN", "--archive", "{a}"], "listed twice"),
    (["--shape", "64x64x64", "--archive", "{a}", "--gpus", "0,x"], "--gpus"),
    (["--shape", "64x64x64", "--archive", "{a}", "--config", "{d}/missing.toml"], "does not exist"),
    (["--config", "{d}/bad.toml"], "unknown key(s) ['budgett']"),
    (["--config", "{d}/badsel.toml"], "selection.method"),
    (["--config", "{d}/broken.toml"], "not readable TOML"),
    (["--shape", "64x64x64", "--archive", "{d}/notarchive"], "not an evo archive"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str],
                                                message: str) -> None:
    (tmp_path / "bad.toml").write_text('shapes = ["64x64x64"]\narchive = "a"\nbudgett = "1m"\n')
    (tmp_path / "badsel.toml").write_text('shapes = ["64x64x64"]\narchive = "a"\n[selection]\nmethod = "roulette"\n')
    (tmp_path / "broken.toml").write_text('shapes = [\n')
    (tmp_path / "notarchive").mkdir()
    (tmp_path / "notarchive" / "data.txt").write_text("mine")
    argv = [a.format(a=tmp_path / "arch", d=tmp_path) for a in argv]
    try:
        rc = main(["run", *argv], pool_factory=FakeEvaluatorPool)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err


def test_a_second_writer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with Archive(tmp_path / "a", "w"):
        rc = main(["run", "--shape", "64x64x64", "--archive", str(tmp_path / "a")], pool_factory=FakeEvaluatorPool)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    # the holder (pid, host, since when) and what to do
    assert f"pid {os.getpid()} on {socket.gethostname()} since 20" in err and "wait for it" in err


def test_budget_strings() -> None:
    from evo.search._config import ConfigError, parse_duration

    assert parse_duration("20m") == 1200 and parse_duration("1h30m") == 5400 and parse_duration("90s") == 90
    assert parse_duration("1.5h") == 5400 and parse_duration("250ms") == 0.25 and parse_duration("45") == 45
    for bad in ("", "m", "20q", "1h x", "-5m", "0", "1m1"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_rich_progress_renders_a_table() -> None:
    buf = io.StringIO()
    shape = Shape.parse("64x128x64")
    with Progress([shape], gpus=1, mode="rich", stream=buf) as progress:
        progress.stats[shape].best = 1.25
        progress.stats[shape].evals = 3
        progress.stats[shape].statuses["ok"] = 3
        progress.update()
    text = buf.getvalue()
    assert "64x128x64:TN:f32" in text and "1.250x" in text and "ok=3" in text


def test_evo_seed_then_evo_run_evaluates_the_seeded_population(tmp_path: Path) -> None:
    archive = str(tmp_path / "a")
    assert main(["seed", "--shape", "64x64x64", "--archive", archive, "--per-template", "2"]) == 0
    with Archive(archive, "r") as ar:
        seeded = set(ar.candidate_ids("64x64x64"))
    assert seeded
    rc = main(["run", "--shape", "64x64x64", "--archive", archive, "--progress", "none",
               "--max-evals", str(len(seeded))], pool_factory=FakeEvaluatorPool)
    assert rc == 0
    proposals = [e for e in _events(tmp_path / "a") if e["event"] == "proposal"]
    assert {e["candidate"] for e in proposals} == seeded and {e["operator"] for e in proposals} == {"archived"}


def test_pool_loader_is_checked_and_reaches_the_workers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``pool.loader`` picks how GPU workers launch kernels; a name that is neither loader is a
    config error (exit 2), and the chosen one is handed to the pool's workers."""
    (tmp_path / "run.toml").write_text('shapes = ["64x64x64"]\narchive = "a"\n[pool]\nloader = "opencl"\n')
    assert main(["run", "--config", str(tmp_path / "run.toml")], pool_factory=FakeEvaluatorPool) == 2
    assert "pool.loader: one of driver, pycuda, got 'opencl'" in capsys.readouterr().err
    from evaluators import POOLS
    from evo.cli._orchestrate import make_pool
    from evo.search._config import PoolConfig

    seen = {}

    class Recording:  # test double of LocalPool: the real one needs a GPU
        def __init__(self, **kw):
            seen.update(kw)
    real = POOLS.get("local")
    POOLS.register("local", Recording, replace=True)  # the pool registry is where evo run finds its pool
    try:
        make_pool(PoolConfig(loader="pycuda"))
    finally:
        POOLS.register("local", real, replace=True)
    assert seen["worker_options"] == {"loader": "pycuda"}


def test_a_pool_that_cannot_start_is_one_line_and_leaves_no_archive(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    def broken(config):  # type: ignore[no-untyped-def]
        raise OSError("no worker could start (test double)")

    rc = main(["run", "--shape", "64x64x64", "--archive", str(tmp_path / "a")], pool_factory=broken)
    err = capsys.readouterr().err
    assert rc == 2 and "cannot start the evaluator pool: OSError: no worker could start" in err
    assert err.count("\n") == 1 and not (tmp_path / "a").exists()
