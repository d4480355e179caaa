"""One way to name plug-ins: a :class:`Registry` maps names to factories.

Operators, LLM backends, evaluator pools and kernel loaders are each chosen by a name (from a
command line or a data file). Each kind keeps one :class:`Registry` and every plug-in of that kind
registers itself there the same way, so that adding one means one ``register`` call, not a new
branch in an if/elif, and every unknown name is answered by the same one-line error that lists
the names known. It lives in ``populations`` (which imports nothing of ours) so that every
package can keep one.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, Optional, TypeVar

__all__ = ["Registry", "UnknownName"]

T = TypeVar("T")
Factory = Callable[..., T]


class UnknownName(KeyError, ValueError):
    """A name no factory is registered under. A KeyError (a lookup that failed) and a ValueError
    (bad input from a user), whose text is the message itself, on one line, without quotes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Names to factories for one kind of plug-in (``kind`` names it in errors).

    ``populate`` (optional) registers the built-in entries the first time the registry is used,
    e.g. from a data file, so that reading it costs nothing at import. ``error``: the exception
    class raised for an unknown name (a package's own, where callers already catch one).
    """

    def __init__(self, kind: str, *, populate: Optional[Callable[["Registry[T]"], None]] = None,
                 error: type[Exception] = UnknownName) -> None:
        self.kind = kind
        self._factories: dict[str, Factory] = {}
        self._populate = populate
        self._error = error

    def _ready(self) -> dict[str, Factory]:
        populate, self._populate = self._populate, None
        if populate is not None:
            populate(self)
        return self._factories

    def register(self, name: str, factory: Optional[Factory] = None, *, replace: bool = False) -> Callable:
        """Register ``factory`` under ``name``; without ``factory``, a decorator that registers what
        it decorates. A name already taken is a ValueError unless ``replace``."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def add(f: Factory) -> Factory:
            if not callable(f):
                raise TypeError(f"{self.kind} {name!r}: the factory must be callable, got {type(f).__name__}")
            factories = self._ready()
            if name in factories and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered (pass replace=True to override it)")
            factories[name] = f
            return f

        return add if factory is None else add(factory)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plug-in that goes away, a test's double); an unknown name is the
        registry's error."""
        self.get(name)
        del self._factories[name]

    def get(self, name: str) -> Factory:
        """The factory registered under ``name``; an unknown name raises the registry's error."""
        factories = self._ready()
        if name not in factories:
            raise self._error(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(factories)) or 'none'}")
        return factories[name]

    def create(self, name: str, /, *args: object, **kwargs: object) -> T:
        """A new instance from the factory registered under ``name``."""
        return self.get(name)(*args, **kwargs)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._ready())

    def __contains__(self, name: object) -> bool:
        return name in self._ready()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
