"""The one-way import rule (docs/design.md, section 2), checked on the source (no import effects)."""
from __future__ import annotations

import ast
import sys
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


def _evo_modules_imported(path: Path) -> set[str]:
    """The evo modules ``path`` (a file under evo/) imports, absolute or relative, as dotted names."""
    pkg = list(path.relative_to(ROOT).with_suffix("").parts)
    if pkg[-1] == "__init__":
        pkg = pkg[:-1]
    else:
        pkg = pkg[:-1]  # a module's relative imports start at its package
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "evo")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "evo":
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def test_the_runtime_wing_imports_nothing_else_of_ours() -> None:
    """evo/runtime (the loader) imports none of our packages and no other part of evo; evo.torch
    imports only the runtime; evo/__init__ only the runtime, so ``import evo`` in a serving
    process loads neither msgpack nor the search side (tests/test_runtime_wing.py runs it)."""
    bad = {}
    for path in sorted((ROOT / "evo" / "runtime").rglob("*.py")):
        if _imports(path) - {"evo"} or {m for m in _evo_modules_imported(path) if not m.startswith("evo.runtime")}:
            bad[str(path.relative_to(ROOT))] = sorted(_imports(path) | _evo_modules_imported(path))
    for path in [ROOT / "evo" / "__init__.py", *sorted((ROOT / "evo" / "torch").rglob("*.py"))]:
        outside = {m for m in _evo_modules_imported(path) if not m.startswith(("evo.runtime", "evo.torch"))}
        if _imports(path) - {"evo"} or outside:
            bad[str(path.relative_to(ROOT))] = sorted(outside | (_imports(path) - {"evo"}))
    assert not bad, f"the runtime wing reaches past itself: {bad}"


def test_evo_rl_is_used_through_its_public_names() -> None:
    """Outside evo/rl, the product and the benchmarks import what ``evo.rl`` exports, never its
    private modules (``evo.rl._adapters`` ...): callers see one face, and the package can move
    its insides without breaking them."""
    bad = {}
    for path in [*sorted((ROOT / "evo").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]:
        if (ROOT / "evo" / "rl") in path.parents:
            continue
        reach = sorted(m for m in _evo_modules_imported(path) if m.startswith("evo.rl._")) if path.is_relative_to(
            ROOT / "evo") else sorted(n for n in _abs_imports(path) if n.startswith("evo.rl._"))
        if reach:
            bad[str(path.relative_to(ROOT))] = reach
    assert not bad, f"private modules of evo.rl imported from outside: {bad}"


def _abs_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_no_import_cycles_between_our_modules() -> None:
    """No two of our modules import each other, directly or round a loop, not even through a
    function-local import (which only hides a cycle): scripts/structure_figures.py finds them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("structure_figures", ROOT / "scripts" / "structure_figures.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fig = mod.figures(ROOT)
    assert fig["cycles"] == [], fig["cycles"]
    assert fig["private_cross_imports"] == [], fig["private_cross_imports"]
    # the finder itself: a two-module loop is one cycle
    assert mod._cycles({"a": ["b"], "b": ["a"], "c": ["a"]}) == [["a", "b"]]


#: evo's wings, lowest first: a wing may import the wings below it, never one above
WINGS = ("runtime", "torch", "export", "search", "rl", "cli")
WING_RANK = {"runtime": 0, "torch": 1, "export": 2, "search": 3, "rl": 4, "cli": 5}


def test_each_wing_of_evo_imports_only_wings_below_it() -> None:
    """evo/runtime < evo/torch < evo/export < evo/search < evo/rl < evo/cli (docs/design.md): the
    loader needs nothing else of evo, the export and search wings do not know the CLI or RL, RL
    does not know the CLI. Relative and absolute imports count, function-local ones too."""
    assert sorted(p.name for p in (ROOT / "evo").iterdir() if p.is_dir() and (p / "__init__.py").exists()) == sorted(WINGS)
    assert sorted(p.name for p in (ROOT / "evo").glob("*.py")) == ["__init__.py", "__main__.py"], \
        "evo's top level holds only __init__ and __main__: a module goes in a wing"
    bad = {}
    for wing in WINGS:
        for path in sorted((ROOT / "evo" / wing).rglob("*.py")):
            above = sorted({m for m in _evo_modules_imported(path)
                            if len(m.split(".")) > 1 and m.split(".")[1] in WING_RANK
                            and WING_RANK[m.split(".")[1]] > WING_RANK[wing]})
            if above:
                bad[str(path.relative_to(ROOT))] = above
    assert not bad, f"a wing imports one above it: {bad}"


def _unit(module: str) -> str:
    """The owner of a dotted module name: a package, or a wing of evo (``evo.search``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "evo" and len(parts) > 1 else parts[0]


def _private_attributes(path: Path) -> list[str]:
    """Private attributes (``x._name``, not dunders) read through a name imported from another
    package or another wing of evo: ``from operators import ModelBandit; ModelBandit._draw``,
    ``import evaluators; evaluators.run._lease``. What an object returned by a call holds cannot be
    seen without running it; this is the part a reading of the source can check."""
    rel = path.relative_to(ROOT).with_suffix("")
    own = _unit(".".join(rel.parts))
    tree = ast.parse(path.read_text(), filename=str(path))
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OURS and _unit(a.name) != own:
                    # "import evaluators.run as r" binds r to evaluators.run, "import evaluators.run" binds evaluators
                    bound, target = (a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2
                    names[bound] = target
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in OURS and _unit(node.module) != own:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            chain, v = [node.attr], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in names:
                found.add(".".join([names[v.id], *reversed(chain)]))
    return sorted(found)


def test_no_private_attribute_is_read_across_packages_or_wings() -> None:
    bad = {str(p.relative_to(ROOT)): hits for pkg in sorted(OURS) for p in sorted((ROOT / pkg).rglob("*.py"))
           if (hits := _private_attributes(p))}
    assert not bad, f"private attributes read across packages or wings: {bad}"


def test_the_private_attribute_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "evo" / "cli"
    pkg.mkdir(parents=True)
    src = pkg / "m.py"
    src.write_text("import evaluators\nfrom operators import ModelBandit as MB\nfrom evo.search import Engine\n"
                   "from evo.cli import x\n"
                   "evaluators.run._lease\nMB._draw()\nEngine._tick\nx._own\nMB.__name__\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _private_attributes(src) == ["evaluators.run._lease", "evo.search.Engine._tick", "operators.ModelBandit._draw"]
