"""Static scan: refuse candidates that break the kernel ABI before spending a compile on them.

The scan is a first filter plus telemetry, not a proof: the GPU worker's runtime checks
(guard bands, poisoned outputs, re-checks after timing) stay the authority. It is
conservative: dead code (``#if 0``) is scanned like live code. Rules, each with its reason:

Source
- At most 256 KiB of source.
- ``#include`` only from an allow-list of device headers that NVRTC resolves quickly:
  ``cuda_fp16.h cuda_bf16.h cuda_fp8.h mma.h cuda_pipeline.h cuda_pipeline_primitives.h
  cuda/std/cstdint``. Host headers (``cstdio``...) have no use without host code;
  ``cooperative_groups.h`` and ``cuda/barrier`` cost 1-2 s of compile each and grid-wide
  sync needs a cooperative launch the harness never makes. ``stdint.h``/``cstdint`` do not
  exist under NVRTC; use ``cuda/std/cstdint``.
- Directives: include, define, undef, conditionals, error/warning, line and ``#pragma``
  ``unroll``/``nounroll``/``once``/``nv_diag_*`` only (also via ``_Pragma``).
- No ``##`` token pasting: it is the one preprocessor tool that builds identifiers this scan
  cannot see (``cuda ## Malloc``). Macros (object- and function-like) are expanded before the
  structural pass, so ``#define DEV __device__ __forceinline__`` works and a macro cannot hide a
  host function or a mutable global; every macro body is also scanned for the forbidden names
  below like any code, used or not. Expansion is bounded (``MAX_EXPANDED_TOKENS`` work units,
  arguments included): a source past it is refused (telemetry ``macro_expansion_truncated``),
  because the scan runs in the caller's process and must stay cheap and linear.
- No unterminated comments, strings, raw strings or character literals (the lexer reads them
  as one ``bad`` token, so that they cost linear time).
- Every pass is linear or budgeted; an exception inside the scan (a bug, a recursion limit) is
  a rejection with its reason, never an exception out of :func:`scan`.

Host and runtime
- Every namespace-scope function must be ``__global__`` or ``__device__`` (``__forceinline__``
  etc. allowed); ``__host__`` and ``main`` are refused.
- No kernel launches (``<<<``), no CUDA runtime/driver API (identifiers ``cudaXxx``, ``cuXxx``,
  ``__cudaXxx``: this covers device-side launches ``cudaLaunchDevice``,
  ``cudaGetParameterBuffer``, ``cudaDeviceSynchronize``), no libraries (``cublas*``, ``cudnn*``,
  ``cufft*``, ``curand*``, ``cusparse*``, ``cusolver*``, ``nccl*``, ``nvshmem*``), no device heap
  (``malloc``, ``free``, ``new``...), no ``printf`` (output side channel, and it floods timing).

State between calls
- No ``__managed__``; namespace-scope variables must be ``const``/``constexpr`` (top-level
  const for pointers), ``__constant__`` (read-only on the device; the compiler enforces its
  64 KiB), or ``__shared__``. Mutable ``__device__`` globals (and plain globals, which
  ``-default-device`` makes device globals) could carry state from one call to the next, e.g.
  cache results between the correctness run and the timed runs. The same holds for ``static``
  locals and static data members; ``extern`` variables other than ``extern __shared__`` too.

Inline PTX (string literals)
- Refused: ``call`` (calls into vprintf or anything else), ``brkpt``, ``pmevent`` and
  ``.global``/``.extern`` declarations (hidden device globals).
- Clock reads (``%globaltimer``, ``%clock``/``%clock64`` in PTX, ``clock()``, ``clock64()``,
  ``__globaltimer()``): a GEMM's work must not depend on time; a kernel that can read a clock
  can tell a benchmark loop (calls microseconds apart) from production use and behave
  differently in each, which no output check sees (red-team case ``globaltimer_skip_when_hot``).
- Telemetry only: ``%smid`` (the machine-code check, :mod:`evaluators.compile._sass`, refuses it), ``nanosleep``, ``trap``.
  A kernel that behaves differently when timed is caught at runtime by re-checking outputs
  after timing; a spinning kernel by the GPU worker's deadline.

Plan
- At most ``MAX_CLAIMED_SHAPES`` claimed shapes (each is checked and timed on the GPU).
- Every launch names an ``extern "C" __global__`` kernel defined in the source, with as many
  parameters as the launch has arguments; ``A``/``B``/``C``/``workspace`` go to pointer
  parameters, integer expressions to 32-bit integer parameters, ``tmap:`` to by-value
  ``const __grid_constant__`` parameters. The plan resolves (grid, block, shared memory within
  the arch's limits, workspace) at every claimed shape, and for generic candidates also at
  small ragged smoke shapes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from populations import Candidate

from ._lex import Directive, Token, lex
from ._macros import MAX_EXPANDED_TOKENS, _Expander, _Macro, _match, _ScanLimit
from ._structure import SMEM_LIMITS, _check_plan, _Kernel, _structure, smoke_shapes

__all__ = ["ScanResult", "scan", "scan_source", "smoke_shapes", "ALLOWED_INCLUDES", "MAX_SOURCE_BYTES", "MAX_CLAIMED_SHAPES",
           "SMEM_LIMITS", "MAX_EXPANDED_TOKENS"]

MAX_SOURCE_BYTES = 256 * 1024
#: Shapes one candidate may claim: every claimed shape is checked and timed on the GPU, so an
#: unbounded claim list is a denial of service on the evaluator.
MAX_CLAIMED_SHAPES = 64
ALLOWED_INCLUDES = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "mma.h", "cuda_pipeline.h",
    "cuda_pipeline_primitives.h", "cuda/std/cstdint",
})
ALLOWED_DIRECTIVES = frozenset({"include", "define", "undef", "if", "ifdef", "ifndef", "elif",
                                "elifdef", "elifndef", "else", "endif", "pragma", "error", "warning", "line", ""})
ALLOWED_PRAGMAS = frozenset({"unroll", "nounroll", "once", "nv_diag_suppress", "nv_diag_default",
                             "nv_diag_warning", "nv_diag_error", "nv_diagnostic", "diag_suppress"})

_FORBIDDEN_WORDS = {
    "__host__": "host code (__host__)",
    "__managed__": "__managed__ memory (state shared with the host and across calls)",
    "malloc": "device heap allocation (malloc)", "free": "device heap (free)",
    "calloc": "device heap allocation (calloc)", "realloc": "device heap allocation (realloc)",
    "new": "device heap allocation (new)",
    "printf": "printf (an output side channel)", "vprintf": "vprintf (an output side channel)",
}
#: Forbidden everywhere; the other words of ``_FORBIDDEN_WORDS`` only when called (a variable
#: may be named ``free_slots`` or even ``free``).
_FORBIDDEN_ALWAYS = frozenset({"__host__", "__managed__", "new"})
#: (pattern, reason, only when called): ``cuXxx(`` is the driver API, but ``cuOffset`` may be a name.
_FORBIDDEN_PATTERNS = [
    (re.compile(r"^cuda[A-Z_]"), "CUDA runtime API {}", False),
    (re.compile(r"^cu[A-Z]"), "CUDA driver API call {}", True),
    (re.compile(r"^__cuda"), "CUDA runtime internals {}", False),
    (re.compile(r"^(cublas|cudnn|cufft|curand|cusparse|cusolver|nccl|nvshmem)", re.I), "library call {}", False),
]
_PTX_FORBIDDEN = [
    (re.compile(r"(^|[\s;{])call(\.uni)?\b"), "inline PTX 'call' (calls outside the kernel)"),
    (re.compile(r"\bbrkpt\b"), "inline PTX 'brkpt'"),
    (re.compile(r"\bpmevent\b"), "inline PTX 'pmevent'"),
    (re.compile(r"(^|[\s;{])\.(global|extern)\s+\.[a-z]"), "a device global declared in inline PTX"),
]
_PTX_CLOCK = re.compile(r"%globaltimer|%clock")
_CLOCK_REASON = "reads a clock ({}): a kernel's work must not depend on time (it could detect a benchmark loop)"
_PTX_TELEMETRY = {
    "reads_smid": re.compile(r"%smid|%nsmid"),
    "nanosleep": re.compile(r"\bnanosleep\b"),
    "trap": re.compile(r"\btrap\b"),
}
_SM90_FEATURES = {
    "wgmma": re.compile(r"\bwgmma\b"), "setmaxnreg": re.compile(r"setmaxnreg"),
    "cp.async.bulk": re.compile(r"cp\.async\.bulk|cp\.reduce\.async\.bulk"),
    "mbarrier.expect_tx": re.compile(r"expect_tx"), "fence.proxy.async": re.compile(r"fence\.proxy\.async"),
    "stmatrix": re.compile(r"\bstmatrix\b"), "elect.sync": re.compile(r"elect\.sync"),
    "cluster": re.compile(r"\.cluster\b|%cluster|barrier\.cluster"),
}
_USES = {
    "mma_sync": re.compile(r"\bmma\.sync\b"), "ldmatrix": re.compile(r"\bldmatrix\b"),
    "cp_async": re.compile(r"\bcp\.async\.(ca|cg)\b"), "tma": re.compile(r"cp\.async\.bulk\.tensor"),
}


@dataclass(frozen=True)
class ScanResult:
    ok: bool
    reasons: tuple[str, ...]
    telemetry: Mapping[str, Any] = field(default_factory=dict)


def scan(candidate: Candidate, *, arch: str | None = None) -> ScanResult:
    """Scan ``candidate``'s source and plan; ``arch`` ("sm_80"/"sm_90a") tightens shared-memory limits.

    Never raises for what a candidate contains: a failure inside the scan is a rejection."""
    if len(candidate.shapes) > MAX_CLAIMED_SHAPES:
        return ScanResult(False, (f"claims {len(candidate.shapes)} shapes (at most {MAX_CLAIMED_SHAPES}: each is "
                                  "checked and timed on the GPU)",), {"claimed_shapes": len(candidate.shapes)})
    try:
        reasons, telemetry, kernels = _scan_source(candidate.source)
        if not telemetry.get("macro_expansion_truncated"):  # else no structure to check the plan against
            reasons += _check_plan(candidate, kernels, arch)
    except (RecursionError, MemoryError, Exception) as exc:  # noqa: BLE001 - untrusted input: reject, never crash
        return ScanResult(False, (f"static scan failed on this candidate ({type(exc).__name__}: {str(exc)[:200]})",), {})
    telemetry["launches"] = len(candidate.plan.launches)
    return ScanResult(not reasons, tuple(dict.fromkeys(reasons)), telemetry)


def scan_source(source: str) -> ScanResult:
    """The source-only half of :func:`scan` (no plan checks)."""
    try:
        reasons, telemetry, _ = _scan_source(source)
    except (RecursionError, MemoryError, Exception) as exc:  # noqa: BLE001
        return ScanResult(False, (f"static scan failed on this source ({type(exc).__name__}: {str(exc)[:200]})",), {})
    return ScanResult(not reasons, tuple(dict.fromkeys(reasons)), telemetry)


# -- source ------------------------------------------------------------------------------------
def _scan_source(source: str) -> tuple[list[str], dict[str, Any], dict[str, _Kernel]]:
    size = len(source.encode())
    telemetry: dict[str, Any] = {"bytes": size, "lines": source.count("\n") + 1}
    if size > MAX_SOURCE_BYTES:
        return [f"source is {size} bytes (limit {MAX_SOURCE_BYTES})"], telemetry, {}
    tokens, directives = lex(source)
    reasons: list[str] = []
    macros, macro_bodies = _check_directives(directives, reasons, telemetry)
    for body in macro_bodies:
        _check_tokens(body, reasons, telemetry)
    _check_tokens(tokens, reasons, telemetry)
    bad = next((t for t in tokens if t.kind == "bad"), None) or next(
        (t for d in directives for t in d.tokens if t.kind == "bad"), None)
    if bad is not None:
        what = "comment" if bad.text.startswith("/*") else "raw string" if 'R"' in bad.text[:4] else "literal"
        reasons.append(f"line {bad.line}: unterminated {what}")
    expander = _Expander(macros)
    try:
        expanded = expander.expand(tokens)
    except _ScanLimit as exc:
        telemetry["macro_expansion_truncated"] = True
        return reasons + [str(exc)], telemetry, {}
    kernels = _structure(expanded, reasons, telemetry)
    telemetry["kernels"] = sorted(kernels)
    return reasons, telemetry, kernels


def _check_directives(directives: list[Directive], reasons: list[str], telemetry: dict[str, Any]
                      ) -> tuple[dict[str, "_Macro"], list[list[Token]]]:
    includes: list[str] = []
    macros: dict[str, _Macro] = {}
    bodies: list[list[Token]] = []
    unroll = 0
    for d in directives:
        where = f"line {d.line}"
        if d.name not in ALLOWED_DIRECTIVES:
            reasons.append(f"{where}: directive #{d.name} is not allowed")
            continue
        if any(t.kind == "punct" and t.text == "##" for t in d.tokens):
            reasons.append(f"{where}: token pasting (##) is not allowed: it can build names the scan cannot see")
        if d.name == "include":
            m = re.fullmatch(r"[<\"]([^>\"]+)[>\"]", d.text.strip())
            header = m.group(1).strip() if m else d.text.strip()
            includes.append(header)
            if header not in ALLOWED_INCLUDES:
                reasons.append(f"{where}: #include {d.text.strip()} is not allowed "
                               f"(allowed: {', '.join(sorted(ALLOWED_INCLUDES))})")
        elif d.name == "pragma":
            word = d.tokens[0].text if d.tokens else ""
            unroll += word == "unroll"
            if word not in ALLOWED_PRAGMAS:
                reasons.append(f"{where}: #pragma {word} is not allowed")
        elif d.name == "define" and d.tokens and d.tokens[0].kind == "id":
            name_tok = d.tokens[0]
            function_like = len(d.tokens) > 1 and d.tokens[1].text == "(" and _adjacent(d.text, name_tok.text)
            if function_like:
                close = _match(d.tokens, 1)
                names = [t.text for t in d.tokens[2:close] if t.text != ","]
                variadic = bool(names) and names[-1] == "..."
                body = list(d.tokens[close + 1:])
                macros[name_tok.text] = _Macro(tuple(n for n in names if n != "..."), variadic, body)
            else:
                body = list(d.tokens[1:])
                macros[name_tok.text] = _Macro(None, False, body)
            bodies.append(body)
        elif d.name in ("if", "elif"):
            bodies.append(list(d.tokens))
    telemetry["includes"] = includes
    telemetry["pragma_unroll"] = unroll
    telemetry["macros"] = len(macros)
    return macros, bodies


def _adjacent(text: str, name: str) -> bool:
    """``#define F(x)`` is function-like only when '(' follows the name with no space."""
    return text.startswith(name + "(")


def _check_tokens(tokens: list[Token], reasons: list[str], telemetry: dict[str, Any]) -> None:
    """Forbidden names and launches in code; forbidden and telemetry patterns in inline PTX."""
    for i, t in enumerate(tokens):
        if t.kind == "id":
            called = i + 1 < len(tokens) and tokens[i + 1].text == "("
            if t.text in _FORBIDDEN_WORDS and (called or t.text in _FORBIDDEN_ALWAYS):
                reasons.append(f"line {t.line}: {_FORBIDDEN_WORDS[t.text]}")
            elif t.text == "main" and called:
                reasons.append(f"line {t.line}: host code (main)")
            elif t.text == "_Pragma":
                arg = tokens[i + 2].text.split() if i + 2 < len(tokens) and tokens[i + 2].kind == "str" else []
                if not arg or arg[0] not in ALLOWED_PRAGMAS:
                    reasons.append(f"line {t.line}: _Pragma({' '.join(arg)!r}) is not allowed")
            else:
                for pattern, what, needs_call in _FORBIDDEN_PATTERNS:
                    if pattern.match(t.text) and (called or not needs_call):
                        reasons.append(f"line {t.line}: {what.format(t.text)}")
                        break
            if t.text in ("clock", "clock64", "__globaltimer") and i + 1 < len(tokens) and tokens[i + 1].text == "(":
                telemetry["reads_clock"] = True
                reasons.append(f"line {t.line}: " + _CLOCK_REASON.format(t.text + "()"))
            if t.text in ("asm", "__asm__", "__asm"):
                telemetry["asm_statements"] = telemetry.get("asm_statements", 0) + 1
        elif t.kind == "punct" and t.text == "<<<":
            reasons.append(f"line {t.line}: kernel launch (<<<) in device code")
        elif t.kind == "str":
            for pattern, what in _PTX_FORBIDDEN:
                if pattern.search(t.text):
                    reasons.append(f"line {t.line}: {what}")
            clock = _PTX_CLOCK.search(t.text)
            if clock:
                telemetry["reads_clock"] = True
                reasons.append(f"line {t.line}: " + _CLOCK_REASON.format("inline PTX " + clock.group(0)))
            for key, pattern in _PTX_TELEMETRY.items():
                if pattern.search(t.text):
                    telemetry[key] = True
            for key, pattern in _SM90_FEATURES.items():
                if pattern.search(t.text) and key not in telemetry.setdefault("sm90_features", []):
                    telemetry["sm90_features"].append(key)
            for key, pattern in _USES.items():
                if pattern.search(t.text):
                    telemetry[key] = True
    if telemetry.get("sm90_features") == []:
        del telemetry["sm90_features"]
