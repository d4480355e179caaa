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
- Telemetry only: ``%smid``, ``nanosleep``, ``trap``.
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
from typing import Any, Iterable, Mapping

from populations import Candidate, PlanError, Shape

from ._lex import Directive, Token, lex

__all__ = ["ScanResult", "scan", "scan_source", "smoke_shapes", "ALLOWED_INCLUDES", "MAX_SOURCE_BYTES", "MAX_CLAIMED_SHAPES",
           "SMEM_LIMITS"]

MAX_SOURCE_BYTES = 256 * 1024
#: Shapes one candidate may claim: every claimed shape is checked and timed on the GPU, so an
#: unbounded claim list is a denial of service on the evaluator.
MAX_CLAIMED_SHAPES = 64
#: Work units (tokens read, copied or emitted) the macro expansion may spend, 20x what our
#: largest template needs: past it the source is refused, so a macro bomb costs the scan
#: well under a second and no memory to speak of.
MAX_EXPANDED_TOKENS = 400_000
ALLOWED_INCLUDES = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "mma.h", "cuda_pipeline.h",
    "cuda_pipeline_primitives.h", "cuda/std/cstdint",
})
ALLOWED_DIRECTIVES = frozenset({"include", "define", "undef", "if", "ifdef", "ifndef", "elif",
                                "elifdef", "elifndef", "else", "endif", "pragma", "error", "warning", "line", ""})
ALLOWED_PRAGMAS = frozenset({"unroll", "nounroll", "once", "nv_diag_suppress", "nv_diag_default",
                             "nv_diag_warning", "nv_diag_error", "nv_diagnostic", "diag_suppress"})
#: Dynamic shared memory a plan may ask for, per arch (A100: 163 KiB, H100/H200: 227 KiB).
SMEM_LIMITS = {"sm_80": 166912, "sm_90a": 232448}

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
_KEYWORDS = frozenset({"if", "for", "while", "switch", "return", "sizeof", "catch", "do", "else",
                       "alignof", "decltype", "static_assert", "__launch_bounds__", "__align__",
                       "alignas", "__attribute__", "asm", "__asm__", "volatile", "defined"})
_ATTRS = frozenset({"__align__", "alignas", "__attribute__", "__launch_bounds__", "__declspec",
                    "__maxnreg__", "__cluster_dims__", "__nv_register_params__", "__noinline__"})
_NOT_INT32 = frozenset({"long", "size_t", "int64_t", "uint64_t", "ptrdiff_t", "float", "double", "half",
                        "__half", "short", "char", "bool", "int16_t", "uint16_t", "int8_t", "uint8_t"})
_INT32_TYPES = frozenset({"int", "unsigned", "signed", "int32_t", "uint32_t", "const", "__restrict__",
                          "std", "cuda", "::"})


@dataclass(frozen=True)
class ScanResult:
    ok: bool
    reasons: tuple[str, ...]
    telemetry: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class _Kernel:
    name: str
    extern_c: bool
    params: list[list[Token]]
    line: int


def smoke_shapes(candidate: Candidate) -> tuple[Shape, ...]:
    """Small ragged instances a generic candidate must also handle (same layout and contract)."""
    base = candidate.shapes[0]
    return (base.with_dims(1, 1, 1), base.with_dims(67, 129, 73))


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


@dataclass(frozen=True)
class _Macro:
    params: tuple[str, ...] | None  # None: object-like
    variadic: bool
    body: list[Token]


class _ScanLimit(Exception):
    """The scan's work budget ran out (a macro bomb, a pathological source): a rejection, not a crash."""


class _Expander:
    """Macro expansion for the structural pass, close enough to the C preprocessor for a filter.

    Object- and function-like macros (``__VA_ARGS__`` and ``#param`` included; ``##`` is
    refused before we get here); arguments are expanded before substitution; a macro is not
    re-expanded inside itself; depth is bounded. Conditionals are not evaluated, so every
    branch is scanned, and ``#undef`` is ignored (conservative).

    Bounded work: every token read, copied or emitted, at any depth (argument expansion
    included: ``#define T(x) x x`` nested is exponential in its output *and* in the work before
    it), costs one unit of ``budget``; running out raises :class:`_ScanLimit`, which the scan
    turns into a rejection (a macro bomb used to cost tens of seconds and gigabytes here).
    """

    def __init__(self, macros: Mapping[str, _Macro], budget: int = MAX_EXPANDED_TOKENS) -> None:
        self.macros = macros
        self.left = budget
        self.truncated = False

    def _charge(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            self.truncated = True
            raise _ScanLimit(f"macro expansion exceeds {MAX_EXPANDED_TOKENS} tokens (a macro bomb?)")

    def expand(self, tokens: list[Token], active: frozenset[str] = frozenset(), depth: int = 0) -> list[Token]:
        out: list[Token] = []
        i = 0
        while i < len(tokens):
            self._charge(1)
            t = tokens[i]
            m = self.macros.get(t.text) if t.kind == "id" and t.text not in active and depth < 32 else None
            if m is None or (m.params is not None and (i + 1 >= len(tokens) or tokens[i + 1].text != "(")):
                out.append(t)
                i += 1
                continue
            if m.params is None:
                body, i = m.body, i + 1
            else:
                close = _match(tokens, i + 1)
                self._charge(close - i)
                body = self._substitute(m, _split_args(tokens[i + 2:close]), active, depth)
                i = close + 1
            self._charge(len(body))
            moved = [Token(b.kind, b.text, t.line) for b in body]
            out.extend(self.expand(moved, active | {t.text}, depth + 1))
        return out

    def _substitute(self, m: _Macro, args: list[list[Token]], active: frozenset[str], depth: int) -> list[Token]:
        env = {p: args[k] if k < len(args) else [] for k, p in enumerate(m.params or ())}
        if m.variadic:
            rest = args[len(m.params or ()):]
            env["__VA_ARGS__"] = [x for k, a in enumerate(rest) for x in ([Token("punct", ",", 0)] if k else []) + a]
        out: list[Token] = []
        skip = False
        for k, b in enumerate(m.body):
            self._charge(1)
            if skip:
                skip = False
                continue
            if b.text == "#" and k + 1 < len(m.body) and m.body[k + 1].text in env:
                arg = env[m.body[k + 1].text]
                self._charge(len(arg))
                out.append(Token("str", " ".join(x.text for x in arg), b.line))
                skip = True
            elif b.kind == "id" and b.text in env:
                out.extend(self.expand(env[b.text], active, depth + 1))
            else:
                out.append(b)
        return out


def _split_args(tokens: list[Token]) -> list[list[Token]]:
    args: list[list[Token]] = [[]]
    depth = 0
    for t in tokens:
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        if t.text == "," and depth == 0:
            args.append([])
        else:
            args[-1].append(t)
    return args if tokens else []


def _match(tokens: list[Token] | tuple[Token, ...], i: int) -> int:
    """Index of the bracket closing the one at ``i`` (or the last index if unbalanced)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    open_, close = tokens[i].text, pairs[tokens[i].text]
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].kind == "punct":
            if tokens[j].text == open_:
                depth += 1
            elif tokens[j].text == close:
                depth -= 1
                if depth == 0:
                    return j
    return len(tokens) - 1


# -- structure: namespace-scope declarations, kernels, mutable state ---------------------------
def _strip_attrs(decl: list[Token]) -> list[Token]:
    """Drop ``__align__(...)``, ``__launch_bounds__(...)``, ``template<...>`` headers and friends."""
    out: list[Token] = []
    i = 0
    while i < len(decl):
        t = decl[i]
        if t.text in _ATTRS and i + 1 < len(decl) and decl[i + 1].text == "(":
            i = _match(decl, i + 1) + 1
            continue
        if t.text == "template" and i + 1 < len(decl) and decl[i + 1].text == "<":
            depth, j = 0, i + 1
            while j < len(decl):
                depth += {"<": 1, ">": -1, ">>": -2}.get(decl[j].text, 0)
                if depth <= 0:
                    break
                j += 1
            i = j + 1
            continue
        out.append(t)
        i += 1
    return out


def _structure(tokens: list[Token], reasons: list[str], telemetry: dict[str, Any]) -> dict[str, _Kernel]:
    kernels: dict[str, _Kernel] = {}
    device_functions = 0
    # scope stack entries: ("ns", extern_c) | ("class", _) | ("func", _) | ("init", _)
    stack: list[tuple[str, bool]] = [("ns", False)]
    saved: list[list[Token]] = [[]]  # per open scope: a class head, kept for what follows its body
    decl: list[Token] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        scope, extern_c = stack[-1]
        if t.kind == "punct" and t.text == "{":
            kind = _brace_kind(decl, scope)
            if kind == "func" and scope == "ns":
                clean = _strip_attrs(decl)
                name, params = _signature(clean)
                quals = {x.text for x in clean}
                if "__global__" in quals:
                    kernels[name] = _Kernel(name, extern_c or _has_extern_c(decl), params, t.line)
                elif "__device__" in quals:
                    device_functions += 1
                else:
                    reasons.append(f"line {t.line}: host function {name or '?'} (namespace-scope functions "
                                   "must be __global__ or __device__)")
            elif kind == "init" and scope != "init":  # a brace initialiser: ``T x = {...}`` or ``T x{...}``
                _check_variable(decl, scope, reasons)
            stack.append((kind, extern_c or (kind == "ns" and _has_extern_c(decl))))
            saved.append(decl + [t] if kind == "class" else [])
            decl = [] if kind != "init" else decl
            i += 1
            continue
        if t.kind == "punct" and t.text == "}":
            if len(stack) > 1:
                closed = stack.pop()[0]
                prefix = saved.pop()
                if closed == "init":
                    decl.append(t)
                    i += 1
                    continue
                if closed == "class":  # ``typedef struct {...} T;`` / ``struct S {...} var;`` go on
                    decl = prefix + [t]
                    i += 1
                    continue
            decl = []
            i += 1
            continue
        if t.kind == "punct" and t.text == ";" and scope != "init":
            if scope in ("ns", "class") and decl:
                _check_ns_declaration(decl, scope, reasons)
            elif scope == "func" and decl:
                _check_variable(decl, scope, reasons)
            decl = []
            i += 1
            continue
        if t.kind == "punct" and t.text == "(" and scope != "init":
            close = _match(tokens, i)  # keep parenthesised groups (incl. lambdas' braces) whole
            decl.extend(tokens[i:close + 1])
            i = close + 1
            continue
        decl.append(t)
        i += 1
    telemetry["device_functions"] = device_functions
    return kernels


def _has_extern_c(decl: list[Token]) -> bool:
    return any(a.text == "extern" and b.kind == "str" and b.text == "C" for a, b in zip(decl, decl[1:]))


def _brace_kind(decl: list[Token], scope: str) -> str:
    if scope in ("func", "init"):
        return "init" if scope == "init" or (decl and any(x.text == "=" for x in decl)) else "func"
    words = [x.text for x in _strip_attrs(decl)]
    if "namespace" in words or (words[:2] == ["extern", "C"] and len(decl) == 2):
        return "ns"
    if decl and decl[-1].kind == "str" and len(decl) >= 2 and decl[-2].text == "extern":
        return "ns"
    if "=" in words:
        return "init"
    if any(w in ("struct", "class", "union", "enum") for w in words) and "(" not in words:
        return "class"
    if "(" in words:
        return "func"
    return "init"


def _signature(decl: list[Token]) -> tuple[str, list[list[Token]]]:
    """Name and parameter token lists of a function definition's declarator."""
    for j, t in enumerate(decl):
        if t.text == "(" and j > 0 and decl[j - 1].kind == "id" and decl[j - 1].text not in _KEYWORDS:
            close = _match(decl, j)
            inner = list(decl[j + 1:close])
            params: list[list[Token]] = []
            cur: list[Token] = []
            depth = 0
            for x in inner:
                if x.text in ("(", "[", "{", "<"):
                    depth += 1
                elif x.text in (")", "]", "}", ">"):
                    depth -= 1
                elif x.text == ">>":
                    depth -= 2
                if x.text == "," and depth == 0:
                    params.append(cur)
                    cur = []
                else:
                    cur.append(x)
            if cur:
                params.append(cur)
            if len(params) == 1 and [x.text for x in params[0]] == ["void"]:
                params = []
            return decl[j - 1].text, params
    return "", []


def _check_ns_declaration(decl: list[Token], scope: str, reasons: list[str]) -> None:
    clean = _strip_attrs(decl)
    cw = [x.text for x in clean]
    if not cw or cw[0] in ("typedef", "using", "static_assert", "friend") or cw[-1] == "}":
        return  # aliases, assertions, and type definitions that declare no variable
    if any(w in ("struct", "class", "union", "enum") for w in cw) and "{" not in cw and "=" not in cw:
        return  # forward declaration
    eq = cw.index("=") if "=" in cw else len(cw)
    if "(" in cw[:eq]:
        return  # a function declaration (prototype); ``__host__`` is refused by the name check
    _check_variable(decl, scope, reasons)


def _check_variable(decl: list[Token], scope: str, reasons: list[str]) -> None:
    words = [x.text for x in _strip_attrs(decl)]
    if not words:
        return
    if scope == "func":
        if "static" not in words and "__device__" not in words and "__managed__" not in words:
            return
        if words[0] == "static_assert":
            return
    if scope == "class" and "static" not in words:
        return
    if words[0] in ("typedef", "using", "static_assert", "return"):
        return
    eq = words.index("=") if "=" in words else len(words)
    head = words[:eq]
    if "__shared__" in head or "__constant__" in head or "constexpr" in head:
        return
    if "extern" in head and "__shared__" not in head:
        reasons.append(f"line {decl[0].line}: extern variable declaration")
        return
    star = max((k for k, w in enumerate(head) if w == "*"), default=-1)
    if "const" in head[star + 1:]:
        return
    name = next((w for w in reversed(head) if re.fullmatch(r"[A-Za-z_]\w*", w) and w not in
                 ("const", "volatile", "static", "__device__", "__restrict__")), "?")
    where = {"ns": "namespace-scope", "class": "static member", "func": "static local"}[scope]
    reasons.append(f"line {decl[0].line}: mutable {where} variable {name} "
                   "(device state that could persist between calls)")


# -- plan --------------------------------------------------------------------------------------
def _param_kind(param: list[Token]) -> str:
    words = [t.text for t in param]
    if "*" in words or "&" in words or "[" in words:
        return "pointer"
    if "__grid_constant__" in words:
        return "grid_constant"
    type_words = [w for w in words[:-1] if w not in ("const", "__restrict__", "volatile")] if len(words) > 1 else words
    if type_words and all(w in _INT32_TYPES for w in type_words):
        return "int"
    if set(words) & _NOT_INT32:
        return "not_int32"
    return "other"  # a typedef or struct the scan cannot size; the GPU worker's checks decide


def _check_plan(candidate: Candidate, kernels: Mapping[str, _Kernel], arch: str | None) -> list[str]:
    plan = candidate.plan
    reasons: list[str] = []
    try:
        plan.validate_static()
    except PlanError as exc:
        return [f"plan: {exc}"]
    for idx, launch in enumerate(plan.launches):
        k = kernels.get(launch.kernel)
        if k is None:
            reasons.append(f"plan launch {idx}: kernel {launch.kernel} is not an extern \"C\" __global__ "
                           "function of the source")
            continue
        if not k.extern_c:
            reasons.append(f"plan launch {idx}: kernel {launch.kernel} is not extern \"C\" (its name is mangled)")
        if len(k.params) != len(launch.args):
            reasons.append(f"plan launch {idx}: kernel {launch.kernel} takes {len(k.params)} parameters, "
                           f"the plan passes {len(launch.args)}")
            continue
        for pos, (arg, param) in enumerate(zip(launch.args, k.params)):
            kind = _param_kind(param)
            want = "pointer" if arg in ("A", "B", "C", "workspace") else \
                "grid_constant" if arg.startswith("tmap:") else "int"
            if kind != want and not (want == "int" and kind == "other"):
                text = " ".join(t.text for t in param)
                need = {"pointer": "a pointer", "grid_constant": "a by-value const __grid_constant__ tensor map",
                        "int": "a 32-bit integer"}[want]
                reasons.append(f"plan launch {idx}: argument {pos} ({arg}) of {launch.kernel} needs {need} "
                               f"parameter, the kernel has `{text}`")
    shapes: Iterable[Shape] = candidate.shapes + (smoke_shapes(candidate) if candidate.generic else ())
    max_smem = SMEM_LIMITS.get(arch or "", SMEM_LIMITS["sm_90a"])
    for shape in shapes:
        try:
            plan.resolve(shape, max_smem=max_smem)
        except PlanError as exc:
            reasons.append(f"plan at {shape}: {exc}")
    return reasons
