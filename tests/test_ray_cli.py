"""``evo run --ray``: flags and TOML choose the Ray pool; a missing ray is a clear one-line error,
never a traceback (a cluster without GPUs: tests/test_ray_pool.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from evo._cmd_run import make_pool
from evo._config import ConfigError, PoolConfig, load_config, merge
from evo.cli import main


def test_the_flag_and_the_config_file_name_the_cluster(tmp_path: Path) -> None:
    cfg = merge({}, {"shapes": ["64x64x64"], "archive": str(tmp_path / "a"), "pool": {"ray": "auto"}})
    assert cfg.pool.ray == "auto" and cfg.pool.kind == "local"
    toml = tmp_path / "run.toml"
    toml.write_text('shapes = ["64x64x64"]\narchive = "a"\n[pool]\nray = "10.0.0.1:6379"\n')
    assert merge(load_config(toml), {}).pool.ray == "10.0.0.1:6379"
    assert merge({}, {"shapes": ["64x64x64"], "archive": str(tmp_path / "a")}).pool.ray == ""  # local pool
    with pytest.raises(ConfigError, match="pool.ray"):
        merge({}, {"shapes": ["64x64x64"], "archive": str(tmp_path / "a"),
                   "pool": {"ray": "auto", "kind": "fake_pool:FakeEvaluatorPool"}})


def test_without_ray_installed_evo_run_says_what_to_install(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install"):
        make_pool(PoolConfig(ray="auto"))
    code = main(["run", "--shape", "64x64x64", "--archive", str(tmp_path / "a"), "--ray", "auto",
                 "--progress", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "evo run: error: --ray auto: the Ray evaluator pool needs the ray package" in err
    assert "Traceback" not in err

