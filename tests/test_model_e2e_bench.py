"""bench/model_e2e_bench.py in its CPU smoke mode (--tiny): a tiny random Llama with a static KV
cache, decoded greedily before and after evo.torch.patch (through a named library double, so every
patched call is the native operator's fallback), the JSON and table written, tokens identical."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "model_e2e_bench.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("model_e2e_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_tiny_mode_end_to_end(tmp_path: Path) -> None:
    bench = _bench()
    assert bench.main(["--tiny", "--batches", "1,2", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "e2e.json").read_text())
    (row,) = doc["rows"]
    assert row["model"] == "tiny-llama" and row["patched"] == 2 * 7 + 1 and row["left"] == 0  # 7 per layer + lm_head
    assert row["tokens_identical"] == {"1": True, "2": True}
    assert row["prefill_logits_rel_diff"] == 0.0  # the fallback is at::linear itself
    for side in ("before", "after"):
        assert set(row[side]["decode"]) == {"1", "2"} and row[side]["decode"]["1"]["tokens_per_s"] > 0
        assert row[side]["prefill"]["tokens"] == 16 and row[side]["prefill"]["ms"] > 0
    table = (tmp_path / "e2e.md").read_text().splitlines()
    assert len(table) == 2 + 2 and table[2].startswith("| tiny-llama | 1 |")


def test_gemm_kernel_names() -> None:
    is_gemm = _bench().is_gemm
    for name in ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64", "cutlass_80_tensorop_h16816gemm_128x64",
                 "evo_1x4096x4096_TN_f32_hgemm_wgmma", "gemv2T_kernel_val<int, int, __half>", "ampere_fp16_s16816gemm",
                 "nvjet_hsh_128x64_64x5_1x2_h_bz_coopA_TNN", "evo_gemv"):
        assert is_gemm(name), name
    for name in ("elementwise_kernel", "pytorch_flash::flash_fwd_kernel", "triton_poi_fused_add_0", "reduce_kernel",
                 "fmha_cutlassF_f16_aligned_64x64_rf_sm80", "cudnn_generated_fort_native_sdpa_sm90_knob_7"):
        assert not is_gemm(name), name
