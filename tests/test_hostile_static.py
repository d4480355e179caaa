"""The red-team corpus on the CPU (issue 5): it loads, and the static scan and the compile step
catch every attack they own, with real NVRTC compiles in real child processes.

Runtime-phase attacks must pass both (so the GPU worker's checks, not an accident of the
compiler, are what tests/test_hostile_gpu.py and bench/redteam.py measure).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hostile_corpus import CORPUS_DIR, PHASES, HostileCase, load_case, load_corpus, load_good
from populations import Candidate, Status

CORPUS = load_corpus()
BY_NAME = {c.name: c for c in CORPUS}
BUILT = [c for c in CORPUS if c.candidate is not None]
ARCH = "sm_90a"
BOMB_TIMEOUT_S = 5.0

#: The attack kinds the issue asks for, each with at least one case of the corpus.
REQUIRED_KINDS = {
    "no-op on a reused output": ["noop_empty", "noop_reused_output", "noop_reused_output_small"],
    "writes into A or B": ["writes_into_a", "inputs_permuted_inplace"],
    "out-of-bounds writes beyond C": ["oob_write_tail", "oob_write_far"],
    "cache in a device global": ["static_cache_global"],
    "hidden state without a global": ["cache_in_workspace_ptrkey", "cache_in_workspace_sampled_key", "cache_content_hash",
                                      "cache_content_hash_full", "cache_output_fingerprint", "cache_prepacked_b", "state_beyond_c"],
    "skip later calls via a counter": ["skip_calls_ws_counter", "skip_calls_ws_adaptive", "global_call_counter"],
    "host code: private stream / thread": ["host_private_stream", "host_thread"],
    "absurd plans": ["plan_block_too_big", "plan_smem_300k", "plan_workspace_huge", "plan_grid_overflow", "grid_absurd"],
    "fp16 accumulation": ["fp16_accum_generic", "fp16_accum_small_k", "fp16_accum_ones_fastpath"],
    "part of K": ["partial_k_tail_dropped", "partial_k_sampled"],
    "special-value fast paths": ["special_lowentropy_fastpath", "zeros_fastpath_skip"],
    "cuBLAS": ["calls_cublas"],
    "L2 persisting window": ["l2_persist_window"],
    "sleep forever": ["sleep_forever_semaphore"],
    "illegal memory access": ["illegal_address"],
    "trap / assert": ["trap_asm", "trap_builtin", "assert_fail"],
    "impossible shared memory": ["plan_smem_300k", "smem_plan_too_small", "smem_static_plus_dynamic"],
    "local-memory blow-up": ["local_mem_blowup"],
    "compile bombs": ["compile_bomb_unroll", "compile_bomb_template"],
    "right first, wrong later": ["first_call_right_later_wrong"],
    "generic but wrong on ragged edges": ["generic_ragged_wrong", "uninit_shared_ragged", "generic_ragged_residue"],
    "overflow in fp16 partial sums": ["fp16_partials_splitk", "fp16_partials_fingerprint"],
    "racing writes to C": ["splitk_race_on_c"],
    "modifying the timing inputs": ["zero_inputs_when_warm"],
    "timing games": ["globaltimer_skip_when_hot", "pointer_alignment_cheat", "pointer_hash_cheat", "exit_early_blocks"],
    # issue 18: whole classes, each case written differently
    "time sources hidden from the source scan": ["hidden_clock_concat_asm", "hidden_clock_stringize",
                                                 "hidden_clock_paren_call", "graph_exec_detect"],
    "writable module state without a __device__ variable": ["const_table_cast_counter", "mutable_member_const_object",
                                                             "string_literal_store", "constant_generic_store",
                                                             "static_local_in_lambda"],
    "timed calls told apart from checked calls": ["timed_skip_tile_diag", "timed_skip_rowsum", "ws_fill_fingerprint"],
    "idle on buffers after their first call (rotations)": ["skip_tile_if_c_finite_small", "c_watermark_lsb",
                                                           "skip_tile_if_c_written"],
    "ragged edges wrong only on large grids": ["skip_edge_tiles_large_grid", "drop_k_tail_large_grid",
                                               "edge_rows_once_large"],
    # issue 36: the compiled-output scan blinded, what only the machine code shows, undeclared residency
    "PTX text scan blinded by directive strings": ["pragma_blinded_globaltimer", "pragma_blinded_table_counter"],
    "placement read that only the machine code shows": ["smid_tile_memo"],
    "waits on other CTAs without declaring coresident": ["grid_barrier_undeclared"],
    "attacks on the evaluator's CPU side": ["nested_plan_expression", "unterminated_string_lexer", "unterminated_raw_string",
                                            "macro_substitution_bomb", "shape_claim_flood", "compile_bomb_unroll"],
    # issue 36: checks indistinguishable from timing, no memory across calls, generic classes
    "incremental update across calls": ["incremental_sign_update"],
    "reduced precision gated on input magnitude": ["f16_partials_magnitude_gated"],
    "reduced precision gated on C's poison": ["f16_partials_poison_gated"],
    "generic wrong in one alignment class or small range": ["generic_aligned_mn_ragged_k", "generic_small_m_wrong"],
    "state in the per-set row without a workspace": ["state_in_set_row", "incremental_sign_update"],
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Every compile- and runtime-phase case (and the control) through a real CompilePool once."""
    evaluators = pytest.importorskip("evaluators")
    targets = {c.name: c.candidate for c in BUILT if c.phase in ("compile", "runtime")}
    targets["_good"] = load_good()
    cache = tmp_path_factory.mktemp("cubins")
    with evaluators.CompilePool(workers=2, timeout_s=BOMB_TIMEOUT_S, cache_dir=cache) as pool:
        futures = {name: pool.submit(cand, ARCH) for name, cand in targets.items()}
        return {name: f.result() for name, f in futures.items()}


# -- the corpus itself -------------------------------------------------------------------------
def test_corpus_covers_every_required_kind() -> None:
    missing = {kind: [n for n in names if n not in BY_NAME] for kind, names in REQUIRED_KINDS.items()}
    assert not {k: v for k, v in missing.items() if v}, f"kinds without their cases: {missing}"
    assert len(CORPUS) >= 40
    assert {c.phase for c in CORPUS} == set(PHASES)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_case_parses_into_a_candidate_or_fails_as_declared(case: HostileCase) -> None:
    assert case.expected is not Status.OK and Status.OK not in case.acceptable
    assert not re.search(r"(?m)^\s*//@embed", case.source)
    if case.raises:
        assert case.candidate is None, f"{case.name} should not build: {case.raises}"
        assert type(case.error).__name__ == case.raises, repr(case.error)
        assert case.expected is Status.REJECTED and case.phase == "static"
        return
    assert case.error is None, f"{case.name}: {case.error!r}"
    cand = case.candidate
    assert isinstance(cand, Candidate)
    assert cand.shapes == case.shapes and cand.generic == case.generic
    assert set(cand.plan.kernel_names) <= set(re.findall(r"extern \"C\" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)", cand.source))
    assert cand.meta["hostile"] == case.name and cand.operator == "redteam"


def test_runtime_cases_are_plain_device_code() -> None:
    """Runtime attacks carry no includes and no host code: only the GPU can catch them."""
    for case in BUILT:
        if case.phase == "runtime":
            assert "#include" not in case.source, case.name


def test_loader_refuses_ok_and_escaping_embeds(tmp_path: Path) -> None:
    good = (CORPUS_DIR / "noop_empty.toml").read_text()
    bad = tmp_path / "never_ok.toml"
    bad.write_text(good.replace('expected = "incorrect"', 'expected = "ok"'))
    with pytest.raises(ValueError, match="never expect ok"):
        load_case(bad)
    from hostile_corpus import render_source
    cu = tmp_path / "escape.cu"
    cu.write_text("//@embed ../../etc/passwd\n")
    with pytest.raises(ValueError, match="outside the corpus"):
        render_source(cu)


# -- the static scan ---------------------------------------------------------------------------
STATIC = [c for c in BUILT if c.phase == "static"]
HOST_CODE = ["host_private_stream", "host_thread", "calls_cublas", "l2_persist_window"]


@pytest.mark.parametrize("case", STATIC, ids=lambda c: c.name)
def test_static_scan_rejects(case: HostileCase) -> None:
    evaluators = pytest.importorskip("evaluators")
    verdict = evaluators.scan(case.candidate, arch=ARCH)
    assert not verdict.ok, f"{case.name} passed the static scan ({case.check})"
    result = evaluators.compile_candidate(case.candidate, ARCH, timeout_s=30, use_cache=False)
    assert result.status is Status.REJECTED and case.caught_by(result.status), result.message


@pytest.mark.parametrize("name", HOST_CODE)
def test_host_code_is_rejected_even_without_its_includes(name: str) -> None:
    """An LLM told 'no host headers' keeps the host function: the scan must still see it."""
    evaluators = pytest.importorskip("evaluators")
    case = BY_NAME[name]
    stripped = case.candidate.derive(source=re.sub(r"(?m)^#include.*$", "", case.source))
    verdict = evaluators.scan(stripped, arch=ARCH)
    assert not verdict.ok
    assert any("host function" in r for r in verdict.reasons), verdict.reasons


def test_runtime_and_compile_cases_pass_the_scan() -> None:
    """Otherwise the later phase is never exercised."""
    evaluators = pytest.importorskip("evaluators")
    passed = {c.name: evaluators.scan(c.candidate, arch=ARCH) for c in BUILT if c.phase != "static"}
    assert all(v.ok for v in passed.values()), {n: v.reasons for n, v in passed.items() if not v.ok}
    assert evaluators.scan(load_good(), arch=ARCH).ok


# -- the compile step --------------------------------------------------------------------------
COMPILE = [c for c in BUILT if c.phase == "compile"]
RUNTIME = [c for c in BUILT if c.phase == "runtime"]


@pytest.mark.parametrize("case", COMPILE, ids=lambda c: c.name)
def test_compile_step_catches(case: HostileCase, compiled: dict) -> None:
    """Compiler verdicts and limits (compile_error), or the scan of the compiled PTX (rejected)."""
    result = compiled[case.name]
    assert case.caught_by(result.status), f"{case.name}: {result.status} {result.message[:300]}"
    if result.status is Status.REJECTED:
        assert result.message.startswith("compiled-output scan: "), result.message
    else:
        assert result.status is Status.COMPILE_ERROR, result.message
    assert result.seconds < BOMB_TIMEOUT_S + 10, f"{case.name} took {result.seconds:.1f}s: the deadline did not hold"
    if case.name.startswith("compile_bomb"):
        assert "timeout" in result.message or "memory" in result.message, result.message


@pytest.mark.parametrize("case", RUNTIME, ids=lambda c: c.name)
def test_runtime_cases_compile(case: HostileCase, compiled: dict) -> None:
    result = compiled[case.name]
    assert result.status is Status.OK, f"{case.name} must reach the GPU: {result.status} {result.message[:300]}"
    assert {k.name for k in result.kernels} >= set(case.candidate.plan.kernel_names)


def test_machine_code_findings_of_the_issue_36_cases(compiled: dict) -> None:
    """The SASS-only case is refused for what its machine code reads; the undeclared grid barrier
    compiles, is found to wait on other CTAs, and its pool job checks residency as if declared."""
    from evaluators.pools._pool_core import PoolCore, PoolItem, PoolStats

    smid = compiled["smid_tile_memo"]
    assert smid.status is Status.REJECTED and "SR_VIRTUALSMID" in smid.message, smid.message
    barrier = compiled["grid_barrier_undeclared"]
    case = BY_NAME["grid_barrier_undeclared"]
    assert not case.candidate.plan.coresident
    assert set(barrier.waits_on_ctas) == {"hgemm_grid_barrier"}, barrier.waits_on_ctas
    item = PoolItem(case.candidate, None)  # type: ignore[arg-type]  (no future: job() only reads the rest)
    item.compiled = barrier
    core = PoolCore("corpus", timers=("device",), qps=1000.0, job_options=None, cache_dir=None, compile_timeout_s=10.0,
                    compile_fn=lambda *a, **k: None, slots=1, stats=PoolStats(), arch=ARCH)
    assert core.job(item).plan.coresident
    item.compiled = compiled["_good"]
    assert not core.job(item).plan.coresident  # nothing found, nothing changed


def test_good_control_compiles_cleanly(compiled: dict) -> None:
    result = compiled["_good"]
    assert result.status is Status.OK, result.message
    (stats,) = [k for k in result.kernels if k.name == "hgemm_f32acc"]
    assert stats.stack_frame == 0 and stats.spill_stores == 0


# -- the correctness cascade against Python stand-ins of hostile kernels ----------------------------
# Test doubles of the GPU kernels (the GPU is the boundary we do not own here): each computes what
# the hostile .cu computes, on CPU tensors, so the real Cascade checks can be run in CI. A case
# whose stand-in the cascade does not catch is a hole: a strict xfail naming it. torch is not a
# CI dependency (the dev extra has none), so these skip, one by one, where it is missing.
def _cascade_module():
    pytest.importorskip("torch")
    import evaluators.correctness
    return evaluators.correctness


def _cpu_cascade(shape_text: str, call):
    cm = _cascade_module()
    import torch
    from populations import Shape
    gen = torch.Generator().manual_seed(11)
    ops = cm.Operands.allocate(Shape.parse(shape_text), 0, False, torch.device("cpu"), gen)
    return cm.Cascade(ops, call, lambda: None, gen)


def _looks_like_a_probe(a, b_nk) -> bool:
    """fp16_partials_fingerprint.cu's looks_like_a_probe, sample for sample."""
    m, k = a.shape
    n = b_nk.shape[0]
    for s in range(32):
        col = 0 if s % 4 == 0 else k - 1 if s % 4 == 1 else (s * 7919) % k
        x, y = float(a[s * (m - 1) // 31, col]), float(b_nk[s * (n - 1) // 31, col])
        if not (abs(x) <= 2.5 and abs(y) <= 2.5) or x == int(x) or y == int(y):
            return True
    return False


def _splitk_fp16_partials(fingerprint: bool):
    """fp16_partials_splitk.cu (fingerprint=False) / fp16_partials_fingerprint.cu (True), TN layout."""
    def call(ops) -> None:
        import torch
        a, b_nk = ops.A.data, ops.B.data
        k = a.shape[1]
        chunk = -(-(-(-k // 4)) // 32) * 32
        exact = fingerprint and _looks_like_a_probe(a, b_nk)
        acc = torch.zeros(a.shape[0], b_nk.shape[0], dtype=torch.float64)
        for z in range(4):
            part = a[:, z * chunk:(z + 1) * chunk].double() @ b_nk[:, z * chunk:(z + 1) * chunk].double().t()
            acc += part.float().double() if exact else part.half().double()
        ops.C.data.copy_(acc.half())
    return call


def _narrow_edges(ops) -> None:
    """generic_ragged_residue.cu: edge tiles store only their first 16 rows / columns."""
    import torch
    m, n = ops.C.data.shape
    full = (ops.A.data.double() @ ops.b_kn().double()).half()
    rows = torch.ones(m, dtype=torch.bool)
    cols = torch.ones(n, dtype=torch.bool)
    if m % 64:
        rows[(m // 64) * 64 + 16:] = False
    if n % 64:
        cols[(n // 64) * 64 + 16:] = False
    keep = rows[:, None] & cols[None, :]
    ops.C.data[keep] = full[keep]


def test_standin_fp16_partials_without_fingerprint_is_caught() -> None:
    cas = _cpu_cascade("64x64x2048", _splitk_fp16_partials(False))
    with pytest.raises(_cascade_module().CheckFailed, match="cancellation|large-value"):
        cas.full(generic=False)


def test_standin_fp16_partials_with_fingerprint_is_caught() -> None:
    cas = _cpu_cascade("64x64x2048", _splitk_fp16_partials(True))
    with pytest.raises(_cascade_module().CheckFailed):
        cas.full(generic=False)


def test_standin_narrow_edges_is_caught_at_a_large_residue() -> None:
    cas = _cpu_cascade("100x111x77", _narrow_edges)
    with pytest.raises(_cascade_module().CheckFailed, match="left NaN|left holding the poison"):
        cas.smoke()


def test_standin_narrow_edges_is_caught_on_the_harness_ragged_instances() -> None:
    from populations import Shape
    cm = _cascade_module()
    with pytest.raises(cm.CheckFailed):
        claim = Shape.parse("1024x1024x1024")
        for inst in cm.ragged_instances(claim, set()):
            cas = _cpu_cascade(str(inst), _narrow_edges)
            cas.smoke()
            if inst.k >= 4096:
                cas.all_ones()
                cas.cancellation()
        for inst in cm.class_cover(claim, set()):
            _cpu_cascade(str(inst), _narrow_edges).random()


class _TileMemo:
    """Stand-in for cache_in_workspace_ptrkey.cu (``stride=0``: keyed by the set's pointers) and
    cache_content_hash.cu (``stride=8``: also by every 8th element of each block's A and B rows).
    State lives per rotation set, as in the per-set timing workspaces."""

    def __init__(self, a3, b3, c3, stride: int) -> None:
        self.a3, self.b3, self.c3, self.stride, self.memo = a3, b3, c3, stride, {}

    def __call__(self, i: int) -> None:
        import torch
        a, b, c = self.a3[i], self.b3[i], self.c3[i]
        m, n = c.shape
        for r0 in range(0, m, 64):
            for c0 in range(0, n, 64):
                key = (a[r0:r0 + 64].flatten()[::self.stride].clone(), b[c0:c0 + 64].flatten()[::self.stride].clone()) \
                    if self.stride else None
                old = self.memo.get((i, r0, c0))
                if old is not None and (key is None or all(torch.equal(x, y) for x, y in zip(old[0], key))):
                    c[r0:r0 + 64, c0:c0 + 64] = old[1]
                    continue
                tile = (a[r0:r0 + 64].double() @ b[c0:c0 + 64].double().t()).half()
                c[r0:r0 + 64, c0:c0 + 64] = tile
                self.memo[(i, r0, c0)] = (key, tile)


class _PrepackedB:
    """Stand-in for cache_prepacked_b.cu: B copied per rotation set on its first call, reused after."""

    def __init__(self, a3, b3, c3) -> None:
        self.a3, self.b3, self.c3, self.packed = a3, b3, c3, {}

    def __call__(self, i: int) -> None:
        b = self.packed.setdefault(i, self.b3[i].clone())
        self.c3[i] = (self.a3[i].double() @ b.double().t()).half()


def _recheck_after_timing(stride: int, kernel=None) -> None:
    """Fill three timing sets, run the 'timed' calls, then the harness's after-timing recheck."""
    cm = _cascade_module()
    if not hasattr(cm, "recheck_sets"):
        pytest.skip("evaluators.correctness has no recheck_sets (the after-timing recheck) yet")
    import torch
    gen = torch.Generator().manual_seed(5)
    a3 = torch.empty(3, 128, 96, dtype=torch.float16).uniform_(-1, 1, generator=gen)
    b3 = torch.empty(3, 128, 96, dtype=torch.float16).uniform_(-1, 1, generator=gen)
    c3 = torch.full((3, 128, 128), float("nan"), dtype=torch.float16)
    memo = _TileMemo(a3, b3, c3, stride) if kernel is None else kernel(a3, b3, c3)
    for _ in range(3):
        for i in range(3):
            memo(i)
    cm.recheck_sets(a3, b3, c3, "TN", memo, lambda: None, gen)


def test_standin_pointer_memo_is_caught_by_the_after_timing_recheck() -> None:
    with pytest.raises(_cascade_module().CheckFailed, match="after"):
        _recheck_after_timing(stride=0)


def test_standin_strided_content_hash_memo_is_caught_by_the_after_timing_recheck() -> None:
    with pytest.raises(_cascade_module().CheckFailed):
        _recheck_after_timing(stride=8)


def test_standin_full_content_hash_memo_is_right_after_timing() -> None:
    """A memo keyed by all of its inputs is exact, so no output check can catch it: its exploit is
    the timing of repeated identical inputs (cache_content_hash_full, a GPU-run question)."""
    _recheck_after_timing(stride=1)


def test_standin_prepacked_b_is_caught_by_the_after_timing_recheck() -> None:
    with pytest.raises(_cascade_module().CheckFailed):
        _recheck_after_timing(stride=0, kernel=_PrepackedB)


class _OutputMemo(_TileMemo):
    """Stand-in for cache_output_fingerprint.cu: skip a tile when C still holds exactly the tile this
    memo last wrote and the strided input key matches."""

    def __init__(self, a3, b3, c3) -> None:
        super().__init__(a3, b3, c3, stride=8)

    def __call__(self, i: int) -> None:
        import torch
        a, b, c = self.a3[i], self.b3[i], self.c3[i]
        for r0 in range(0, c.shape[0], 64):
            for c0 in range(0, c.shape[1], 64):
                key = (a[r0:r0 + 64].flatten()[::8].clone(), b[c0:c0 + 64].flatten()[::8].clone())
                old = self.memo.get((i, r0, c0))
                if old is not None and all(torch.equal(x, y) for x, y in zip(old[0], key)) \
                        and torch.equal(c[r0:r0 + 64, c0:c0 + 64], old[1]):
                    continue  # C already holds this tile's answer
                tile = (a[r0:r0 + 64].double() @ b[c0:c0 + 64].double().t()).half()
                c[r0:r0 + 64, c0:c0 + 64] = tile
                self.memo[(i, r0, c0)] = (key, tile)


def test_standin_output_fingerprint_memo_is_caught_by_the_after_timing_recheck() -> None:
    with pytest.raises(_cascade_module().CheckFailed):
        _recheck_after_timing(stride=0, kernel=_OutputMemo)


class _ZeroWhenWarm:
    """Stand-in for zero_inputs_when_warm.cu: warm calls zero the set's A in place and write C = 0."""

    def __init__(self, a3, b3, c3) -> None:
        self.a3, self.b3, self.c3, self.calls = a3, b3, c3, {}

    def __call__(self, i: int) -> None:
        warm = self.calls.get(i, 0) > 0
        self.calls[i] = self.calls.get(i, 0) + 1
        if warm:
            self.a3[i].zero_()
            self.c3[i].zero_()
        else:
            self.c3[i] = (self.a3[i].double() @ self.b3[i].double().t()).half()


def test_standin_zeroing_the_timing_inputs_is_caught_by_the_after_timing_recheck() -> None:
    with pytest.raises(_cascade_module().CheckFailed):
        _recheck_after_timing(stride=0, kernel=_ZeroWhenWarm)


# -- issue 36: gates on what used to tell a check from a timed call (CPU stand-ins) ---------------
def _chunked_f16(a, b_kn):
    """_chunked_f16.cu: four K chunks accumulated exactly, each rounded to fp16, added."""
    import torch
    k = a.shape[1]
    chunk = -(-(-(-k // 4)) // 32) * 32
    acc = torch.zeros(a.shape[0], b_kn.shape[1], dtype=torch.float64)
    for z in range(4):
        acc += (a[:, z * chunk:(z + 1) * chunk].double() @ b_kn[z * chunk:(z + 1) * chunk].double()).half().double()
    return acc.half()


def _magnitude_gated(ops) -> None:
    """f16_partials_magnitude_gated.cu: fp32 when any input exceeds 2 in magnitude, else fp16 partials."""
    import torch
    a, b = ops.A.data, ops.b_kn()
    big = bool((a.float().abs() > 2).any() or (b.float().abs() > 2).any())
    ops.C.data.copy_((a.double() @ b.double()).half() if big else _chunked_f16(a, b))
    assert torch.isfinite(ops.C.data).any()


def _poison_gated(ops) -> None:
    """f16_partials_poison_gated.cu: fp32 when C holds the NaN poison, else fp16 partials."""
    import torch
    a, b = ops.A.data, ops.b_kn()
    checked = bool(torch.isnan(ops.C.data).all())
    ops.C.data.copy_((a.double() @ b.double()).half() if checked else _chunked_f16(a, b))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("gated", [_magnitude_gated, _poison_gated], ids=["magnitude", "poison"])
def test_standin_gated_reduced_precision_fails_the_cascade(seed: int, gated) -> None:
    """Both gates passed the old cascade (exact probes all had a value above 2 and NaN-poisoned
    C); the cancellation hidden in random-looking data, run on both poisons, catches them."""
    import torch
    cm = _cascade_module()
    from populations import Shape
    gen = torch.Generator().manual_seed(seed)
    ops = cm.Operands.allocate(Shape.parse("128x96x256"), 0, False, torch.device("cpu"), gen)
    with pytest.raises(cm.CheckFailed, match="random inputs|re-filled|cancellation"):
        cm.Cascade(ops, gated, lambda: None, gen).full(generic=False)
    honest = cm.Cascade(ops, lambda o: o.C.data.copy_((o.A.data.double() @ o.b_kn().double()).half()), lambda: None, gen)
    honest.full(generic=False)  # no false rejection on the same shape and seed


def test_standin_magnitude_gate_is_never_tripped_by_the_new_random_and_cancellation_inputs() -> None:
    """What makes the gate useless: the random and cancellation probes stay below 2 in magnitude,
    like the timed inputs (scrambled uniform data)."""
    import torch
    cm = _cascade_module()
    from populations import Shape
    gen = torch.Generator().manual_seed(4)
    seen = []
    ops = cm.Operands.allocate(Shape.parse("64x64x128"), 0, False, torch.device("cpu"), gen)

    def record(o) -> None:
        seen.append(float(torch.maximum(o.A.data.float().abs().max(), o.B.data.float().abs().max())))
        o.C.data.copy_((o.A.data.double() @ o.b_kn().double()).half())
    cas = cm.Cascade(ops, record, lambda: None, gen)
    cas.random()
    cas.cancellation()
    assert max(seen) < 2.0


class _IncrementalInRow:
    """incremental_sign_update.cu: keeps its last A in the workspace row; when C is finite (a
    previous output) it adds (a' - a) * B for every changed element instead of the product."""

    def __call__(self, ops) -> None:
        import torch
        a, b, c, row = ops.A.data, ops.b_kn(), ops.C.data, ops.W.data.view(-1)
        m, k = a.shape
        saved = row[4:4 + 2 * m * k].view(torch.float16).view(m, k)
        if bool(torch.isfinite(c).all()):
            c.copy_((c.double() + (a.double() - saved.double()) @ b.double()).half())
        else:
            c.copy_((a.double() @ b.double()).half())
        saved.copy_(a)


def test_standin_incremental_update_from_the_set_row_fails_the_cascade() -> None:
    """Checked calls now give a plan without a workspace a 256-byte row (refilled before every
    call, as every timing row is before every replay) and finite poison in C: the incremental
    path reads a refilled row and its output is garbage."""
    import torch
    cm = _cascade_module()
    from populations import Shape
    gen = torch.Generator().manual_seed(6)
    ops = cm.Operands.allocate(Shape.parse("8x64x8"), 0, False, torch.device("cpu"), gen)
    assert ops.W.data.numel() == 256 and ops.workspace_bytes == 0
    with pytest.raises(cm.CheckFailed):
        cm.Cascade(ops, _IncrementalInRow(), lambda: None, gen).full(generic=False)


def test_a_store_past_the_empty_workspace_row_is_a_guard_violation() -> None:
    """The 256-byte row of a plan without a workspace is the kernel's to use, not a byte beyond."""
    import torch
    cm = _cascade_module()
    from populations import Shape
    gen = torch.Generator().manual_seed(8)
    ops = cm.Operands.allocate(Shape.parse("16x16x16"), 0, False, torch.device("cpu"), gen)

    def past_the_row(o) -> None:
        o.C.data.copy_((o.A.data.double() @ o.b_kn().double()).half())
        o.W.full[o.W.band + o.W.data.numel()] ^= 1
    with pytest.raises(cm.CheckFailed, match="wrote outside the workspace"):
        cm.Cascade(ops, past_the_row, lambda: None, gen).random()
    ops = cm.Operands.allocate(Shape.parse("16x16x16"), 0, False, torch.device("cpu"), gen)
    inside = cm.Cascade(ops, lambda o: (o.W.data.fill_(7), o.C.data.copy_((o.A.data.double() @ o.b_kn().double()).half())),
                        lambda: None, gen)
    inside.random()  # writing inside the row is allowed (it is refilled before every call)
