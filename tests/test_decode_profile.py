"""bench/decode_profile.py's CPU side: ncu's raw page joined to the launch order by kernel name
(the 2026-12-03 H200 profile in results is the input)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIG = ROOT / "results"


def _module():
    spec = importlib.util.spec_from_file_location("decode_profile", ROOT / "bench" / "decode_profile.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    spec.loader.exec_module(mod)
    return mod


def test_summarize_joins_every_contender_and_adds_cublas_split_k_kernels(capsys):
    mod = _module()
    assert mod.summarize(FIG / "decode_profile_h200_2026-12-03.csv.gz",
                         FIG / "decode_profile_h200_2026-12-03_order.json") == 0
    out, err = capsys.readouterr()
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 19 and "not matched" not in err and not any("not found" in r for r in rows)
    by = {(r[0].strip("| "), r[1].split(" {")[0]): r for r in rows}
    swab = by[("16x6144x4096", "evo swab")]
    assert swab[2] == "evo_swab" and abs(float(swab[3]) - 17.76) < 0.01  # median of 18.40, 17.73, 17.76 us
    cublas = by[("1x3072x3072", "cuBLAS TN")]  # a split-K GEMM plus its reduction, one launch
    assert "splitKreduce" in cublas[2] and abs(float(cublas[3]) - (8.608 + 3.424)) < 0.01


def test_prefix_sends_cublas_to_the_catch_all():
    mod = _module()
    assert mod._prefix("evo gemv {}") == "evo_gemv" and mod._prefix("peer m1,8") == "void mma_tn"
    assert mod._prefix("cuBLAS TN") is None
