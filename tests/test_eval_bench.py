"""bench/eval_bench.py's report on CPU: NVML averaged over the evaluation phase as well as the
whole wall, the server timer's gaps, the repeatability table (cuBLAS and speedup spreads beside
the device one, the 2% target called missed when it is). The GPU worker is the test double of
tests/fake_gpu_worker.py (the boundary we don't own); compiles are real."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from evaluators import LocalPool
from evaluators.run._builtin_kernels import naive_candidate
from populations import Shape

ROOT = Path(__file__).resolve().parents[1]
FAKE = "fake_gpu_worker:make_handler"


def _bench():
    spec = importlib.util.spec_from_file_location("eval_bench", ROOT / "bench" / "eval_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_nvml_mean_over_a_window_uses_only_its_samples():
    sampler = _bench().UtilSampler()
    sampler.times, sampler.samples = [1.0, 2.0, 3.0, 4.0], [0.0, 50.0, 100.0, 10.0]
    assert sampler.mean() == 40.0 and sampler.mean(2.0, 3.0) == 75.0 and sampler.mean(1.5, None) == 160.0 / 3
    assert sampler.mean(5.0, 6.0) is None


def test_throughput_reports_the_evaluation_phase_apart_from_the_lead_in(tmp_path):
    bench = _bench()
    shape = Shape.parse("64x64x64:TN")
    cands = [naive_candidate((shape,), tile=t) for t in (8, 16, 32)]
    deadlines = {"startup": 30.0, "probe": 10.0, "load": 5.0, "correctness": 5.0, "timing": 5.0}
    with LocalPool(gpus=[0], compile_workers=2, target=FAKE, log_dir=str(tmp_path), deadlines=deadlines,
                   cache_dir=str(tmp_path / "cache")) as pool:
        res = bench.throughput(pool, cands)
    assert res["statuses"] == {"ok": 3} and res["candidates"] == 3
    assert 0 < res["eval_phase_s"] <= res["wall_s"] and 0 < res["lead_in_s"] < res["wall_s"]
    assert res["server_gaps_s"] == 0.0 and res["server_gaps_share"] == 0.0  # the double reports no server timer
    assert "nvml_util_eval" in res and "nvml_util_mean" in res


def _run(median, base, clock):
    return {"median_us": median, "baseline_us": base, "speedup": base / median, "sm_clock_mhz": clock,
            "settle_clocks_mhz": [1980, clock], "device_warmup_s": 0.2, "rotations_us": [median, median * 1.01]}


def test_report_prints_both_nvml_figures_and_calls_a_missed_spread_missed(capsys):
    bench = _bench()
    runs = [_run(210.1, 208.8, 1875), _run(212.7, 211.0, 1965), _run(207.0, 204.5, 1950)]
    meds = [r["median_us"] for r in runs]
    rep = {"candidate": "sm90_wgmma", "knobs": {}, "shape": "4096x4096x4096:TN:f32", "runs": runs, "rotations": 2,
           "spread": bench.spread(meds), "baseline_spread": bench.spread([r["baseline_us"] for r in runs]),
           "speedup_spread": bench.spread([r["speedup"] for r in runs]), "spread_inside_start_max": 0.01}
    shape = "64x128x64:TN"
    row = {"candidates": 200, "per_minute": 101.0, "compile_s": 90.0, "correctness_s": 6.0, "timing_s": 80.0,
           "busy_fraction": 0.99, "nvml_util_eval": 71.5, "nvml_util_mean": 64.0, "lead_in_s": 3.2,
           "statuses": {"ok": 200}, "phases_s": {"device": 40.0, "offline": 1.0}, "memo_pass": {"run": 3},
           "eval_phase_s": 115.0, "server_gaps_s": 6.0, "server_gaps_share": 6.0 / 115.0, "device_warmup_s": 6.1}
    bench.print_report({str(Shape.parse(shape)): row, "repeatability": rep}, [shape])
    out = capsys.readouterr().out
    assert "nvml% eval" in out and "nvml% wall" in out
    row_line = next(line for line in out.splitlines() if line.startswith(shape))
    assert row_line.split()[7:10] == ["72", "64", "3.2"]  # eval-phase NVML, whole-wall NVML, lead-in
    assert "server timer gaps 6.00 s = 5.2%" in out
    assert "spread of device medians 2.71% (target < 2%: MISSED)" in out
    assert "cuBLAS medians 3.11%" in out and "speedup" in out
    rep["runs"] = runs[:1] * 2
    rep["spread"] = 0.0
    bench.print_report({str(Shape.parse(shape)): row, "repeatability": rep}, [shape])
    assert "(target < 2%: met)" in capsys.readouterr().out


def test_the_report_says_where_the_timed_rounds_went_per_candidate(capsys):
    """The device timer's loop figures (LoopCost, summed over candidates) come out per candidate,
    in ms, beside the replay and sync counts; a report without them says so."""
    bench = _bench()
    shape = "4096x4096x4096:TN"
    row = {"candidates": 120, "per_minute": 130.0, "compile_s": 118.0, "correctness_s": 16.4, "timing_s": 35.3,
           "busy_fraction": 1.0, "nvml_util_eval": 74.7, "nvml_util_mean": 73.6, "lead_in_s": 1.2,
           "statuses": {"ok": 120}, "memo_pass": {}, "eval_phase_s": 52.9, "server_gaps_s": 0.8,
           "server_gaps_share": 0.015, "device_warmup_s": 5.3, "device_replays": 3720, "device_syncs": 1896,
           "phases_s": {"device_sample": 16.8, "device_sample_gpu": 6.0, "device_sample_perturb_gpu": 2.4,
                        "device_sample_perturb_host": 1.2, "device_sample_sync": 3.6}}
    bench.print_report({str(Shape.parse(shape)): row}, [shape])
    line = next(x for x in capsys.readouterr().out.splitlines() if "timed rounds" in x)
    assert "wall 140.0" in line and "replay events 50.0" in line and "perturbation GPU 20.0" in line
    assert "host: perturbation 10.0" in line and "blocked in syncs 30.0" in line and "notes" not in line
    assert "replays 31.0, syncs 15.8 a candidate" in line
    assert bench.rounds_line({"candidates": 3, "phases_s": {"device": 1.0}}) == "timed rounds: no device timer figures"


def test_host_microbench_runs_on_cpu_and_shares_the_tensor_maps():
    pytest.importorskip("torch")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "eval_bench.py"), "--host-microbench"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    got = json.loads(out.stdout)
    sm90 = got["sm90_wgmma"]
    assert sm90["tensor_maps"] == 2 and sm90["encodes"] == 2 * got["n_sets"]  # once per set, not per candidate
    assert len(sm90["us_per_call"]) == got["candidates"] and all(x > 0 for x in sm90["us_per_call"])


def test_plot_draws_throughput_and_repeatability_configs(tmp_path):
    import json

    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("eval_bench_plot", ROOT / "bench" / "eval_bench_plot.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    rep = {"medians_us": [100.0, 101.0, 99.5], "spread": 0.015}
    report = {"64x128x64:TN:f32": {"per_minute": 160.0, "nvml_util_eval": 81.0},
              "repeatability": {**rep, "configs": {"run": rep, "precise": {"medians_us": [100.0, 100.2, 99.9],
                                                                         "spread": 0.003}}}}
    path = tmp_path / "eb.json"
    path.write_text(json.dumps(report))
    runs = [plot.load(f"s4={path}")]
    assert plot.throughput_rows(runs) == [("64x128x64", "s4", 160.0, 81.0)]
    assert [s[0] for s in plot.repeat_series(runs)] == ["s4 run", "s4 precise"]
    out = tmp_path / "eb.png"
    assert plot.main(["--run", f"s4={path}", "--out", str(out)]) == 0 and out.stat().st_size > 10_000
    with pytest.raises(SystemExit):
        plot.main(["--run", str(path), "--out", str(out)])  # no LABEL=
    (tmp_path / "empty.json").write_text("{}")
    assert plot.main(["--run", f"x={tmp_path / 'empty.json'}", "--out", str(out)]) == 1
