"""Structure figures of the product code (issue 37's before/after table), read from the source.

    python scripts/structure_figures.py [--root DIR] [--json]

Per package folder (``evo``, ``evo/search``, ``evaluators/run`` ...): modules and lines; the
largest module and function; imports of another package's private module (``pkg._mod``, and
``evo.rl._mod`` from outside ``evo/rl``); and import cycles between modules (every import, the
function-local ones included, since those are how a cycle hides). Nothing is imported or run.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

PACKAGES = ("populations", "operators", "evaluators", "evo")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(root: Path, path: Path, tree: ast.AST, known: set[str]) -> list[str]:
    """The known modules ``path`` imports (``from pkg import mod`` resolved to the module)."""
    own = _module_name(root, path).split(".")
    pkg = own if path.name == "__init__.py" else own[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[:len(pkg) - node.level + 1]) if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            out.append(mod)
            out += [f"{mod}.{a.name}" for a in node.names]
    return sorted({m for m in out if m in known})


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def figures(root: Path) -> dict[str, Any]:
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    known = {_module_name(root, p) for p in files}
    folders: dict[str, dict[str, Any]] = defaultdict(lambda: {"modules": 0, "lines": 0})
    largest_mod, largest_fn = ("", 0), ("", 0)
    private, graph = [], {}
    for p in files:
        text = p.read_text()
        tree = ast.parse(text)
        rel = str(p.relative_to(root))
        lines = len(text.splitlines())
        f = folders[str(p.parent.relative_to(root))]
        f["modules"] += 1
        f["lines"] += lines
        largest_mod = max(largest_mod, (rel, lines), key=lambda x: x[1])
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                largest_fn = max(largest_fn, (f"{rel}:{node.name}", node.end_lineno - node.lineno + 1), key=lambda x: x[1])
        name = _module_name(root, p)
        graph[name] = [t for t in _targets(root, p, tree, known) if t != name]
        for t in graph[name]:
            parts = t.split(".")
            other_pkg = parts[0] != name.split(".")[0]
            into_rl = t.startswith("evo.rl.") and not name.startswith("evo.rl")
            if (other_pkg or into_rl) and any(x.startswith("_") for x in parts[1:]):
                private.append(f"{name} -> {t}")
    # a package's __init__ importing its own submodules is not a cycle worth naming
    pruned = {v: [w for w in ws if not (v.startswith(w + ".") and (root / w.replace(".", "/") / "__init__.py").exists())]
              for v, ws in graph.items()}
    return {"folders": dict(sorted(folders.items())), "largest_module": largest_mod, "largest_function": largest_fn,
            "private_cross_imports": sorted(set(private)), "cycles": _cycles(pruned)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    fig = figures(args.root)
    if args.json:
        print(json.dumps(fig, indent=1))
        return 0
    for folder, f in fig["folders"].items():
        print(f"{folder:<28} {f['modules']:>3} modules {f['lines']:>6} lines")
    print(f"largest module: {fig['largest_module'][0]} ({fig['largest_module'][1]} lines)")
    print(f"largest function: {fig['largest_function'][0]} ({fig['largest_function'][1]} lines)")
    print(f"private cross-package imports: {len(fig['private_cross_imports'])}")
    for line in fig["private_cross_imports"]:
        print(f"  {line}")
    print(f"import cycles: {len(fig['cycles'])}")
    for c in fig["cycles"]:
        print(f"  {' <-> '.join(c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
