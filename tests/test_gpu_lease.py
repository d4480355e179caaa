"""The GPU lease between timed regions and LLM generation (issue 25): generation waits while a
timed region is open, timing waits at most one generation slice (and never past its bound),
across threads and processes; the LLM's placement and its GPU seconds.

The GPU is a boundary we do not own here: :class:`GpuDouble` stands for it and records, per
kind of work, the intervals during which it "ran", so the tests can check that no generation
interval overlaps a timed one.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evaluators.run._lease import GpuLease, gpu_key, timing_lease
from evo.search._llm_placement import device_index, llm_placement, place_llm
from operators.llm import Completion, LLMBackend


class GpuDouble:
    """A test double for the GPU: ``run(kind, seconds)`` occupies it and records the interval."""

    def __init__(self) -> None:
        self.intervals: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()

    def run(self, kind: str, seconds: float) -> None:
        t0 = time.perf_counter()
        time.sleep(seconds)
        with self._lock:
            self.intervals.append((kind, t0, time.perf_counter()))

    def overlaps(self) -> list[tuple[tuple[str, float, float], tuple[str, float, float]]]:
        timed = [i for i in self.intervals if i[0] == "timing"]
        gen = [i for i in self.intervals if i[0] == "generation"]
        return [(t, g) for t in timed for g in gen if g[1] < t[2] and t[1] < g[2]]


@pytest.fixture
def lease(tmp_path: Path) -> GpuLease:
    return GpuLease("test-gpu", tmp_path)


def test_generation_waits_while_a_timed_region_is_open(lease: GpuLease, tmp_path: Path) -> None:
    gpu = GpuDouble()
    inside = threading.Event()
    started = {}

    def generate() -> None:
        inside.wait()
        gen = GpuLease("test-gpu", tmp_path)  # its own descriptors, as another process would have
        t0 = time.perf_counter()
        with gen.slice():
            started["after"] = time.perf_counter() - t0
            gpu.run("generation", 0.01)

    th = threading.Thread(target=generate)
    th.start()
    with lease.timed() as wait:
        inside.set()
        gpu.run("timing", 0.3)
    th.join(5)
    assert not wait.timed_out and wait.waited_s < 0.05
    assert started["after"] >= 0.25  # it waited for the region to end
    assert not gpu.overlaps()


def test_timing_waits_at_most_one_slice_of_continuous_generation(lease: GpuLease, tmp_path: Path) -> None:
    gpu = GpuDouble()
    stop = threading.Event()
    slice_s = 0.05

    def generate() -> None:
        gen = GpuLease("test-gpu", tmp_path)
        while not stop.is_set():
            with gen.slice():
                gpu.run("generation", slice_s)

    th = threading.Thread(target=generate)
    th.start()
    time.sleep(0.1)
    waits = []
    for _ in range(5):
        with lease.timed(max_wait_s=2.0) as wait:
            gpu.run("timing", 0.03)
        waits.append(wait.waited_s)
        time.sleep(0.02)
    stop.set()
    th.join(5)
    assert max(waits) <= slice_s + 0.05, waits  # one slice, plus scheduling slack
    assert sum(1 for i in gpu.intervals if i[0] == "generation") >= 3  # generation ran between regions
    assert not gpu.overlaps()
    assert lease.summary()["slices"] == 0  # the timer's side counts no slices


def test_timing_never_waits_past_its_bound(lease: GpuLease, tmp_path: Path) -> None:
    held = threading.Event()
    release = threading.Event()

    def stuck_generation() -> None:
        with GpuLease("test-gpu", tmp_path).slice():
            held.set()
            release.wait(5)

    th = threading.Thread(target=stuck_generation)
    th.start()
    held.wait(5)
    t0 = time.perf_counter()
    with lease.timed(max_wait_s=0.1) as wait:
        pass
    release.set()
    th.join(5)
    assert wait.timed_out and 0.09 <= wait.waited_s < 1.0
    assert time.perf_counter() - t0 < 1.0


def test_the_lease_holds_across_processes(tmp_path: Path) -> None:
    """A timed region in another process (the GPU worker) holds generation here off."""
    code = ("import sys, time; from evaluators.run._lease import GpuLease\n"
            f"with GpuLease('test-gpu', {str(tmp_path)!r}).timed():\n"
            "    print('in', flush=True); time.sleep(0.5)\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "in"
    t0 = time.perf_counter()
    gen = GpuLease("test-gpu", tmp_path)
    with gen.slice():
        waited = time.perf_counter() - t0
    proc.wait(10)
    assert waited >= 0.3
    s = gen.summary()
    assert s["slices"] == 1 and s["waited_s"] >= 0.3


def test_a_cancelled_generation_stops_waiting_and_never_runs_unleased(lease: GpuLease, tmp_path: Path) -> None:
    cancel = threading.Event()
    ran = []
    with lease.timed():
        threading.Timer(0.1, cancel.set).start()
        t0 = time.perf_counter()
        with pytest.raises(InterruptedError):
            with GpuLease("test-gpu", tmp_path).slice(cancel=cancel):
                ran.append(1)
        assert time.perf_counter() - t0 < 1.0
    assert not ran


def test_timing_hook_records_its_wait_and_can_be_switched_off(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EVO_GPU_LEASE_DIR", str(tmp_path))
    with timing_lease() as wait:
        pass
    assert set(wait.to_dict()) == {"waited_s", "timed_out", "enabled"} and wait.enabled
    assert list(tmp_path.glob("*.gate"))
    monkeypatch.setenv("EVO_GPU_LEASE", "off")
    with timing_lease() as wait:
        assert not wait.enabled


def test_gpu_keys_agree_between_processes(monkeypatch) -> None:
    assert gpu_key(0, uuid_of=lambda i: "GPU-12ab/x") == "uuid-GPU-12ab_x"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    worker = gpu_key(0, uuid_of=lambda i: None)  # the worker sees physical GPU 3 as index 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert worker == gpu_key(3, uuid_of=lambda i: None) == "index-3"


# -- placement ------------------------------------------------------------------------------------
class _LlmLike:
    """Stands for an LLM operator (its gate/models/device attributes only)."""

    def __init__(self) -> None:
        self.gate, self.models, self.gpu_device = None, ["m"], False

    def _spec(self, name: str):
        from operators.llm import resolve_model
        return resolve_model("smollm2-135m")


def test_placement_decides_the_lease() -> None:
    assert device_index("cuda") == 0 and device_index("cuda:2") == 2 and device_index("cpu") is None
    ops = {"knob_mutation": object(), "llm": _LlmLike()}
    key = lambda i: f"k{i}"  # noqa: E731
    assert llm_placement({"knob": object()}, [0]).where == "none"
    assert llm_placement(ops, [0], None, key).where == "cpu"  # models.toml: smollm2-135m on the CPU
    co = llm_placement(ops, [0, 1], "cuda:1", key)
    assert (co.where, co.gpu, co.lease) == ("colocated", 1, "k1") and "waits" in co.describe()
    sep = llm_placement(ops, [0], "cuda:1", key)
    assert sep.where == "separate" and sep.lease is None
    made = []
    lease = place_llm(ops, co, lease_factory=lambda k: made.append(k) or f"lease-{k}")
    assert lease == "lease-k1" and ops["llm"].gate == "lease-k1" and ops["llm"].gpu_device and made == ["k1"]
    assert place_llm(ops, sep) is None and ops["llm"].gate is None and ops["llm"].gpu_device


# -- the LLM operator under a gate ------------------------------------------------------------------
class RecordingGate:
    """A gate double that counts slices (the lease's interface: ``slice(sync=, cancel=)``)."""

    def __init__(self) -> None:
        self.slices = 0

    def slice(self, sync=None, cancel=None):
        import contextlib

        @contextlib.contextmanager
        def one():
            self.slices += 1
            yield
        return one()


class ServerDouble(LLMBackend):
    """Stands for an OpenAI-compatible server (a boundary we do not own): a fixed answer."""

    def complete(self, messages, **kwargs):
        time.sleep(0.01)
        return Completion('{"BM": 64}', 10, 5, 0.25, "served", kwargs.get("temperature", 0.0))


def test_a_server_request_is_one_slice_and_its_seconds_count_on_a_gpu() -> None:
    from operators.llm import LLMOperator
    from operators.llm._operator import _Accounted

    gate = RecordingGate()
    op = LLMOperator(gate=gate)
    c = _Accounted(op, op.model, ServerDouble()).complete([], temperature=0.5)
    assert gate.slices == 1 and c.gpu_s == 0.25  # the request's seconds: the server's GPU time
    assert op.take_gpu_seconds() == 0.25 and op.take_gpu_seconds() == 0.0
    assert op.outcomes[op.model]["gpu_s"] == 0.25
    cpu_op = LLMOperator()
    assert _Accounted(cpu_op, cpu_op.model, ServerDouble()).complete([]).gpu_s == 0.0


class WaitingGate:
    """A gate double that makes the caller wait ``wait_s`` before each slice (as timers holding
    the GPU would), and counts slices."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s, self.slices = wait_s, 0

    def slice(self, sync=None, cancel=None):
        import contextlib

        @contextlib.contextmanager
        def one():
            time.sleep(self.wait_s)
            self.slices += 1
            yield
            if sync is not None:
                sync()
        return one()


def test_waiting_for_the_lease_is_not_charged_to_a_server_request() -> None:
    from operators.llm import LLMOperator
    from operators.llm._operator import _Accounted

    gate = WaitingGate(0.2)
    op = LLMOperator(gate=gate)
    c = _Accounted(op, op.model, ServerDouble()).complete([], temperature=0.5)
    assert gate.slices == 1 and c.gpu_s == 0.25 and c.gpu_wait_s >= 0.2
    assert op.take_gpu_seconds() == 0.25  # held only: the 0.2 s wait is no cost of the model
    assert op.take_gpu_wait_seconds() >= 0.2 and op.take_gpu_wait_seconds() == 0.0
    assert op.outcomes[op.model]["gpu_wait_s"] >= 0.2


def test_waiting_for_the_lease_is_not_charged_to_in_process_generation(monkeypatch) -> None:
    """The real model (on the CPU, its held seconds counted as on a GPU) under a gate double that
    makes every slice wait 50 ms: the waits are reported apart and never inside ``gpu_s``; what
    is charged fits in the call's wall seconds once the waits are taken out."""
    from operators import available_operators
    if "llm" not in available_operators():
        pytest.skip("the llm extra is not installed")
    import random

    from operators.llm import LLMOperator, load_backend
    from operators.llm._operator import _Accounted
    backend = load_backend()
    monkeypatch.setattr(backend, "count_gpu_s", True, raising=False)
    gate = WaitingGate(0.05)
    op = LLMOperator(gate=gate)
    cs = _Accounted(op, op.model, backend).complete_many([{"role": "user", "content": "Say hi to the GPU."}], 2,
                                                         rng=random.Random(0), temperature=0.7, max_new_tokens=3)
    held, waited, wall = (sum(getattr(c, k) for c in cs) for k in ("gpu_s", "gpu_wait_s", "seconds"))
    assert gate.slices >= 3 and held > 0
    assert waited >= 0.05 * gate.slices * 0.95  # every slice's wait is reported...
    assert held <= wall - waited + 1e-3  # ...and none of it is in the charge
    assert op.take_gpu_seconds() == pytest.approx(held) and op.take_gpu_wait_seconds() == pytest.approx(waited)
    assert op.outcomes[op.model]["wall_s"] == pytest.approx(wall)


def test_in_process_generation_runs_one_slice_per_forward_pass() -> None:
    from operators import available_operators
    if "llm" not in available_operators():
        pytest.skip("the llm extra is not installed")
    import random

    from operators.llm import load_backend
    backend = load_backend()
    gate = RecordingGate()
    c = backend.complete([{"role": "user", "content": "Say hi."}], rng=random.Random(0), temperature=0.0,
                         max_new_tokens=4, gate=gate)
    assert c.completion_tokens >= 1
    assert gate.slices >= c.completion_tokens  # the prompt's chunks and every decoded token
    assert c.gpu_s == 0.0  # on the CPU: no GPU seconds
    assert getattr(backend, "_gate", None) is None  # the gate belongs to that completion only


@pytest.mark.gpu
def test_gpu_generation_load_stays_out_of_the_timed_regions(tmp_path: Path, monkeypatch) -> None:
    """On the device: matmul 'generation' slices on GPU 0 under its lease while the pool times the
    built-in kernel there; every result records its lease wait (at most ~one slice) and none is
    flagged."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from evaluators import LocalPool
    from evaluators.run._builtin_kernels import naive_candidate
    from populations import Shape, Status

    monkeypatch.setenv("EVO_GPU_LEASE_DIR", str(tmp_path / "lease"))
    lease = GpuLease(gpu_key(0), tmp_path / "lease")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    stop = threading.Event()

    def generate() -> None:
        while not stop.is_set():
            with lease.slice(sync=torch.cuda.synchronize):
                for _ in range(4):  # ~1 ms of tensor-core work per slice
                    a @ a

    th = threading.Thread(target=generate)
    th.start()
    try:
        with LocalPool(gpus=[0], compile_workers=2, log_dir=str(tmp_path / "logs")) as pool:
            shapes = [Shape.parse(s) for s in ("256x384x512:TN", "64x128x64:TN", "1024x1024x1024:TN")]
            evals = pool.evaluate([naive_candidate(tuple(shapes))])
    finally:
        stop.set()
        th.join(10)
    assert lease.summary()["slices"] > 0
    for e in evals:
        assert e.status is Status.OK and not e.flags, e.message
        wait = e.measurement.gpu_lease
        assert wait["enabled"] and not wait["timed_out"] and wait["waited_s"] < 0.5


def test_a_server_request_waiting_for_the_lease_ends_when_the_run_stops(tmp_path: Path) -> None:
    from operators.llm import LLMOperator
    from operators.llm._operator import _Accounted

    op = LLMOperator(gate=GpuLease("test-gpu", tmp_path))
    with GpuLease("test-gpu", tmp_path).timed():
        threading.Timer(0.1, op.cancel).start()
        c = _Accounted(op, op.model, ServerDouble()).complete([], temperature=0.5)
    assert c.error == "cancelled" and c.text == "" and c.gpu_s == 0.0


def test_every_gpu_operation_of_a_generation_runs_inside_a_slice(monkeypatch) -> None:
    """Not only the forward passes: the model's move to its device (lazy, at the first pass) and
    the copy of a cached prompt's KV cache run kernels on a GPU too, so they must hold the lease.
    The real model on the CPU; a gate double says whether a slice is open when each happens."""
    from operators import available_operators
    if "llm" not in available_operators():
        pytest.skip("the llm extra is not installed")
    import random
    import types

    from operators.llm import _steps, load_backend  # _steps: the backend's model steps (prefill's KV copy)

    class OpenGate:
        def __init__(self) -> None:
            self.open = False

        def slice(self, sync=None, cancel=None):
            import contextlib

            @contextlib.contextmanager
            def one():
                self.open = True
                try:
                    yield
                finally:
                    self.open = False
            return one()

    backend = load_backend()
    gate, seen = OpenGate(), []
    real_deepcopy, real_to = _steps.copy.deepcopy, backend.model.to
    monkeypatch.setattr(_steps, "copy", types.SimpleNamespace(
        deepcopy=lambda x: (seen.append(("kv copy", gate.open)), real_deepcopy(x))[1]))
    monkeypatch.setattr(backend.model, "to", lambda *a, **k: (seen.append(("move", gate.open)), real_to(*a, **k))[1])
    monkeypatch.setattr(backend, "_placed", False)  # as a GPU backend before its first pass
    msgs = [{"role": "user", "content": "Say hi."}]
    for _ in range(2):  # the second completion reuses the prompt's cached KV cache: a copy
        backend.complete(msgs, rng=random.Random(0), temperature=0.0, max_new_tokens=2, gate=gate)
    assert ("move", True) in seen and ("kv copy", True) in seen
    assert all(inside for _, inside in seen), seen
