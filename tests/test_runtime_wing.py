"""The runtime wing (issue 37): a process that only loads an exported library needs torch alone.

Run in a real clean environment: a fresh ``venv`` without the system's site-packages (so no
msgpack, no numpy, no torch), with only this checkout on ``sys.path``. ``import evo`` and
``import evo.torch`` must work there, load nothing of the search side, and ``load_library`` must
read a manifest and say why it cannot run (no torch) instead of failing.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    for name in ("msgpack", "torch", "numpy"):
        try:
            __import__(name)
            print(json.dumps({"error": name + " is importable: not a clean environment"})); sys.exit(0)
        except ImportError:
            pass
    import evo, evo.runtime, evo.torch
    lib = evo.load_library(sys.argv[2])
    ours = sorted(m for m in sys.modules if m.split(".")[0] in ("evo", "populations", "operators", "evaluators"))
    print(json.dumps({"modules": ours, "active": lib.active, "reason": lib.reason, "kernels": len(lib.kernels)}))
''')


def test_import_evo_needs_neither_msgpack_nor_the_search_side(tmp_path: Path) -> None:
    env_dir = tmp_path / "clean"
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "manifest.json").write_text(json.dumps({
        "format": "evo-export/1", "arch": "sm_90a", "library": "libevo_hgemm.so",
        "kernels": [{"m": 8, "n": 64, "k": 64, "layout": "TN", "symbol": "evo_hgemm_x", "workspace_bytes": 0}]}))
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", PROBE, str(ROOT), str(lib)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" not in got, got
    assert not [m for m in got["modules"] if not (m == "evo" or m.startswith(("evo.runtime", "evo.torch")))], got["modules"]
    assert got["active"] is False and got["reason"] == "torch is not installed" and got["kernels"] == 1
