"""A realistic small archive for the export and report tests: real template candidates.

``build(path)`` writes, with :class:`populations.Archive`, per shape a few candidates rendered from
the seed templates (``load_templates()``), a mutation child of the first seed (for lineage), and
evaluations carrying ``device``/``offline``/``server`` timer results, provenance, kernel stats and
every kind of failure. The timings are made up (this is a CPU test), the code is real.

Shapes and what they exercise:

- 128x256x64:TN:f32  sm80_mma seed + child; the child is best (mutation lineage); one flagged.
- 256x128x128:NN:f32 sm80_mma in NN; a compile error beside it.
- 64x64x64:TN:f32    tiny template best.
- 512x512x512:TN:f32 sm90_wgmma best (tensor maps).
- 96x64x40:TN:f32    only failures: never exported (no ok kernel).
- 128x128x64:TN:f16  the f16 contract (free-form code): not exported (not torch.matmul's semantics).
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from populations import Archive, Candidate, Evaluation, KernelStats, Shape, Status, TimerResult, load_templates

GPU = {"gpu": "NVIDIA H200", "driver": "580.00", "cuda": "13.0", "torch": "2.11.0", "evo": "fixture"}

S_MMA = Shape(128, 256, 64)
S_NN = Shape(256, 128, 128, "NN")
S_TINY = Shape(64, 64, 64)
S_WGMMA = Shape(512, 512, 512)
S_FAIL = Shape(96, 64, 40)
S_F16 = Shape(128, 128, 64, "TN", "f16")
SHAPES = (S_MMA, S_NN, S_TINY, S_WGMMA, S_FAIL, S_F16)


def timers(speedup: float, base: float = 20e-6) -> dict[str, TimerResult]:
    """Device/offline/server results whose speedups are ``speedup`` (device), a bit less offline."""
    out = {}
    for name, factor, b in (("device", 1.0, base), ("offline", 0.95, base + 8e-6), ("server", 0.9, base + 3e-6)):
        t = b / (speedup * factor)
        out[name] = TimerResult(t, t * 0.98, t * 1.02, b, b * 0.98, b * 1.02, 30)
    return out


def ok(c: Candidate, shape: Shape, speedup: float, **kw: object) -> Evaluation:
    return Evaluation(c.id, shape, Status.OK, timers=timers(speedup), arch="sm_90a", max_error=1e-3,
                      kernels=(KernelStats(c.plan.launches[0].kernel, registers=128),), provenance=dict(GPU),
                      **kw)  # type: ignore[arg-type]


def first_pick(name: str, shape: Shape) -> Candidate:
    t = load_templates()[name]
    return t.candidate(t.heuristic(shape)[0], shape)


def build(path: Union[str, Path]) -> dict[Shape, Candidate]:
    """Write the archive at ``path``; returns the expected best candidate per exportable shape."""
    best: dict[Shape, Candidate] = {}
    with Archive(path, "w") as a:
        seed = first_pick("sm80_mma", S_MMA)
        child = seed.derive(source=seed.source + "\n// mutated: unroll hint\n", parents=(seed.id,),
                            operator="mutate", generation=1)
        grandchild = child.derive(source=child.source + "\n// mutated again\n", parents=(child.id,),
                                  operator="mutate", generation=2)
        a.record(seed, [ok(seed, S_MMA, 0.92), ok(seed, S_MMA, 0.94)])
        a.record(child, [ok(child, S_MMA, 1.08)])
        a.record(grandchild, [ok(grandchild, S_MMA, 1.5),
                              Evaluation(grandchild.id, S_MMA, Status.FLAGGED, flags=("too fast",), arch="sm_90a")])
        a.add(Evaluation(seed.id, S_MMA, Status.TIMEOUT, message="timing overran", arch="sm_90a"))
        best[S_MMA] = child

        nn = first_pick("sm80_mma", S_NN)
        a.record(nn, [ok(nn, S_NN, 1.03)])
        bad = nn.derive(source=nn.source + "\n#error broken\n", parents=(nn.id,), operator="mutate", generation=1)
        a.record(bad, [Evaluation(bad.id, S_NN, Status.COMPILE_ERROR, message="error: broken", arch="sm_90a")])
        best[S_NN] = nn

        tiny = first_pick("tiny", S_TINY)
        mma = first_pick("sm80_mma", S_TINY)
        a.record(tiny, [ok(tiny, S_TINY, 1.31)])
        a.record(mma, [ok(mma, S_TINY, 0.7)])
        best[S_TINY] = tiny

        wg = first_pick("sm90_wgmma", S_WGMMA)
        mma = first_pick("sm80_mma", S_WGMMA)
        a.record(wg, [ok(wg, S_WGMMA, 1.12)])
        a.record(mma, [ok(mma, S_WGMMA, 0.81)])
        best[S_WGMMA] = wg

        fail = first_pick("sm80_mma", S_FAIL)
        a.record(fail, [Evaluation(fail.id, S_FAIL, Status.INCORRECT, message="max error 3.2", arch="sm_90a"),
                        Evaluation(fail.id, S_FAIL, Status.RUNTIME_ERROR, message="illegal address", arch="sm_90a")])

        src, plan = load_templates()["sm80_mma"].render(load_templates()["sm80_mma"].heuristic(S_MMA)[0], S_MMA)
        f16 = Candidate(source=src + "\n// fp16 accumulation variant\n", plan=plan, shapes=(S_F16,), operator="llm")
        a.record(f16, [ok(f16, S_F16, 1.2)])
    return best
