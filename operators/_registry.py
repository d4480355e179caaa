"""Operator registry: names to classes and default options, read from ``operators/settings.toml``
into a :class:`populations.Registry` (the one registry pattern of every plug-in kind).

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

from populations import Registry

from ._base import Operator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["OPERATORS", "OperatorSpec", "register_operator", "get_operator", "available_operators",
           "registered_operators", "SETTINGS_FILE"]

SETTINGS_FILE = Path(__file__).with_name("settings.toml")


@dataclass(frozen=True)
class OperatorSpec:
    """How to build one named operator: the factory the registry holds under its name."""

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

    def __call__(self, **options: Any) -> Operator:
        """A new operator: the defaults updated with ``options``; an ImportError naming the pip
        extra when its optional dependencies are missing."""
        missing = self.missing()
        if missing:
            hint = f"pip install 'evo-hgemm[{self.extra}]'" if self.extra else f"pip install {' '.join(missing)}"
            raise ImportError(f"operator {self.name!r} needs {', '.join(missing)}, not installed here: {hint}")
        return self.resolve()(**{**self.options, **options, "name": self.name})


def _load_settings(registry: Registry) -> None:
    """The operators of ``settings.toml`` (data), registered the first time the registry is used."""
    with open(SETTINGS_FILE, "rb") as fh:
        data = tomllib.load(fh)
    for name, table in data.items():
        unknown = set(table) - {"class", "requires", "extra", "options"}
        if unknown or "class" not in table:
            raise ValueError(f"{SETTINGS_FILE}: [{name}] needs 'class' and allows only requires/extra/options, "
                             f"got {sorted(table)}")
        if name not in registry:
            registry.register(name, OperatorSpec(name, table["class"], tuple(table.get("requires", ())),
                                                 table.get("extra"), dict(table.get("options", {}))))


#: Every operator by name: ``settings.toml``'s, then those given to :func:`register_operator`.
OPERATORS: Registry[Operator] = Registry("operator", populate=_load_settings)


def register_operator(name: str, factory: Callable[..., Operator] | str, *, requires: tuple[str, ...] = (),
                      extra: Optional[str] = None, replace: bool = False, **options: Any) -> None:
    """Register ``factory`` (called with ``name=`` and the options) under ``name``."""
    OPERATORS.register(name, OperatorSpec(name, factory, tuple(requires), extra, dict(options)), replace=replace)


def registered_operators() -> list[str]:
    """Every registered name, whether or not its optional dependencies are installed."""
    return OPERATORS.names()


def available_operators() -> list[str]:
    """Registered names whose dependencies are installed here."""
    def missing(factory: Any) -> list[str]:  # a factory registered directly, not as a spec, needs nothing
        return factory.missing() if isinstance(factory, OperatorSpec) else []

    return [name for name in OPERATORS.names() if not missing(OPERATORS.get(name))]


def get_operator(name: str, **options: Any) -> Operator:
    """A new operator instance: the registered defaults updated with ``options`` (an unknown name
    is a KeyError listing the known ones)."""
    return OPERATORS.create(name, **options)
