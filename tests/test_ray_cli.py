"""``evo run --ray``: flags and TOML choose the Ray pool; a missing ray is a clear one-line error,
never a traceback (a cluster without GPUs: tests/test_ray_pool.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evo.search._config import ConfigError, load_config, merge

ROOT = Path(__file__).resolve().parents[1]


def test_the_flag_and_the_config_file_name_the_cluster(tmp_path: Path) -> None:
    cfg = merge({}, {"shapes": ["64x64x64"], "archive": str(tmp_path / "a"), "pool": {"ray": "auto"}})
    assert cfg.pool.ray == "auto"
    toml = tmp_path / "run.toml"
    toml.write_text('shapes = ["64x64x64"]\narchive = "a"\n[pool]\nray = "10.0.0.1:6379"\n')
    assert merge(load_config(toml), {}).pool.ray == "10.0.0.1:6379"
    assert merge({}, {"shapes": ["64x64x64"], "archive": str(tmp_path / "a")}).pool.ray == ""  # local pool
    toml.write_text('shapes = ["64x64x64"]\narchive = "a"\n[pool]\nray = "auto"\nkind = "fake_pool:FakeEvaluatorPool"\n')
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['kind'\] in \[pool\]"):  # test pools come through the library
        load_config(toml)


def test_without_ray_installed_evo_run_says_what_to_install(tmp_path: Path) -> None:
    # in a process where `import ray` fails (not this one: Ray's threads import lazily)
    code = ("import sys; sys.modules['ray'] = None; from evo.cli import main; "
            f"sys.exit(main(['run', '--shape', '64x64x64', '--archive', {str(tmp_path / 'a')!r}, '--ray', 'auto', "
            "'--progress', 'none']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "evo run: error: --ray auto: the Ray evaluator pool needs the ray package" in proc.stderr
    assert "pip install" in proc.stderr and "Traceback" not in proc.stderr
