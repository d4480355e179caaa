"""The nvcc fallback back end compiles the seed templates (real nvcc 13.0, no GPU needed).

Why: NVRTC is the default back end, so template sources were only ever tried under NVRTC, and
``#pragma unroll KUNROLL`` (a knob macro as the pragma argument) compiled there but was an error
under nvcc, which does not macro-expand pragma arguments. These tests compile a few first picks
of each hand-written template with ``backend="nvcc"`` for both targets, without the cubin cache
so every case really runs nvcc, and check that the unroll knob still takes effect under nvcc.
"""
from __future__ import annotations

import pytest

from populations import Candidate, Shape, Status, load_templates
from evaluators import compile_candidate
from evaluators.compile._toolkit import nvcc_path

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")

ARCHS = ("sm_80", "sm_90a")

#: Shapes whose heuristic first picks cover each template's paths: big tiles, ragged NN,
#: split-K with a reduce launch, and (tiny) the small-output rules.
SHAPES = {
    "sm80_mma": ("4096x4096x4096:TN", "1000x1000x1000:NN", "64x4096x4096:NN", "128x256x8192:TN"),
    "tiny": ("16x16x512:TN", "64x4096x4096:NN", "128x256x8192:TN", "33x77x129:TN", "100x100x5000:NN"),
}


def _candidates(name: str) -> list[Candidate]:
    """The first heuristic pick per shape, plus (sm80_mma) that pick with the main loop unrolled twice."""
    t = load_templates()[name]
    out: list[Candidate] = []
    for text in SHAPES[name]:
        shape = Shape.parse(text)
        knobs = t.heuristic(shape)[0]
        out.append(t.candidate(knobs, shape))
        if name == "sm80_mma" and len(out) == 1:
            twice = {**knobs, "KUNROLL": 2}
            assert not t.check(twice, shape), t.check(twice, shape)
            out.append(t.candidate(twice, shape))
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_template_first_picks_compile_with_nvcc(name: str, arch: str) -> None:
    cands = _candidates(name)
    assert 4 <= len(cands) <= 6
    results = [compile_candidate(c, arch, backend="nvcc", use_cache=False) for c in cands]
    for c, r in zip(cands, results):
        where = f"{name} {c.shapes[0]} {dict(c.knobs)} on {arch}"
        assert r.ok and r.status is Status.OK and r.backend == "nvcc" and not r.cached, f"{where}:\n{r.message}"
        assert r.cubin[:4] == b"\x7fELF", where
        assert r.kernels and all(k.spill_stores == 0 and k.spill_loads == 0 for k in r.kernels), (where, r.kernels)
        # nvcc's "ignoring pragma for this loop" warning would mean a knob silently stopped working
        assert "pragma" not in r.message.lower(), f"{where}:\n{r.message}"
    if name == "sm80_mma":  # same knobs but KUNROLL 1 vs 2: the unroll pragma changed the code
        assert results[0].cubin != results[1].cubin
