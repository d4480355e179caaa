"""GEMM problem shapes: ``C[M,N] = A[M,K] · B``, with a layout and an accumulation contract."""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Shape", "ShapeError", "LAYOUTS", "CONTRACTS", "MAX_DIM", "MAX_ELEMENTS"]

#: ``TN``: A is M×K row-major, B is given as N×K row-major (nn.Linear weights, CUDA-L2).
#: ``NN``: A is M×K row-major, B is K×N row-major.
LAYOUTS = ("TN", "NN")
#: ``f32``: fp16 in/out, fp32 accumulation (torch.matmul). ``f16``: fp16 accumulation, a
#: separate contract that is never compared against ``f32`` results.
CONTRACTS = ("f32", "f16")
#: No dimension above 2**20 and no operand above 2**31 elements (4 GiB in fp16): beyond that
#: the harness cannot hold rotating buffers on one GPU, and the number is almost surely a typo.
MAX_DIM = 1 << 20
MAX_ELEMENTS = 1 << 31

_PATTERN = re.compile(r"^\s*([^x:\s]+)\s*x\s*([^x:\s]+)\s*x\s*([^x:\s]+)\s*((?::[A-Za-z0-9]+)*)\s*$")


class ShapeError(ValueError):
    """A shape string or value that does not describe a valid GEMM problem."""


@dataclass(frozen=True, order=True)
class Shape:
    """One GEMM problem. ``str(shape)`` round-trips through :meth:`parse`."""

    m: int
    n: int
    k: int
    layout: str = "TN"
    contract: str = "f32"

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ShapeError(f"{name.upper()} must be an integer, got {value!r}")
            if value < 1:
                raise ShapeError(f"{name.upper()} must be >= 1, got {value}")
            if value > MAX_DIM:
                raise ShapeError(f"{name.upper()}={value} is absurd (limit {MAX_DIM})")
        for label, count in (("A", self.m * self.k), ("B", self.n * self.k), ("C", self.m * self.n)):
            if count > MAX_ELEMENTS:
                raise ShapeError(f"operand {label} of {self.m}x{self.n}x{self.k} has {count} elements (limit {MAX_ELEMENTS})")
        if self.layout not in LAYOUTS:
            raise ShapeError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.contract not in CONTRACTS:
            raise ShapeError(f"contract must be one of {CONTRACTS}, got {self.contract!r}")

    @classmethod
    def parse(cls, text: str) -> "Shape":
        """Parse ``MxNxK`` with optional ``:LAYOUT`` and ``:CONTRACT`` suffixes, in any order.

        ``4096x4096x4096`` is TN/f32; ``64x128x64:NN``; ``64x128x64:NN:f16``.
        """
        if not isinstance(text, str):
            raise ShapeError(f"shape must be a string like 4096x4096x4096, got {type(text).__name__}")
        match = _PATTERN.match(text.lower().replace("X", "x"))
        if not match:
            raise ShapeError(f"cannot parse shape {text!r}: expected MxNxK[:TN|NN][:f32|f16], e.g. 4096x4096x4096")
        dims = []
        for label, raw in zip("MNK", match.groups()[:3]):
            if not re.fullmatch(r"[+-]?[0-9]+", raw):
                raise ShapeError(f"{label} in {text!r} must be a whole number, got {raw!r}")
            dims.append(int(raw))
        layout, contract = None, None
        for part in filter(None, match.group(4).split(":")):
            if part.upper() in LAYOUTS:
                if layout is not None:
                    raise ShapeError(f"{text!r} names two layouts ({layout}, {part.upper()})")
                layout = part.upper()
            elif part.lower() in CONTRACTS:
                if contract is not None:
                    raise ShapeError(f"{text!r} names two contracts ({contract}, {part.lower()})")
                contract = part.lower()
            else:
                raise ShapeError(f"unknown suffix {part!r} in {text!r}: use one of {LAYOUTS + CONTRACTS}")
        try:
            return cls(dims[0], dims[1], dims[2], layout or "TN", contract or "f32")
        except ShapeError as exc:  # name the input: "shape '0x1x1': M must be >= 1, got 0"
            raise ShapeError(f"shape {text!r}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}:{self.layout}:{self.contract}"

    @property
    def key(self) -> str:
        """A file-name-safe identifier, e.g. ``4096x4096x4096_TN_f32``."""
        return f"{self.m}x{self.n}x{self.k}_{self.layout}_{self.contract}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def min_bytes(self) -> int:
        """Fewest bytes a GEMM must move: A and B read once, C written once (fp16)."""
        return 2 * (self.m * self.k + self.n * self.k + self.m * self.n)

    def env(self) -> dict[str, int]:
        """Bindings for plan expressions."""
        return {"M": self.m, "N": self.n, "K": self.k}

    def with_dims(self, m: int, n: int, k: int) -> "Shape":
        return Shape(m, n, k, self.layout, self.contract)
