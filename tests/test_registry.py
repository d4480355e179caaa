"""The one registry pattern (populations.Registry) and the four plug-in kinds that use it:
operators, LLM backends, evaluator pools and kernel loaders."""
from __future__ import annotations

import pytest

from populations import Registry, UnknownName


def test_names_factories_and_create() -> None:
    reg: Registry[dict] = Registry("widget")
    reg.register("plain", dict)

    @reg.register("counted")
    def counted(**kw: int) -> dict:
        return {"n": len(kw), **kw}

    assert counted(a=1) == {"n": 1, "a": 1}  # the decorator hands back what it registered
    assert reg.names() == ["counted", "plain"] and "plain" in reg and "other" not in reg
    assert reg.create("counted", a=1, b=2) == {"n": 2, "a": 1, "b": 2}
    assert reg.get("plain") is dict


def test_an_unknown_name_is_one_line_listing_the_known_ones() -> None:
    reg: Registry[dict] = Registry("widget")
    reg.register("b", dict)
    reg.register("a", dict)
    with pytest.raises(UnknownName) as info:
        reg.create("c")
    assert str(info.value) == "unknown widget 'c'; known: a, b"
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    with pytest.raises(UnknownName, match="known: none"):
        Registry("empty").get("x")


def test_a_registry_may_raise_its_own_error_class() -> None:
    class Unavailable(RuntimeError):
        pass

    with pytest.raises(Unavailable, match="unknown loader 'x'"):
        Registry("loader", error=Unavailable).create("x")


def test_duplicate_registration_is_refused_unless_replaced() -> None:
    reg: Registry[object] = Registry("widget")
    reg.register("a", dict)
    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.register("a", list)
    assert reg.get("a") is dict
    reg.register("a", list, replace=True)
    assert reg.get("a") is list
    with pytest.raises(ValueError, match="non-empty"):
        reg.register(" ", dict)
    with pytest.raises(TypeError, match="callable"):
        reg.register("b", 3)  # type: ignore[arg-type]


def test_populate_runs_once_at_first_use() -> None:
    calls = []

    def populate(reg: Registry) -> None:
        calls.append(1)
        reg.register("builtin", dict)

    reg: Registry[dict] = Registry("widget", populate=populate)
    assert calls == []
    reg.register("extra", dict)  # the built-in entries come first, then this one
    assert reg.names() == ["builtin", "extra"] and calls == [1]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("builtin", list)


def test_every_plugin_kind_uses_the_one_registry() -> None:
    from evaluators import LOADERS, POOLS, LoaderUnavailable, LocalPool, RayPool, get_loader
    from operators import OPERATORS, available_operators, get_operator
    from operators.llm import LLM_BACKENDS, SPEC_STRINGS

    for reg in (OPERATORS, LLM_BACKENDS, SPEC_STRINGS, POOLS, LOADERS):
        assert isinstance(reg, Registry)
    assert {"knob_mutation", "llm", "ranked"} <= set(OPERATORS.names()) >= set(available_operators())
    assert LLM_BACKENDS.names() == ["openai", "transformers", "vllm"]
    assert SPEC_STRINGS.names() == ["openai", "transformers"]  # vllm:MODEL needs no parser of its own
    assert POOLS.get("local") is LocalPool and POOLS.get("ray") is RayPool
    assert LOADERS.names() == ["driver", "pycuda"]
    with pytest.raises(KeyError, match="unknown operator 'nope'; known: .*knob_mutation"):
        get_operator("nope")
    with pytest.raises(LoaderUnavailable, match="unknown loader 'opencl'; known: driver, pycuda"):
        get_loader("opencl")
    with pytest.raises(UnknownName, match="unknown evaluator pool 'slurm'; known: local, ray"):
        POOLS.create("slurm")


def test_unregister_removes_a_name_and_refuses_an_unknown_one() -> None:
    reg: Registry[list] = Registry("thing")
    reg.register("plug", list)
    reg.unregister("plug")
    assert "plug" not in reg and reg.names() == []
    with pytest.raises(UnknownName, match="unknown thing 'plug'"):
        reg.unregister("plug")
