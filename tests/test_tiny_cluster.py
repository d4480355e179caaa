"""tiny's K split across a thread-block cluster (``CLUSTER``, sm_90): partial tiles added through
distributed shared memory in one launch, no workspace, no reduce launch (cluster_k.cuh).

The CPU tests hold the knob's rules and plans and compile every case for sm_90a through the
evaluator's own compile step (static scan, NVRTC, PTX scan, machine-code check); the GPU test runs
the cases through the evaluator: ragged K, NN, edges of M and N inside a tile, one warp and eight,
clusters of 2, 4 and 8."""
from __future__ import annotations

import pytest

from populations import Shape, load_template
from populations._template import TEMPLATES_DIR

CASES = [("191x512x768", {"TM": 16, "TN": 8, "WARPS": 8, "KU": 2, "CLUSTER": 4}),
         ("121x374x139", {"TM": 16, "TN": 8, "WARPS": 8, "KU": 1, "CLUSTER": 2}),
         ("173x119x621", {"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "CLUSTER": 8}),
         ("33x47x2056:NN", {"TM": 32, "TN": 16, "WARPS": 1, "KU": 2, "CLUSTER": 4}),
         ("278x560x640", {"TM": 32, "TN": 32, "WARPS": 4, "KU": 2, "CLUSTER": 2})]


def _tiny():
    return load_template(TEMPLATES_DIR / "tiny")


def _candidates():
    t = _tiny()
    return [t.candidate(dict(knobs, SPLIT_K=1), Shape.parse(shape)) for shape, knobs in CASES]


def test_cluster_rules_and_plans() -> None:
    t, s = _tiny(), Shape.parse("191x512x768")
    k = dict(TM=16, TN=8, WARPS=8, KU=2, SPLIT_K=1, CLUSTER=4)
    assert not t.check(k, s, 90)
    assert any("sm_90" in r for r in t.check(k, s, 80))
    assert t.check(dict(k, SPLIT_K=2), s, 90)  # one way of splitting K at a time
    assert t.check(dict(k, CLUSTER=8), Shape.parse("191x512x100"), 90)  # 7 k16 steps for 8 CTAs
    launches, ws = t.candidate(k, s).plan.resolve(s)
    assert [ln.kernel for ln in launches] == ["evo_tiny"] and ws == 0
    assert launches[0].grid == (64, 12, 4)
    one = dict(k, WARPS=1)  # one warp still keeps its partial tile in shared memory for its peers
    launches, _ = t.candidate(one, s).plan.resolve(s)
    assert launches[0].smem == 16 * 8 * 4
    launches, _ = t.candidate(dict(one, CLUSTER=1), s).plan.resolve(s)
    assert launches[0].smem == 0


def test_cluster_cases_compile_for_sm90a() -> None:
    from evaluators import CompilePool

    cands = _candidates()
    with CompilePool(workers=2, use_cache=False) as pool:
        results = [pool.submit(c, "sm_90a") for c in cands]
        bad = [(c.knobs, r.status, r.message[-300:]) for c, r in ((c, f.result()) for c, f in zip(cands, results))
               if not r.ok]
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_cluster_split_is_correct_on_the_gpu(tmp_path) -> None:
    pytest.importorskip("torch")
    from gpu_eval_all_ok import assert_all_ok

    assert_all_ok(_candidates(), tmp_path)
