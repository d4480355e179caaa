"""The one-way import rule (docs/design.md, section 2), checked on the source (no import effects)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"evo", "operators", "evaluators", "populations"}
ALLOWED = {
    "populations": set(),
    "operators": {"populations"},
    "evaluators": {"populations"},
    "evo": {"populations", "operators", "evaluators"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"package {package} has no modules"
    bad = {}
    for path in files:
        extra = _imports(path) - ALLOWED[package] - {package}
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, f"import rule broken: {bad}"


def _private_reaches(path: Path, package: str) -> list[str]:
    """Modules of *another* of our packages that ``path`` imports by a private name (``pkg._mod``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names if alias.name.startswith("_")]
    return sorted(n for n in names
                  if n.split(".")[0] in OURS - {package} and any(p.startswith("_") for p in n.split(".")[1:]))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_other_packages_are_used_through_their_public_names(package: str) -> None:
    """A package's private modules are its own: others import what its ``__init__`` re-exports."""
    bad = {str(p.relative_to(ROOT)): reach for p in sorted((ROOT / package).rglob("*.py"))
           if (reach := _private_reaches(p, package))}
    assert not bad, f"private modules reached across packages: {bad}"


def test_the_private_reach_check_can_fail(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from populations._archive import LOCK\nimport evaluators.run._lease\nfrom evo import cli\n"
                   "from operators import _base\n")
    assert _private_reaches(src, "evo") == ["evaluators.run._lease", "operators._base", "populations._archive"]
    assert _private_reaches(src, "populations") == ["evaluators.run._lease", "operators._base"]
