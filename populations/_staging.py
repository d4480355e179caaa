"""The alignment transform, added to a template by the loader: staging knobs, rules and launches.

A template whose kernels read A and B through TMA tensor maps needs 16-byte row pitches: K % 8
== 0 (and N % 8 == 0 for NN's B). A template that says ``stageable = true`` in its
``template.toml`` gets, from here rather than from text repeated in every TOML file:

- knobs ``STAGE`` (which operands a pre-pass copies into aligned workspace buffers: ``none``,
  ``A``, ``B``, ``AB``), ``STAGE_PITCH`` (the copies' pitch multiple: 8 is what TMA needs, 64 puts
  each row on a 128-byte line) and ``STAGE_FUSED`` (both copies in one launch, or one each);
- constraints: a ragged pitch must be staged, an aligned one is staged only where its pitch sits
  16 bytes off a 32-byte sector (``K % 16 == 8``; NN's B ``N % 16 == 8``) on a large product
  (``M * N >= 3000 * (M + N)``) and onto a 128-byte pitch (``STAGE_PITCH`` 64): there a TMA
  box's every other row spans one sector more, and the big tiles lost 22-30% against a
  128-byte pitch (bench/RESULTS.md section 27 (k), H100), while the copies cost about 466 x
  (1/M + 1/N) of the product's time at the tensor cores' rate, under 16% on such a product
  (elsewhere a copy buys nothing); the knobs that do not matter stay at their defaults (no
  duplicate knob sets);
- a ``fit`` rule that sets ``STAGE`` from the shape for every first pick, so each of the
  template's tile rules serves ragged shapes too (seeding "applies it wherever N or K is not a
  multiple of 8"); a rule that stages an aligned pitch on purpose (where the constraints allow
  it) keeps its ``STAGE``;
- ``[plan.staging]`` and the pre-pass launches (``evo_stage``/``evo_stage2`` of
  ``_prelude/stage.cuh``) ahead of the template's own, so its tensor maps read the copies.

The template's kernels are unchanged: a staged tensor map has the matrix's rows and columns and
only a larger pitch, and TMA zero-fills what lies past the columns.

A template whose kernels can also read ragged pitches in place (sm90_wgmma's ``RAGGED`` producer)
names those knob sets with ``stage_bypass = "EXPR"``: there a ragged pitch needs no staging (the
constraints above accept it unstaged), ``STAGE`` stays ``none``, and the ``fit`` rule leaves it so.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

from ._plan import MAX_WORKSPACE, STAGE_ALIGN

__all__ = ["with_staging", "stage_grid", "STAGE_KNOBS"]

STAGE_KNOBS = ("STAGE", "STAGE_PITCH", "STAGE_FUSED")
_PRELUDE = "stage.cuh"

_A = "(STAGE == STAGE_A or STAGE == STAGE_AB)"
_B = "(STAGE == STAGE_B or STAGE == STAGE_AB)"
_A_RAGGED = "K % 8 != 0"
_B_RAGGED = "(K % 8 != 0 if LAYOUT_TN else N % 8 != 0)"
#: an aligned pitch 16 bytes off a 32-byte sector on a product large enough to pay for the copy
_BIG = "M * N >= 3000 * (M + N)"
_A_OFF = f"(K % 16 == 8 and {_BIG})"
_B_OFF = f"((K % 16 == 8 if LAYOUT_TN else N % 16 == 8) and {_BIG})"
#: B as stored: N x K in TN, K x N in NN
_B_ROWS, _B_COLS = "(N if LAYOUT_TN else K)", "(K if LAYOUT_TN else N)"
#: one 256-thread block per 256 16-byte vectors of the copies, at most 8 blocks per SM of an H200
STAGE_BLOCK, STAGE_MAX_BLOCKS = 256, 1056
_GRID = f"min(cdiv({{vectors}}, {STAGE_BLOCK}), {STAGE_MAX_BLOCKS})"


def stage_grid(vectors: int) -> int:
    """The pre-pass grid (blocks) for ``vectors`` 16-byte vectors of copies: what ``_GRID`` says,
    for callers that build a copy launch themselves (the export's launcher for a B padded once)."""
    return min(-(-vectors // STAGE_BLOCK), STAGE_MAX_BLOCKS)

_KNOBS = {
    "STAGE": {"values": ["none", "A", "B", "AB"], "default": "none", "axis": "padding",
              "doc": "the alignment transform: operands a pre-pass copies into workspace buffers with 16-byte "
                     "aligned rows (TMA needs them; a ragged K or NN's ragged N has none)"},
    "STAGE_PITCH": {"values": [8, 64], "default": 64, "axis": "padding",
                    "doc": "row pitch multiple (elements) of the staged copies: 8 is what TMA needs, 64 starts "
                           "every row on a 128-byte line"},
    "STAGE_FUSED": {"values": [True, False], "default": True, "axis": "padding",
                    "doc": "with STAGE AB: both copies in one pre-pass launch (true) or one launch each"},
}

_CONSTRAINTS = [
    {"expr": f"not ({_A_RAGGED}) or {_A}",
     "reason": "K % 8 != 0: A's row pitch is not a multiple of 16 bytes, which TMA needs; stage A (STAGE A or AB)"},
    {"expr": f"not {_B_RAGGED} or {_B}",
     "reason": "B's row pitch (K in TN, N in NN) is not a multiple of 16 bytes, which TMA needs; stage B (STAGE B or AB)"},
    {"expr": f"not {_A} or {_A_RAGGED} or ({_A_OFF} and STAGE_PITCH == 64)",
     "reason": "A's pitch is aligned already: staging it would only add a copy (STAGE none or B; only a pitch "
               "16 bytes off a sector on a large product is staged, onto 128 bytes: STAGE_PITCH 64)"},
    {"expr": f"not {_B} or {_B_RAGGED} or ({_B_OFF} and STAGE_PITCH == 64)",
     "reason": "B's pitch is aligned already: staging it would only add a copy (STAGE none or A; only a pitch "
               "16 bytes off a sector on a large product is staged, onto 128 bytes: STAGE_PITCH 64)"},
    {"expr": "STAGE == STAGE_AB or STAGE_FUSED",
     "reason": "STAGE_FUSED only matters with STAGE AB: keep it at its default (true)"},
    {"expr": "STAGE != STAGE_none or STAGE_PITCH == 64",
     "reason": "STAGE_PITCH only matters with staging: keep it at its default (64)"},
]

def _fits(plan: Mapping[str, Any]) -> dict[str, str]:
    """The rule that the whole workspace fits the plan's limit: the template's own (split-K
    partials...) and the staged copies after it, each at most ``STAGE_ALIGN`` bytes further on
    (``LaunchPlan.staging_layout``). Without it a knob set valid by every other rule (split-K 12
    at 4754x18757x1849 with both operands staged) had a plan that does not resolve."""
    own = str(plan.get("workspace", "0") or "0")
    copy_a = f"(M * cdiv(K, STAGE_PITCH) * STAGE_PITCH * 2 + {STAGE_ALIGN} if {_A} else 0)"
    copy_b = f"({_B_ROWS} * cdiv({_B_COLS}, STAGE_PITCH) * STAGE_PITCH * 2 + {STAGE_ALIGN} if {_B} else 0)"
    return {"expr": f"({own}) + {copy_a} + {copy_b} <= {MAX_WORKSPACE}",
            "reason": f"the workspace (the template's own and the staged copies) would exceed {MAX_WORKSPACE} bytes"}


#: 0 none, 1 A, 2 B, 3 AB: exactly the ragged operands
_RAGGED_STAGE = f"(1 if {_A_RAGGED} else 0) + (2 if {_B_RAGGED} else 0)"
#: ... save that, where neither is ragged, a knob set that stages an off-sector pitch on purpose
#: keeps it (the constraints judge it)
_FIT = (f"STAGE if (not {_A_RAGGED} and not {_B_RAGGED} and STAGE != STAGE_none and STAGE_PITCH == 64 "
        f"and ({_A_OFF} or {_B_OFF})) else {_RAGGED_STAGE}")

_A_ARGS = ["A", "stagedA", "M", "K", "ldsa"]
_B_ARGS = ["B", "stagedB", _B_ROWS, _B_COLS, "ldsb"]
_LAUNCHES = [
    {"kernel": "evo_stage", "when": "STAGE == STAGE_A or (STAGE == STAGE_AB and not STAGE_FUSED)",
     "grid": [_GRID.format(vectors="M * (ldsa // 8)"), 1, 1], "block": [STAGE_BLOCK, 1, 1], "smem": 0, "args": _A_ARGS},
    {"kernel": "evo_stage", "when": "STAGE == STAGE_B or (STAGE == STAGE_AB and not STAGE_FUSED)",
     "grid": [_GRID.format(vectors=f"{_B_ROWS} * (ldsb // 8)"), 1, 1], "block": [STAGE_BLOCK, 1, 1], "smem": 0,
     "args": _B_ARGS},
    {"kernel": "evo_stage2", "when": "STAGE == STAGE_AB and STAGE_FUSED",
     "grid": [_GRID.format(vectors=f"M * (ldsa // 8) + {_B_ROWS} * (ldsb // 8)"), 1, 1], "block": [STAGE_BLOCK, 1, 1],
     "smem": 0, "args": _A_ARGS + _B_ARGS},
]


def with_staging(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a parsed ``template.toml`` with ``stageable = true``) with the alignment transform
    added; raises ValueError where the template already uses a name the transform adds."""
    out = copy.deepcopy(dict(data))
    out.pop("stageable", None)
    bypass = out.pop("stage_bypass", None)
    clash = set(STAGE_KNOBS) & set(out.get("knobs", {}))
    if clash:
        raise ValueError(f"stageable template defines {sorted(clash)} itself")
    plan = out.setdefault("plan", {})
    if "staging" in plan:
        raise ValueError("stageable template has its own [plan.staging]")
    out["knobs"] = {**out.get("knobs", {}), **copy.deepcopy(_KNOBS)}
    constraints = copy.deepcopy(_CONSTRAINTS)
    fit = _FIT
    if bypass is not None:
        if not isinstance(bypass, str) or not bypass.strip():
            raise ValueError(f"stage_bypass must be a knob expression, got {bypass!r}")
        for rule in constraints[:2]:  # a ragged pitch must be staged, unless the kernels read it in place
            rule["expr"] = f"({bypass}) or ({rule['expr']})"
            rule["reason"] += f", or read it in place ({bypass})"
        constraints.append({"expr": f"not ({bypass}) or STAGE == STAGE_none",
                            "reason": f"kernels that read ragged pitches in place ({bypass}) take no staged copies"})
        fit = f"0 if ({bypass}) else {_FIT}"
    out["constraints"] = list(out.get("constraints", [])) + constraints + [_fits(plan)]
    out["fit"] = {**out.get("fit", {}), "STAGE": fit}
    out["prelude"] = list(out.get("prelude", [])) + [_PRELUDE]
    plan["staging"] = {"A": f"STAGE_PITCH if {_A} else 0", "B": f"STAGE_PITCH if {_B} else 0"}
    plan["launches"] = copy.deepcopy(_LAUNCHES) + list(plan.get("launches", []))
    return out
