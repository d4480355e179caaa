"""``evo.torch.patch(model, library)``: a model's ``nn.Linear`` layers through evo's kernels.

A module is patched when it is a plain ``nn.Linear`` (its class's forward is
``nn.Linear.forward`` and nothing, e.g. an accelerate hook, has replaced its forward), its
weight is fp16, and the library has an exported kernel for its (out_features, in_features) at
some token count M (the TN layout: ``x @ W^T``). Its forward then decides per call, in
Python, from the module's set of covered token counts: a call whose M = x.numel() / in_features
the library does not cover goes straight to ``F.linear`` (it does not pay the native operator's
fallback, ~1 us a call more than torch.matmul on the H200); a covered call goes to
``torch.ops.evo_native.linear(x, weight, bias)``, which runs the exported kernel when the inputs
qualify (CUDA, fp16, contiguous, 16-byte aligned, no gradients needed), the bias added after, and
cuBLAS otherwise. Patching is an instance attribute, so :func:`unpatch`
(or leaving :func:`patched`) restores the class's forward exactly.

Weights padded once: where a kernel for the module's (N, K) copies B into aligned rows every
call (the alignment transform, K % 8 != 0), the module holds a zero-padded copy of its weight
made at patch time (``EvoLibrary.prepare_weight``; N x K more memory) and a covered call goes to
``torch.ops.evo_native.linear_prepared(x, weight, padded, bias)``, which copies only A per call.
The copy follows the weight: a call that finds the weight changed since (in place, which bumps
its version counter, or replaced or moved) pads it again first, so an update or a
``load_state_dict`` never leaves a stale copy in use. Writes through ``weight.data`` bypass the
version counter: patch again after them.

The operator's table is process-wide: patching with a library registers that library's kernels
(:func:`evo.torch.register`), replacing another library's.
"""
from __future__ import annotations

import contextlib
import os
import types
from dataclasses import dataclass, field
from typing import Any, Iterator, Union

__all__ = ["PatchReport", "coverage", "patch", "unpatch", "patched"]

_MARK = "_evo_patched"
#: a patched module's attribute: the frozenset of token counts M its (N, K) has exported kernels for
_ROWS = "_evo_rows"
#: torch.ops.evo_native.linear.default, bound once by :func:`patch`: the attribute chain through
#: torch.ops costs ~0.3 us a call, which an eager model pays on every patched layer
_OP: Any = None
#: torch.nn.functional.linear, bound by :func:`patch` (this module imports torch lazily)
_linear: Any = None
#: torch.ops.evo_native.linear_prepared.default, bound by :func:`patch`
_OP_P: Any = None
#: a patched module's attributes for a weight padded once: the copy (or None), and the weight's
#: (version, data pointer, device) when it was made
_PAD, _PAD_OF = "_evo_wpad", "_evo_wpad_of"


@dataclass
class PatchReport:
    """What :func:`patch` did: ``patched`` (module name, N, K, the token counts M the library
    has for it), ``skipped`` (module name, why) for every other ``nn.Linear``, and ``note``
    (why calls will all fall back, when the library is not usable here)."""

    patched: list[tuple[str, int, int, tuple[int, ...]]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""
    #: patched modules whose weight is held padded once (their kernels stage B)
    prepared: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"evo.torch.patch: {len(self.patched)} nn.Linear patched, {len(self.skipped)} left to cuBLAS"]
        if self.note:
            lines.append(f"  note: {self.note}")
        pads = set(self.prepared)
        lines += [f"  patched {name}: N={n} K={k} for M in {list(ms)}" + (" (weight padded once)" if name in pads else "")
                  for name, n, k, ms in self.patched]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def coverage(library: Any) -> dict[tuple[int, int], tuple[int, ...]]:
    """(N, K) -> the token counts M with an exported TN kernel, from ``library.kernels``."""
    out: dict[tuple[int, int], list[int]] = {}
    for m, n, k, layout in library.kernels:
        if layout == "TN":
            out.setdefault((n, k), []).append(m)
    return {nk: tuple(sorted(ms)) for nk, ms in out.items()}


def _forward(self: Any, x: Any) -> Any:
    """A patched ``nn.Linear.forward``: the native operator for the covered token counts only."""
    if x.numel() // self.in_features in self._evo_rows:
        if self._evo_wpad is None:
            return _OP(x, self.weight, self.bias)
        w = self.weight
        if self._evo_wpad_of != _stamp(w):
            _pad_weight(self)
        return _OP_P(x, w, self._evo_wpad, self.bias)
    return _linear(x, self.weight, self.bias)


def _pad_weight(mod: Any) -> None:
    """(Re)make ``mod``'s weight padded once through the registered library; None where its
    kernels do not stage B or the weight is not on a GPU (the op then takes the plain path)."""
    import torch

    from ._ops import registered

    lib, w = registered(), mod.weight
    with torch.no_grad():
        pad = lib.prepare_weight(w.detach()).padded if lib is not None and getattr(lib, "active", False) else None
    setattr(mod, _PAD, pad)
    setattr(mod, _PAD_OF, _stamp(w))


def _stamp(w: Any) -> tuple[int, int, Any]:
    """What says a weight changed: its version counter (in-place writes, ``load_state_dict``;
    not writes through ``.data``, which has a counter of its own), data pointer and device."""
    try:
        version = w._version
    except RuntimeError:  # an inference tensor has no version counter (and cannot be written in place)
        version = -1
    return version, w.data_ptr(), w.device


def _why_not(mod: Any, cover: dict[tuple[int, int], tuple[int, ...]]) -> str:
    import torch

    if getattr(mod, _MARK, False):
        return "already patched"
    if type(mod).forward is not torch.nn.Linear.forward:
        return f"{type(mod).__name__} has its own forward"
    if "forward" in vars(mod):
        return "its forward was already replaced (a hook?)"
    if mod.weight.dtype != torch.float16:
        return f"weight is {str(mod.weight.dtype).removeprefix('torch.')}, not float16"
    if (mod.out_features, mod.in_features) not in cover:
        return f"no exported kernel for N={mod.out_features} K={mod.in_features}"
    return ""


def patch(model: Any, library: Union[Any, str, os.PathLike]) -> PatchReport:
    """Patch ``model``'s covered ``nn.Linear`` modules (see the module doc); returns the report.

    ``library`` is an :class:`evo.export._export.EvoLibrary` or the path of an export."""
    global _OP, _OP_P, _linear
    import torch

    from ._ops import load_ops, register

    if isinstance(library, (str, os.PathLike)):
        from ..runtime import load_library

        library = load_library(library)
    load_ops()
    _OP = torch.ops.evo_native.linear.default
    _OP_P = torch.ops.evo_native.linear_prepared.default
    _linear = torch.nn.functional.linear
    register(library)
    cover = coverage(library)
    report = PatchReport()
    if not getattr(library, "active", False):
        report.note = f"library not usable here ({getattr(library, 'reason', '')}): every call runs cuBLAS"
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        why = _why_not(mod, cover)
        if why:
            report.skipped.append((name, why))
            continue
        _pad_weight(mod)  # None where no kernel of its (N, K) stages B (prepare_weight decides)
        if getattr(mod, _PAD) is not None:
            report.prepared.append(name)
        mod.forward = types.MethodType(_forward, mod)
        setattr(mod, _ROWS, frozenset(cover[mod.out_features, mod.in_features]))
        setattr(mod, _MARK, True)
        report.patched.append((name, mod.out_features, mod.in_features, cover[mod.out_features, mod.in_features]))
    return report


def unpatch(model: Any) -> int:
    """Restore every module :func:`patch` patched in ``model``; returns how many."""
    count = 0
    for mod in model.modules():
        if getattr(mod, _MARK, False):
            del mod.forward
            for attr in (_MARK, _ROWS, _PAD, _PAD_OF):
                delattr(mod, attr)
            count += 1
    return count


@contextlib.contextmanager
def patched(model: Any, library: Union[Any, str, os.PathLike]) -> Iterator[PatchReport]:
    """``with patched(model, lib) as report:`` the model runs patched inside, unpatched after."""
    report = patch(model, library)
    try:
        yield report
    finally:
        unpatch(model)
