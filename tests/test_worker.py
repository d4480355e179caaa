"""The GPU worker supervisor on CPU: real processes, a fake handler that crashes on demand."""
from __future__ import annotations

import os
import signal
import time

import pytest

from evaluators.run._worker import WorkerSupervisor, WorkerUnavailable

FAKE = "fake_gpu_worker:make_handler"


def supervisor(tmp_path, **kw) -> WorkerSupervisor:
    deadlines = {"startup": 30.0, "probe": 10.0, "load": 5.0, "correctness": 1.5, "timing": 5.0}
    deadlines.update(kw.pop("deadlines", {}))
    return WorkerSupervisor(gpu=None, target=FAKE, log_dir=str(tmp_path), deadlines=deadlines, **kw)


def test_ok_job_and_stdout_goes_to_the_log(tmp_path, capfd):
    with supervisor(tmp_path) as sup:
        assert sup.probes_passed == 1
        res = sup.run({"fake": "print", "phase": "load"})
        assert res["status"] == "ok"
        assert res["pid"] == sup.pid
    out, err = capfd.readouterr()
    assert "FAKE-WORKER" not in out + err
    log = open(sup.log_path).read()
    assert "FAKE-WORKER-STDOUT" in log and "FAKE-WORKER-STDERR" in log


def test_segfault_is_runtime_error_then_restart_probe_and_next_job_succeeds(tmp_path):
    with supervisor(tmp_path) as sup:
        first = sup.pid
        res = sup.run({"fake": "segv", "phase": "correctness"})
        assert res["status"] == "runtime_error"
        assert "SIGSEGV" in res["message"] and "correctness" in res["message"]
        assert sup.restarts == 1 and sup.probes_passed == 2 and sup.pid != first
        assert sup.run({"fake": "ok"})["status"] == "ok"


def test_hang_is_timeout_with_the_phase_and_the_pool_recovers(tmp_path):
    with supervisor(tmp_path) as sup:
        t0 = time.monotonic()
        res = sup.run({"fake": "hang", "phase": "correctness"})
        took = time.monotonic() - t0
        assert res["status"] == "timeout" and "correctness" in res["message"]
        assert 1.4 < took < 15
        assert sup.restarts == 1
        assert sup.run({"fake": "ok"})["status"] == "ok"


def test_per_phase_deadlines_are_separate(tmp_path):
    # timing may take 5 s, correctness only 1.5 s: a hang in timing is cut at ~5 s, not 1.5 s.
    with supervisor(tmp_path, deadlines={"timing": 3.0}) as sup:
        t0 = time.monotonic()
        res = sup.run({"fake": "hang", "phase": "timing"})
        assert res["status"] == "timeout" and "timing" in res["message"]
        assert time.monotonic() - t0 > 2.9


def test_exit_code_and_fatal_cuda_error_restart(tmp_path):
    with supervisor(tmp_path) as sup:
        res = sup.run({"fake": "exit", "code": 3, "phase": "load"})
        assert res["status"] == "runtime_error" and "code 3" in res["message"]
        res = sup.run({"fake": "fatal"})
        assert res["status"] == "runtime_error" and "ILLEGAL_ADDRESS" in res["message"]
        assert sup.restarts == 2
        assert sup.run({"fake": "ok"})["status"] == "ok"


def test_group_kill_ends_grandchildren(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    with supervisor(tmp_path) as sup:
        res = sup.run({"fake": "grandchild", "phase": "correctness", "pidfile": str(pidfile)})
        assert res["status"] == "timeout"
        gpid = int(pidfile.read_text())
        for _ in range(50):  # reaped by init once killed; give it a moment
            try:
                os.kill(gpid, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{gpid}/stat") as f:
                if f.read().split()[2] == "Z":
                    break
            time.sleep(0.1)
        else:
            os.kill(gpid, signal.SIGKILL)
            pytest.fail("the grandchild survived the process-group kill")


def test_worker_that_cannot_start_is_unavailable(tmp_path):
    sup = supervisor(tmp_path, options={"startup": "exit"}, max_start_attempts=2)
    with pytest.raises(WorkerUnavailable, match="code 5"):
        sup.start()
    sup = supervisor(tmp_path, options={"startup": "hang"}, max_start_attempts=1, deadlines={"startup": 1.0})
    with pytest.raises(WorkerUnavailable, match="ready"):
        sup.start()
    assert not sup.alive()


def test_profile_hook_writes_stats_after_each_job(tmp_path, monkeypatch):
    prof = tmp_path / "prof"
    monkeypatch.setenv("EVO_WORKER_PROFILE", str(prof))
    with supervisor(tmp_path) as sup:
        res = sup.run({"fake": "print", "phase": "load"})
        assert res["status"] == "ok"
        files = list(prof.glob("worker-*.prof"))
    assert len(files) == 1
    import pstats

    names = {fn for (_, _, fn) in pstats.Stats(str(files[0])).stats}
    assert "handle" in names  # the fake handler's own frame was profiled


def test_worker_exits_when_its_supervisor_is_killed(tmp_path):
    """A supervisor killed by SIGKILL mid-job must not leave its worker (own session, stuck in a
    hung phase, so it never reads the closed channel) holding the GPU."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, time; sys.path[:0] = [{os.path.dirname(here)!r}, {here!r}]\n"
            "from evaluators.run._worker import WorkerSupervisor\n"
            f"sup = WorkerSupervisor(gpu=None, target={FAKE!r}, log_dir={str(tmp_path)!r},\n"
            "                        deadlines={'correctness': 600.0, 'timing': 600.0})\n"
            "sup.start(); print(sup.pid, flush=True)\n"
            "sup.run({'fake': 'hang', 'phase': 'correctness'})\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        os.kill(worker, 0)  # alive while its supervisor is
        time.sleep(1.0)
        os.kill(worker, 0)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not _running(worker):
                break
            time.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail("worker outlived its supervisor by 10 s")
    finally:
        if parent.poll() is None:
            parent.kill()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lasts until whoever adopted it reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
