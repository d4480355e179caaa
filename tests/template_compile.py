"""Real compiles of template candidates for the template test files (not a test module itself).

:func:`first_pick_jobs` gathers, per template, every heuristic first pick at every given shape on
sm_90a and sm_80 (where the template applies) plus seeded random valid knob sets; and
:func:`compile_and_check` compiles them through evaluators' ``CompilePool`` (static scan, NVRTC,
ptxas resource policy) and asserts that each compiled, exports ``evo_<template>`` (or the named
kernel) and spilled nothing.
"""
from __future__ import annotations

import random
from typing import Mapping, Optional, Sequence

from populations import Shape, Template

Job = tuple[str, str, object]  # (template name, arch, candidate)


def first_pick_jobs(templates: Mapping[str, Template], shapes: Sequence[str], samples: int,
                    sample_shape: str = "5x4096x4104", archs: Sequence[str] = ("sm_90a", "sm_80")) -> list[Job]:
    """(template, arch, candidate) for every first pick at every shape on ``archs``, plus ``samples``
    seeded valid knob sets per template at ``sample_shape`` (sm_90a); one candidate per distinct
    source and arch."""
    rng = random.Random(2026)
    jobs: dict[tuple[str, str], Job] = {}
    for name, t in templates.items():
        for text in shapes:
            shape = Shape.parse(text)
            for arch in archs:
                if not t.applicable(shape, arch):
                    continue
                for knobs in t.heuristic(shape, arch):
                    cand = t.candidate(knobs, shape)
                    jobs.setdefault((cand.source, arch), (name, arch, cand))
        shape = Shape.parse(sample_shape)
        for knobs in t.sample(rng, shape, samples, arch=90):
            cand = t.candidate(knobs, shape)
            jobs.setdefault((cand.source, "sm_90a"), (name, "sm_90a", cand))
    return list(jobs.values())


def compile_and_check(jobs: Sequence[Job], kernel: Optional[str] = None,
                      archs: Sequence[str] = ("sm_90a", "sm_80")) -> None:
    """Compile every job; assert all compiled for all ``archs``, export their kernel and spill nothing."""
    from evaluators import CompilePool

    with CompilePool(workers=2, use_cache=False) as pool:
        results = [(n, a, c, pool.submit(c, a)) for n, a, c in jobs]
        results = [(n, a, c, f.result()) for n, a, c, f in results]
    failed = [(n, a, c.knobs, r.status, r.message[-600:]) for n, a, c, r in results if not r.ok]
    assert not failed, failed
    assert {a for _, a, _, _ in results} == set(archs)
    for name, _, _, r in results:
        assert (kernel or f"evo_{name}") in {k.name for k in r.kernels}
    spilled = [(n, a, c.knobs, r.kernels) for n, a, c, r in results
               if any(k.spill_stores or k.stack_frame for k in r.kernels)]
    assert not spilled, spilled
