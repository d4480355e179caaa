"""Launch plans: how the harness runs a candidate's kernels, as data.

A candidate has no host code. Its plan is an ordered list of launches; each names a kernel
of the candidate's translation unit, a grid, a block, dynamic shared memory and arguments.
Grid, shared memory, integer arguments and the workspace size are expressions of ``M``,
``N``, ``K`` (see :mod:`populations._expr`), or plain numbers for a specialised candidate.

Arguments are strings:

- ``A``, ``B``, ``C``, ``workspace``: device pointers the harness owns;
- ``tmap:NAME``: a TMA tensor map (``CUtensorMap``, 128 bytes, passed by value) described by
  ``plan.tensor_maps[NAME]`` and encoded by the harness;
- anything else: an integer expression of ``M``, ``N``, ``K`` passed as a 32-bit ``int``
  (``lda``, ``ldb``, ``ldc`` are bound to the leading dimensions of the layout).

Matrices as stored: A is M×K row-major; B is N×K row-major (TN) or K×N row-major (NN);
C is M×N row-major; all fp16. The workspace is zero-filled by the harness before every call
only if ``zero_workspace`` is set (split-K reductions that accumulate atomically need it).

**Staging** (the alignment transform): ``staging = {"A": 64}`` asks for a copy of A in the
workspace whose row pitch is rounded up to a multiple of 64 elements (and likewise for B, as
stored for the layout). TMA needs 16-byte row pitches and 16-byte vector loads need aligned rows;
a ragged K (or N for NN's B) has neither, so a plan stages the operand with a pre-pass launch of
its own (a kernel of the candidate, the templates' ``evo_stage``) and reads the copy. The copies
sit after the plan's own workspace, each 256-byte aligned (:meth:`LaunchPlan.staging_layout`);
their pointers are the arguments ``stagedA`` and ``stagedB``, their pitches the integer names
``ldsa`` and ``ldsb`` (``lda``/``ldb`` where an operand is not staged), and a tensor map with
``staged`` set reads the staged copy of its matrix (rows and columns as the matrix, the staged
pitch). :meth:`LaunchPlan.resolve` returns the workspace with the copies included, so a caller
(the evaluator, an exported launcher) allocates, guards and refills them like any workspace.

``coresident`` says that a launch's CTAs wait on each other (a persistent stream-K grid whose
owners spin on peers' flags): it is correct only when the whole grid is resident at once. An
exported launcher checks that on the device it runs on and answers -1 (use cuBLAS) where the
grid does not fit; the evaluator's worker refuses to time such a plan there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ._expr import ExprError, check_expr, evaluate
from ._shape import Shape

__all__ = ["Launch", "TensorMapSpec", "LaunchPlan", "PlanError", "POINTER_ARGS", "DIM_NAMES", "ResolvedLaunch",
           "StagedCopy", "stored_dims", "staged_pitch", "pitch_env"]

POINTER_ARGS = ("A", "B", "C", "workspace", "stagedA", "stagedB")
DIM_NAMES = frozenset({"M", "N", "K", "lda", "ldb", "ldc", "ldsa", "ldsb"})
#: Operands a plan may stage, and the largest pitch multiple (elements) it may ask for.
STAGEABLE = ("A", "B")
MAX_STAGE_PITCH = 256
STAGE_ALIGN = 256
SWIZZLES = (0, 32, 64, 128)
#: Upper bounds a plan may never exceed on any GPU we target (H100/H200: 227 KiB of dynamic
#: shared memory per block, 1024 threads per block, 2**31-1 blocks in x, 65535 in y and z).
MAX_SMEM = 232448
MAX_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_LAUNCHES = 8
MAX_ARGS = 32
MAX_WORKSPACE = 1 << 32


class PlanError(ValueError):
    """A launch plan that is malformed or outside the harness's limits."""


@dataclass(frozen=True)
class TensorMapSpec:
    """A TMA descriptor over one of the harness's matrices, encoded by the harness.

    ``box`` is (rows, cols) of the tile in the matrix *as stored* (row-major), ``swizzle`` the
    shared-memory swizzle in bytes (0, 32, 64 or 128). ``staged`` > 0 reads the plan's staged
    copy of A or B (same rows and columns, row pitch rounded up to a multiple of ``staged``).
    """

    matrix: str
    box: tuple[int, int]
    swizzle: int = 128
    staged: int = 0

    def __post_init__(self) -> None:
        if self.matrix not in ("A", "B", "C"):
            raise PlanError(f"tensor map matrix must be A, B or C, got {self.matrix!r}")
        if self.staged and (self.matrix not in STAGEABLE or not _pitch_ok(self.staged)):
            raise PlanError(f"tensor map over {self.matrix}: staged must be 0 or a pitch multiple of 8..{MAX_STAGE_PITCH} "
                            f"(a multiple of 8) over A or B, got {self.staged!r}")
        if len(self.box) != 2 or not all(isinstance(b, int) and 1 <= b <= 256 for b in self.box):
            raise PlanError(f"tensor map box must be two integers in 1..256, got {self.box!r}")
        if self.swizzle not in SWIZZLES:
            raise PlanError(f"tensor map swizzle must be one of {SWIZZLES}, got {self.swizzle!r}")

    @property
    def pointer(self) -> str:
        """The plan pointer argument whose memory the map describes (``A``, or ``stagedA``)."""
        return f"staged{self.matrix}" if self.staged else self.matrix

    def to_dict(self) -> dict[str, Any]:
        out = {"matrix": self.matrix, "box": list(self.box), "swizzle": self.swizzle}
        if self.staged:  # only when set: every other map (and its candidate's id) is as before
            out["staged"] = self.staged
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TensorMapSpec":
        return cls(matrix=d["matrix"], box=tuple(d["box"]), swizzle=int(d.get("swizzle", 128)),
                   staged=int(d.get("staged", 0)))


Expr = "str | int"


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan."""

    kernel: str
    grid: tuple[Any, Any, Any]
    block: tuple[int, int, int]
    args: tuple[str, ...]
    smem: Any = 0

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "smem": self.smem, "args": list(self.args)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Launch":
        grid = tuple(d["grid"]) + (1,) * (3 - len(d["grid"]))
        block = tuple(d["block"]) + (1,) * (3 - len(d["block"]))
        return cls(kernel=d["kernel"], grid=grid, block=block, smem=d.get("smem", 0), args=tuple(d["args"]))


@dataclass(frozen=True)
class ResolvedLaunch:
    """A launch with every expression evaluated for one shape; what the harness executes."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[Any, ...]  # "A"/"B"/"C"/"workspace", ("tmap", name) or an int


@dataclass(frozen=True)
class StagedCopy:
    """Where one staged operand lives for one shape: byte ``offset`` into the workspace, the
    operand's ``rows`` and ``cols`` as stored, and the copy's row ``pitch`` in elements."""

    operand: str
    offset: int
    rows: int
    cols: int
    pitch: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.pitch * 2


def stored_dims(operand: str, shape: Shape) -> tuple[int, int]:
    """(rows, cols) of A, B or C as stored for ``shape`` (B is N x K in TN, K x N in NN)."""
    if operand == "A":
        return shape.m, shape.k
    if operand == "B":
        return (shape.n, shape.k) if shape.layout == "TN" else (shape.k, shape.n)
    if operand == "C":
        return shape.m, shape.n
    raise PlanError(f"no matrix {operand!r}")


def staged_pitch(cols: int, multiple: int) -> int:
    """The row pitch (elements) of a staged copy: ``cols`` rounded up to ``multiple``."""
    return -(-cols // multiple) * multiple


def pitch_env(shape: Shape, staging: Mapping[str, int]) -> dict[str, int]:
    """The leading dimensions a plan's expressions may name at ``shape`` (elements): ``lda``, ``ldb``,
    ``ldc``, and ``ldsa``/``ldsb``, the staged copies' pitches under ``staging`` (the operand's own
    pitch where it is not staged)."""
    lda, ldb = stored_dims("A", shape)[1], stored_dims("B", shape)[1]
    out = {"lda": lda, "ldb": ldb, "ldc": shape.n, "ldsa": lda, "ldsb": ldb}
    for op, p in staging.items():
        out[f"lds{op.lower()}"] = staged_pitch(stored_dims(op, shape)[1], p)
    return out


def _pitch_ok(p: Any) -> bool:
    return isinstance(p, int) and not isinstance(p, bool) and 8 <= p <= MAX_STAGE_PITCH and p % 8 == 0


@dataclass(frozen=True)
class LaunchPlan:
    """Ordered launches, the workspace size and the tensor maps they use."""

    launches: tuple[Launch, ...]
    workspace: Any = 0
    zero_workspace: bool = False
    tensor_maps: Mapping[str, TensorMapSpec] = field(default_factory=dict)
    coresident: bool = False
    #: operand ("A"/"B") -> pitch multiple of its staged copy (see the module docstring)
    staging: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate_static()

    # -- validation -------------------------------------------------------------------
    def validate_static(self) -> None:
        """Check everything that does not depend on the shape. Raises :class:`PlanError`."""
        if not self.launches:
            raise PlanError("a plan needs at least one launch")
        if len(self.launches) > MAX_LAUNCHES:
            raise PlanError(f"a plan may have at most {MAX_LAUNCHES} launches, got {len(self.launches)}")
        names = set(DIM_NAMES)
        try:
            for launch in self.launches:
                if not isinstance(launch.kernel, str) or not launch.kernel.isidentifier():
                    raise PlanError(f"kernel name {launch.kernel!r} is not a C identifier")
                if len(launch.args) > MAX_ARGS:
                    raise PlanError(f"kernel {launch.kernel}: at most {MAX_ARGS} arguments")
                if len(launch.grid) != 3 or len(launch.block) != 3:
                    raise PlanError(f"kernel {launch.kernel}: grid and block need three entries")
                for g in launch.grid:
                    _check(g, names, f"grid of {launch.kernel}")
                _check(launch.smem, names, f"smem of {launch.kernel}")
                if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in launch.block):
                    raise PlanError(f"kernel {launch.kernel}: block must be positive integers, got {launch.block}")
                threads = launch.block[0] * launch.block[1] * launch.block[2]
                if threads > MAX_THREADS:
                    raise PlanError(f"kernel {launch.kernel}: {threads} threads per block exceeds {MAX_THREADS}")
                for arg in launch.args:
                    if not isinstance(arg, str):
                        raise PlanError(f"kernel {launch.kernel}: argument {arg!r} must be a string")
                    if arg in POINTER_ARGS:
                        continue
                    if arg.startswith("tmap:"):
                        if arg[5:] not in self.tensor_maps:
                            raise PlanError(f"kernel {launch.kernel}: unknown tensor map {arg[5:]!r}")
                        continue
                    _check(arg, names, f"argument of {launch.kernel}")
            _check(self.workspace, names, "workspace")
        except ExprError as exc:
            raise PlanError(str(exc)) from None
        for op, p in self.staging.items():
            if op not in STAGEABLE or not _pitch_ok(p):
                raise PlanError(f"staging {op!r}: {p!r}: only A and B can be staged, with a pitch multiple of "
                                f"8..{MAX_STAGE_PITCH} that is a multiple of 8")
        for name, spec in self.tensor_maps.items():
            if not isinstance(spec, TensorMapSpec):
                raise PlanError(f"tensor map {name!r} must be a TensorMapSpec")
            if spec.staged and self.staging.get(spec.matrix) != spec.staged:
                raise PlanError(f"tensor map {name!r} reads a staged {spec.matrix} with pitch multiple {spec.staged}, "
                                f"but the plan stages {spec.matrix} as {self.staging.get(spec.matrix, 'nothing')}")
        used = {a for launch in self.launches for a in launch.args}
        for op in STAGEABLE:
            if f"staged{op}" in used and op not in self.staging:
                raise PlanError(f"a launch passes staged{op}, but the plan does not stage {op}")

    def pitches(self, shape: Shape) -> dict[str, int]:
        """``lda``, ``ldb``, ``ldc`` and the staged pitches ``ldsa``, ``ldsb`` (elements) at ``shape``."""
        return pitch_env(shape, self.staging)

    def staging_layout(self, shape: Shape, own_workspace: int) -> tuple[list[StagedCopy], int]:
        """The staged copies at ``shape`` after ``own_workspace`` bytes, and the total workspace."""
        copies, end = [], own_workspace
        for op in STAGEABLE:
            if op in self.staging:
                rows, cols = stored_dims(op, shape)
                at = -(-end // STAGE_ALIGN) * STAGE_ALIGN
                copy = StagedCopy(op, at, rows, cols, staged_pitch(cols, self.staging[op]))
                copies.append(copy)
                end = at + copy.nbytes
        return copies, end

    def staged_copies(self, shape: Shape) -> list[StagedCopy]:
        """The staged copies at ``shape`` (empty without staging): what binds ``stagedA``/``stagedB``."""
        if not self.staging:
            return []
        env = {**shape.env(), **self.pitches(shape)}
        try:
            own = evaluate(self.workspace, env)
        except ExprError as exc:
            raise PlanError(f"{exc} (for {shape})") from None
        return self.staging_layout(shape, own)[0]

    def resolve(self, shape: Shape, *, max_smem: int = MAX_SMEM) -> tuple[list[ResolvedLaunch], int]:
        """Evaluate every expression for ``shape``; check the limits; return launches and workspace bytes."""
        env = dict(shape.env())
        env.update(self.pitches(shape))
        out: list[ResolvedLaunch] = []
        try:
            for launch in self.launches:
                grid = tuple(evaluate(g, env) for g in launch.grid)
                smem = evaluate(launch.smem, env)
                if any(g < 1 for g in grid) or any(g > lim for g, lim in zip(grid, MAX_GRID)):
                    raise PlanError(f"kernel {launch.kernel}: grid {grid} is outside 1..{MAX_GRID} for {shape}")
                if not 0 <= smem <= max_smem:
                    raise PlanError(f"kernel {launch.kernel}: dynamic shared memory {smem} B is outside 0..{max_smem} for {shape}")
                args: list[Any] = []
                for arg in launch.args:
                    if arg in POINTER_ARGS:
                        args.append(arg)
                    elif arg.startswith("tmap:"):
                        args.append(("tmap", arg[5:]))
                    else:
                        value = evaluate(arg, env)
                        if not -(2**31) <= value < 2**31:
                            raise PlanError(f"kernel {launch.kernel}: argument {arg!r}={value} does not fit in int32")
                        args.append(value)
                out.append(ResolvedLaunch(launch.kernel, grid, launch.block, smem, tuple(args)))  # type: ignore[arg-type]
            workspace = evaluate(self.workspace, env)
        except ExprError as exc:
            raise PlanError(f"{exc} (for {shape})") from None
        if workspace < 0:
            raise PlanError(f"workspace of {workspace} B is negative for {shape}")
        if self.staging:
            workspace = self.staging_layout(shape, workspace)[1]
        if not 0 <= workspace <= MAX_WORKSPACE:
            raise PlanError(f"workspace of {workspace} B is outside 0..{MAX_WORKSPACE} for {shape}")
        return out, workspace

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(launch.kernel for launch in self.launches))

    # -- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {
            "launches": [launch.to_dict() for launch in self.launches],
            "workspace": self.workspace,
            "zero_workspace": self.zero_workspace,
            "tensor_maps": {k: v.to_dict() for k, v in sorted(self.tensor_maps.items())},
        }
        if self.coresident:  # only when set: every other plan (and its candidate id) is as before
            out["coresident"] = True
        if self.staging:
            out["staging"] = dict(sorted(self.staging.items()))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LaunchPlan":
        try:
            return cls(
                launches=tuple(Launch.from_dict(x) for x in d["launches"]),
                workspace=d.get("workspace", 0),
                zero_workspace=bool(d.get("zero_workspace", False)),
                tensor_maps={k: TensorMapSpec.from_dict(v) for k, v in (d.get("tensor_maps") or {}).items()},
                coresident=bool(d.get("coresident", False)),
                staging={str(k): v for k, v in (d.get("staging") or {}).items()},
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise PlanError(f"malformed plan: {exc!r}") from None


def _check(value: Any, names: set[str], where: str) -> None:
    if isinstance(value, bool):
        raise PlanError(f"{where}: boolean {value!r} is not a size")
    if isinstance(value, int):
        return
    if not isinstance(value, str):
        raise PlanError(f"{where}: {value!r} must be an integer or an expression string")
    check_expr(value, names)
