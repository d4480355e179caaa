"""What the timing phase decides from its figures: the hack flags (below the physical floor,
memoisation) and the gates that skip work only a would-be elite needs (memo pass, host timers)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from populations import Shape


#: Ceilings used for the physical-floor flag when the start-up measurement is lower.
DEFAULT_CEILINGS = {"flops": 790e12, "bytes_per_s": 4.3e12, "launch_s": 0.5e-6}


#: Measured rates are what cuBLAS and a copy reach; a kernel may beat them, never the datasheet
#: (H200: ~990 TFLOP/s dense fp16, 4.8 TB/s). Headroom from measured to peak before flagging.
HEADROOM = {"flops": 1.30, "bytes_per_s": 1.15, "launch_s": 0.7}


#: An honest kernel takes the same time whether or not its inputs change between calls (the
#: perturbation is one sign flip outside the timed events); memoisation makes repeats far faster.
MEMO_RATIO = 1.3


def memo_flag(perturbed_s: float, repeated_s: float) -> Optional[str]:
    """A hack flag when repeated identical inputs time much faster than changing ones, else None.

    The device timer changes one input element before every call, so a kernel that caches its
    outputs by input content (a hash of every element is exact, so no output check can catch
    it) gains nothing there; timing it once more on identical inputs shows whether it tries."""
    if repeated_s * MEMO_RATIO < perturbed_s and perturbed_s - repeated_s > 1e-6:
        return (f"faster on repeated identical inputs ({repeated_s * 1e6:.2f} us) than with inputs changed between "
                f"calls ({perturbed_s * 1e6:.2f} us): results memoised across calls")
    return None


def physical_floor(shape: Shape, ceilings: Mapping[str, float]) -> float:
    """Fewest seconds any kernel can take: max(FLOPs/peak, bytes/bandwidth, launch floor)."""
    return max(shape.flops / (ceilings["flops"] * HEADROOM["flops"]),
               shape.min_bytes / (ceilings["bytes_per_s"] * HEADROOM["bytes_per_s"]),
               ceilings["launch_s"] * HEADROOM["launch_s"])


def memo_wanted(job: Mapping[str, Any], device: Mapping[str, Any], shape: Optional[Shape] = None) -> str:
    """Whether the memoisation timing pass runs for this result: ``"run"``, or why not.

    It costs a second device timing, and a memo pays only where it makes the candidate an elite:
    the engine passes ``elite_threshold`` (the speedup the candidate must reach to join the
    elites; the cutoff only rises as the population grows), and below it the pass is skipped.
    A candidate that claims several shapes is judged by ``shape``'s own threshold (see
    :func:`_elite_gate`)."""
    if not job.get("memo_check", True):
        return "off"
    speedup = device["baseline_median"] / device["median"] if device["median"] > 0 else float("inf")
    return _elite_gate(job, speedup, shape)


def host_timers_wanted(job: Mapping[str, Any], device_speedup: float, shape: Optional[Shape] = None) -> str:
    """Whether the ``offline`` and ``server`` timers run after the device timer: ``"run"``, or why not.

    They are reported, never ranked on (fitness is the device speedup), and they cost a run
    most where the GPU idles: the server timer's gaps are idle by design and the offline timer
    waits on the host. A candidate below the job's ``elite_threshold`` is discarded on its device
    time, so it skips them, as it skips the memo pass; every elite has all three timers. Job
    option ``host_timers``: ``"elites"`` (the default) or ``"always"``."""
    if job.get("host_timers", "elites") == "always":
        return "run"
    return _elite_gate(job, device_speedup, shape)


#: Racing: a candidate whose fastest call so far is below this share of its elite threshold stops
#: being timed (its median is below the threshold by more than the timer's noise).
RACE_SHARE = 0.8


def race_stop(job: Mapping[str, Any], shape: Optional[Shape] = None
              ) -> Optional[Callable[[Mapping[str, Sequence[float]]], bool]]:
    """The device timer's ``stop`` for this job and shape, or None (no elite threshold known
    there, or job option ``race`` False).

    Precision only an elite needs, like the memo pass and the host timers: from the timer's
    ``min_rounds`` on, once even the candidate's fastest call is below :data:`RACE_SHARE` of
    the elite threshold against the better baseline's median so far, more rounds cannot make
    it an elite, so they stop (most children of a search are far slower than the elites, and
    a slow candidate's rounds are the longest). It can only shorten a losing candidate's
    timing: a kernel gains nothing by being slow early, it is then timed less and ranked as
    slow, and the checks of the timed calls run as before."""
    if not job.get("race", True):
        return None
    thr = _threshold(job, shape)
    if thr is None or float(thr) <= 0:
        return None
    cutoff = RACE_SHARE * float(thr)

    def stop(per_call: Mapping[str, Sequence[float]]) -> bool:
        cand = per_call.get("candidate") or ()
        bases = [sorted(v)[len(v) // 2] for name, v in per_call.items() if name != "candidate" and v]
        if len(cand) < 2 or not bases:
            return False
        return min(bases) / min(cand) < cutoff
    return stop


def _elite_gate(job: Mapping[str, Any], speedup: float, shape: Optional[Shape] = None) -> str:
    """``"run"`` at or above the job's elite threshold for ``shape``, else why not. The threshold
    is one number for every shape, or a mapping from shape (its string) to a number or None; a
    shape the mapping leaves out, or maps to None, has no known cutoff and always runs: a
    candidate claiming several shapes can become an elite at any of them, so none of them may
    skip the checks on another shape's cutoff."""
    thr = _threshold(job, shape)
    if thr is None or speedup >= float(thr):
        return "run"
    return f"skipped: speedup {speedup:.3f} below the elite threshold {float(thr):.3f}"


def _threshold(job: Mapping[str, Any], shape: Optional[Shape]) -> Optional[float]:
    """The job's elite threshold for ``shape``: its one number, or the per-shape mapping's entry
    (None where the mapping leaves the shape out, or without a shape)."""
    thr = job.get("elite_threshold")
    if isinstance(thr, Mapping):
        thr = thr.get(str(shape)) if shape is not None else None
    return None if thr is None else float(thr)


def _baseline(timer_stats: Mapping[str, Any]) -> str:
    """The arm a timer's result is paired with: the faster torch.matmul layout (best of NN/TN)."""
    return min(("torch.matmul NN", "torch.matmul TN"), key=lambda arm: timer_stats[arm].median)


def _speedup(timer_stats: Mapping[str, Any]) -> float:
    """A timer's speedup: its baseline's median over the candidate's."""
    cand = timer_stats["candidate"].median
    return timer_stats[_baseline(timer_stats)].median / cand if cand > 0 else float("inf")
