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


def test_any_family_its_kernel_names_and_the_tensor_pipe(tmp_path, capsys):
    """--templates: a mid-shape family's picks are labelled by template, their kernels found by the
    name the run wrote down (the main launch, after a staging pre-pass), the GMMA pipe reported."""
    import csv
    import json

    from populations import Shape, load_templates

    mod = _module()
    templates = load_templates()
    ragged = Shape.parse("777x1536x2883")  # K % 8 != 0: a staging pre-pass, then the GEMM
    picks = mod.contenders(ragged, templates, ("sm90_wgmma",), picks=2)
    assert len(picks) == 2 and all(label.startswith("sm90_wgmma {") for label, _ in picks)
    assert {mod.kernel_prefix(c, ragged) for _, c in picks} == {"evo_wgmma"}
    cols = ["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum",
            "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]
    rows = [["", "", "", "", "usecond", "%"], ["0", "evo_wgmma", "(132, 1, 1)", "(384, 1, 1)", "40.0", "71.5"],
            ["1", "evo_wgmma", "(132, 1, 1)", "(384, 1, 1)", "42.0", "70.5"],
            ["2", "sm90_xmma_gemm_f16f16", "(8, 16, 1)", "(384, 1, 1)", "36.0", "80.0"]]
    with open(tmp_path / "raw.csv", "w", newline="") as f:
        csv.writer(f).writerows([cols, *rows])
    label = f"evo {picks[0][0]}"
    order = [{"shape": str(ragged), "label": label, "graph_us": 41.0, "prefix": "evo_wgmma"}] * 2 + \
            [{"shape": str(ragged), "label": "cuBLAS TN", "graph_us": 36.0}]
    (tmp_path / "order.json").write_text(json.dumps(order))
    assert mod.summarize(tmp_path / "raw.csv", tmp_path / "order.json") == 0
    out = capsys.readouterr().out
    table = {r.split(" | ")[1]: r.split(" | ") for r in out.splitlines() if r.startswith("| 777")}
    assert table[label][2] == "evo_wgmma" and float(table[label][3]) == 41.0 and float(table[label][8]) == 71.0
    assert float(table["cuBLAS TN"][8]) == 80.0


def test_explicit_knob_sets_join_the_contenders(capsys):
    """``--knobs TEMPLATE:K=V,...`` profiles a named knob set beside the picks (cuBLAS's own swapped
    128 x 72 at 777x1536x2880); a set invalid at a shape is said and skipped there; a malformed
    one is refused."""
    import pytest

    from populations import Shape, load_templates

    dp = _module()
    templates = load_templates()
    spec = "sm90_wgmma:SWAP=true,BM=128,BN=72,STAGES=8"
    assert dp.parse_knobs(spec) == ("sm90_wgmma", {"SWAP": True, "BM": 128, "BN": 72, "STAGES": 8})
    (label, cand), = dp.explicit(Shape.parse("777x1536x2880"), templates, [spec])
    assert cand.template == "sm90_wgmma" and cand.knobs["BN"] == 72 and cand.knobs["SWAP"] is True
    assert '"STAGES": 8' in label
    assert dp.explicit(Shape.parse("777x1536x2880:NN"), templates, [spec]) == []  # SWAP is TN-only
    assert "not valid there" in capsys.readouterr().out
    for bad in ("sm90_wgmma:BN", ":BN=8", "nosuch:BN=8"):
        with pytest.raises(ValueError):
            dp.explicit(Shape.parse("777x1536x2880"), templates, [bad])


def test_a_staged_call_is_its_pre_pass_and_its_gemm(capsys):
    """A staged evo call is two kernels (the staging pre-pass, then the GEMM): the 2026-12-06 profile
    of 2000x3000x1001 (two staged picks, the in-place RAGGED kernel, cuBLAS) has every contender found,
    the staged ones' time the sum of both kernels, their other columns the GEMM's. Its order file
    predates the written-down sequences (the name of the last kernel only)."""
    mod = _module()
    assert mod.summarize(FIG / "mid_prof_ragged_h100_2026-12-06.csv.gz",
                         FIG / "mid_prof_ragged_h100_2026-12-06_order.json") == 0
    out, err = capsys.readouterr()
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 4 and not any("not found" in r for r in rows) and "not matched" not in err
    staged, ragged, cublas = rows[0], rows[2], rows[3]
    assert staged[2] == "evo_stage2 + evo_wgmma" and 32.0 < float(staged[3]) < 33.0  # ~9.3 + ~23.2 us
    assert float(staged[8]) > 70  # the GEMM's tensor pipe, not the pre-pass's 0
    assert ragged[2] == "evo_wgmma_ragged" and float(ragged[3]) > 100 and "RAGGED\": 1" in ragged[1]
    assert cublas[1] == "cuBLAS TN" and cublas[2].startswith("cutlass::")


def test_written_down_sequences_match_whole_calls(tmp_path, capsys):
    """With the sequence in the order file, a call is matched kernel by kernel (its time the sum), and
    cuBLAS's kernels end where the next contender's first kernel (its pre-pass) starts."""
    import csv
    import json

    mod = _module()
    cols = ["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum"]
    names = [("evo_stage2", 5.0), ("evo_wgmma", 20.0), ("evo_stage2", 5.0), ("evo_wgmma", 22.0),
             ("sm90_xmma_gemm", 30.0), ("splitKreduce", 2.0), ("evo_stage2", 6.0), ("evo_wgmma", 21.0)]
    rows = [["", "", "", "", "usecond"]] + [[str(i), n, "(1, 1, 1)", "(1, 1, 1)", str(t)] for i, (n, t) in enumerate(names)]
    with open(tmp_path / "raw.csv", "w", newline="") as f:
        csv.writer(f).writerows([cols, *rows])
    seq = {"prefix": "evo_wgmma", "kernels": ["evo_stage2", "evo_wgmma"]}
    order = [{"shape": "9x9x9", "label": "evo a", "graph_us": 1.0, **seq}] * 2 + \
            [{"shape": "9x9x9", "label": "cuBLAS TN", "graph_us": 1.0},
             {"shape": "9x9x9", "label": "evo b", "graph_us": 1.0, **seq}]
    (tmp_path / "order.json").write_text(json.dumps(order))
    assert mod.summarize(tmp_path / "raw.csv", tmp_path / "order.json") == 0
    table = {r.split(" | ")[1]: r.split(" | ") for r in capsys.readouterr().out.splitlines() if r.startswith("| 9x9x9")}
    assert float(table["evo a"][3]) == 26.0 and float(table["cuBLAS TN"][3]) == 32.0 and float(table["evo b"][3]) == 27.0
    assert table["cuBLAS TN"][2] == "sm90_xmma_gemm + splitKreduce"
