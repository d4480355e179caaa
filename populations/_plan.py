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

__all__ = ["Launch", "TensorMapSpec", "LaunchPlan", "PlanError", "POINTER_ARGS", "DIM_NAMES", "ResolvedLaunch"]

POINTER_ARGS = ("A", "B", "C", "workspace")
DIM_NAMES = frozenset({"M", "N", "K", "lda", "ldb", "ldc"})
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
    shared-memory swizzle in bytes (0, 32, 64 or 128).
    """

    matrix: str
    box: tuple[int, int]
    swizzle: int = 128

    def __post_init__(self) -> None:
        if self.matrix not in ("A", "B", "C"):
            raise PlanError(f"tensor map matrix must be A, B or C, got {self.matrix!r}")
        if len(self.box) != 2 or not all(isinstance(b, int) and 1 <= b <= 256 for b in self.box):
            raise PlanError(f"tensor map box must be two integers in 1..256, got {self.box!r}")
        if self.swizzle not in SWIZZLES:
            raise PlanError(f"tensor map swizzle must be one of {SWIZZLES}, got {self.swizzle!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"matrix": self.matrix, "box": list(self.box), "swizzle": self.swizzle}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TensorMapSpec":
        return cls(matrix=d["matrix"], box=tuple(d["box"]), swizzle=int(d.get("swizzle", 128)))


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
class LaunchPlan:
    """Ordered launches, the workspace size and the tensor maps they use."""

    launches: tuple[Launch, ...]
    workspace: Any = 0
    zero_workspace: bool = False
    tensor_maps: Mapping[str, TensorMapSpec] = field(default_factory=dict)
    coresident: bool = False

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
        for name, spec in self.tensor_maps.items():
            if not isinstance(spec, TensorMapSpec):
                raise PlanError(f"tensor map {name!r} must be a TensorMapSpec")

    def resolve(self, shape: Shape, *, max_smem: int = MAX_SMEM) -> tuple[list[ResolvedLaunch], int]:
        """Evaluate every expression for ``shape``; check the limits; return launches and workspace bytes."""
        env = dict(shape.env())
        env.update(lda=shape.k, ldb=shape.k if shape.layout == "TN" else shape.n, ldc=shape.n)
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
            )
        except (KeyError, TypeError) as exc:
            raise PlanError(f"malformed plan: {exc!r}") from None


def _check(value: Any, names: set[str], where: str) -> None:
    if isinstance(value, bool):
        raise PlanError(f"{where}: boolean {value!r} is not a size")
    if isinstance(value, int):
        return
    if not isinstance(value, str):
        raise PlanError(f"{where}: {value!r} must be an integer or an expression string")
    check_expr(value, names)
