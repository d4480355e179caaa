"""Operator registry: names to classes and default options, read from ``operators/settings.toml``.

Operators are looked up by name (``get_operator("tpe", n_startup_trials=5)``) so the engine's
configuration can name them as data. Optional dependencies are checked without importing them:
an operator whose packages are missing is left out of :func:`available_operators` and
:func:`get_operator` raises an ImportError naming the pip extra to install.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ._base import Operator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["OperatorSpec", "register_operator", "get_operator", "available_operators", "registered_operators",
           "SETTINGS_FILE"]

SETTINGS_FILE = Path(__file__).with_name("settings.toml")


@dataclass(frozen=True)
class OperatorSpec:
    """How to build one named operator."""

    name: str
    factory: Callable[..., Operator] | str        # a class, or "module:Class" inside this package
    requires: tuple[str, ...] = ()
    extra: Optional[str] = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def missing(self) -> list[str]:
        return [pkg for pkg in self.requires if importlib.util.find_spec(pkg) is None]

    def resolve(self) -> Callable[..., Operator]:
        if not isinstance(self.factory, str):
            return self.factory
        module, _, cls = self.factory.partition(":")
        if not module or not cls or "." in module:
            raise ValueError(f"operator {self.name}: class must be 'module:Class' inside operators, got {self.factory!r}")
        return getattr(importlib.import_module(f"{__package__}.{module}"), cls)


_REGISTRY: dict[str, OperatorSpec] = {}
_LOADED = False


def _load_settings() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    with open(SETTINGS_FILE, "rb") as fh:
        data = tomllib.load(fh)
    for name, table in data.items():
        unknown = set(table) - {"class", "requires", "extra", "options"}
        if unknown or "class" not in table:
            raise ValueError(f"{SETTINGS_FILE}: [{name}] needs 'class' and allows only requires/extra/options, "
                             f"got {sorted(table)}")
        _REGISTRY.setdefault(name, OperatorSpec(name, table["class"], tuple(table.get("requires", ())),
                                                table.get("extra"), dict(table.get("options", {}))))


def register_operator(name: str, factory: Callable[..., Operator] | str, *, requires: tuple[str, ...] = (),
                      extra: Optional[str] = None, replace: bool = False, **options: Any) -> None:
    """Register ``factory`` (called with ``name=`` and the options) under ``name``."""
    _load_settings()
    if name in _REGISTRY and not replace:
        raise ValueError(f"operator {name!r} is already registered (pass replace=True to override it)")
    _REGISTRY[name] = OperatorSpec(name, factory, tuple(requires), extra, dict(options))


def registered_operators() -> list[str]:
    """Every registered name, whether or not its optional dependencies are installed."""
    _load_settings()
    return sorted(_REGISTRY)


def available_operators() -> list[str]:
    """Registered names whose dependencies are installed here."""
    _load_settings()
    return sorted(name for name, spec in _REGISTRY.items() if not spec.missing())


def get_operator(name: str, **options: Any) -> Operator:
    """A new operator instance: the registered defaults updated with ``options``."""
    _load_settings()
    spec = _REGISTRY.get(name)
    if spec is None:
        raise KeyError(f"unknown operator {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    missing = spec.missing()
    if missing:
        hint = f"pip install 'evo-hgemm[{spec.extra}]'" if spec.extra else f"pip install {' '.join(missing)}"
        raise ImportError(f"operator {name!r} needs {', '.join(missing)}, not installed here: {hint}")
    kwargs = {**spec.options, **options, "name": name}
    return spec.resolve()(**kwargs)
