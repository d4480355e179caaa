"""Load a script of bench/ as a module (bench/ is not a package), for the tests of its main()."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(name: str) -> ModuleType:
    """``bench/<name>.py``, executed afresh as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def refuses(name: str, argv: list[str], capsys) -> None:
    """``bench/<name>.py``'s main(argv) exits 2 with one line on stderr that names the script."""
    assert load(name).main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{name}:"), err
