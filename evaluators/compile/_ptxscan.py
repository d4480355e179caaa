"""Judge what the compiler produced: scan a candidate's PTX for time sources and writable module state.

Why PTX and not only the source: the source scan (:mod:`evaluators.static._static`) sees spellings,
and a spelling can hide (a clock read built by macros, a string split across inline-asm
operands, a const table written through a cast, a static local, a string literal stored into).
The PTX is what ptxas turns into SASS: every inline-asm string appears in it verbatim (ptxas
has no preprocessor: a ``#`` line in a module body is a syntax error), every special register
read is named, every module-scope variable is declared. So whatever the source looked like:

- **Time and launch identity** (refused): ``%clock``, ``%clock64``, ``%clock_hi``,
  ``%globaltimer``/``_lo``/``_hi`` (time), ``%pm0``-``%pm7``(``_64``) (performance counters,
  which count across launches), ``%envreg<n>`` (driver-defined), ``%gridid`` (a per-launch
  sequence number) and ``%current_graph_exec`` (tells a CUDA-graph replay, i.e. the timer, from
  an eager call, i.e. the check). ``pmevent`` and ``brkpt`` too.
- **Writable module state** (refused): any ``.global`` variable that the code names
  (``__device__`` data, const-qualified or not, static locals, string literals: all live in
  writable global memory and outlive a call; one declared and never named again, like a helper
  the CUDA atomics headers leave behind, is unreachable and allowed), ``.tex``/``.surf``/``.sampler`` references, and ``cvta.const``
  (the address of ``__constant__`` data turned into a generic pointer, through which it can be
  stored to). ``.const`` data read with ``ld.const`` is allowed, so is ``.shared`` (static
  ``__shared__`` arrays are module-scope ``.shared`` in PTX and live one block).
- **Calls out of the module** (refused): ``.extern .func`` declarations (``vprintf``,
  ``malloc``, ``__assertfail``, device-side launches ``cudaLaunchDeviceV2``...).

First the text is tokenized (:func:`blank_ptx`): one left-to-right pass that knows string literals
and both comment forms, so a comment marker inside a string (``.pragma "//";``, which ptxas accepts
with a warning) neither starts a comment nor hides the instruction after it on that line, and text
in a comment or a string is neither a finding nor a hiding place (strings become ``""``). Refused
there too: a string holding a comment marker (no compiler emits one; only an attempt to blind a text
scan does), debug-info directives (``.file``, ``.loc``, ``.section``, ``@@DWARF``: evo's flags never
ask for debug info, so only inline asm could put them there), an unterminated comment or string.
This is the early, cheap refusal; the machine code is judged again after it
(:mod:`evaluators.compile._sass`), which no text arrangement can blind. The scan is a few linear
regular-expression passes, and it runs in the compile child (:mod:`evaluators.compile._isolate`),
under its deadline and memory cap.
This file imports only the standard library (the child and the fork server load it as a
top-level module).
"""
from __future__ import annotations

import re
from collections import Counter

__all__ = ["scan_ptx", "blank_ptx", "REJECT_MARK", "PTX_SCAN_VERSION"]

#: A compile child's log starting with this is a refusal by this scan, not a compiler error.
REJECT_MARK = "evo compiled-output scan refused: "
#: Part of the cubin cache key: verdicts cached before a rule changed are not trusted.
PTX_SCAN_VERSION = "ptxscan-2"

#: One token per match, leftmost first: a string, a line comment, a block comment, or the opening of
#: an unterminated string or comment (which ptxas would not have accepted).
_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|"|/\*', re.S)
_MARKERS = ("//", "/*", "*/")
_DEBUG_DIRECTIVE = re.compile(r"(?<![\w$%.])\.(file|loc|section)\b|@@DWARF")
_SREG = re.compile(r"%(clock64|clock_hi|clock|globaltimer_lo|globaltimer_hi|globaltimer|pm[0-7](?:_64)?"
                   r"|envreg\d+|gridid|current_graph_exec)(?![\w$])")
_SREG_WHY = {
    "clock": "reads a clock", "globaltimer": "reads the global timer", "pm": "reads a performance counter",
    "envreg": "reads a driver environment register", "gridid": "reads the launch's grid id (a per-launch sequence)",
    "current_graph_exec": "reads the current graph handle (tells timed graph replays from checked calls)",
}
_INSN = re.compile(r"(?<![\w.$])(pmevent|brkpt)(?![\w$])")
#: A declaration is a statement whose first token is the state-space directive (after linkage).
_DECL = re.compile(r"(?:^|[;{}])\s*((?:\.(?:visible|extern|weak|common)\s+)*)"
                   r"\.(global|tex|texref|surfref|samplerref|sampler)\b\s*([^;{}]*)", re.M)
_EXTERN_FUNC = re.compile(r"(?:^|[;{}])\s*\.extern\s+\.func\b[^;]*?([A-Za-z_$%][\w$]*)\s*\(", re.M)
_IDENT = re.compile(r"[A-Za-z_$%][\w$]*")
_CVTA_CONST = re.compile(r"(?<![\w$])cvta\.const\b")


def _sreg_reason(name: str) -> str:
    key = next(k for k in _SREG_WHY if name.startswith(k))
    return f"the compiled PTX {_SREG_WHY[key]} (%{name}): a kernel's work must not depend on time or launch identity"


def blank_ptx(ptx: str) -> tuple[str, list[str]]:
    """``ptx`` with every comment replaced by a space and every string literal by ``""``, and the
    reasons to refuse what the tokens themselves show (a string holding a comment marker, an
    unterminated comment or string); one pass, linear in the length."""
    out: list[str] = []
    problems: list[str] = []
    at = 0
    for m in _TOKENS.finditer(ptx):
        tok = m.group(0)
        out.append(ptx[at:m.start()])
        at = m.end()
        if tok in ('"', "/*"):
            problems.append(f"the compiled PTX has an unterminated {'string' if tok == chr(34) else 'comment'}")
            out.append(" ")
            break
        if tok.startswith('"'):
            if any(mark in tok for mark in _MARKERS):
                problems.append(f"the compiled PTX has a string that looks like a comment marker ({tok[:40]}): "
                                "no compiler emits one; it can only be there to blind a scan of the text")
            out.append('""')
        else:
            out.append("\n" * tok.count("\n") or " ")
    else:
        out.append(ptx[at:])
    return "".join(out), list(dict.fromkeys(problems))


def scan_ptx(ptx: str) -> list[str]:
    """Reasons to refuse ``ptx`` (empty when it passes); linear in its length."""
    text, reasons = blank_ptx(ptx)
    for m in dict.fromkeys(m.group(0) for m in _DEBUG_DIRECTIVE.finditer(text)):
        reasons.append(f"the compiled PTX has the debug directive {m}: evo compiles without debug information, "
                       "so only inline asm could have put it there")
    for name in dict.fromkeys(m.group(1) for m in _SREG.finditer(text)):
        reasons.append(_sreg_reason(name))
    for insn in dict.fromkeys(m.group(1) for m in _INSN.finditer(text)):
        reasons.append(f"the compiled PTX uses '{insn}'")
    uses = Counter(_IDENT.findall(text))
    for m in _DECL.finditer(text):
        space, rest = m.group(2), m.group(3).strip()
        name = _IDENT.findall(re.sub(r"\.\w+", " ", rest.split("=")[0]))
        what = name[0] if name else "?"
        if space == "global" and uses[what] <= 1:
            continue  # declared, never named again: no instruction can reach it (CUDA headers leave such helpers)
        if space == "global":
            reasons.append(f"module-scope .global variable {what} in the compiled PTX: writable device memory the "
                           "evaluator never hands out or resets (a __device__ or const table, a static local, "
                           "a string literal) could carry state from one call to the next")
        else:
            reasons.append(f"module-scope .{space} reference {what} in the compiled PTX (texture/surface state)")
    for m in _EXTERN_FUNC.finditer(text):
        reasons.append(f"the compiled PTX calls external function {m.group(1)} (printf, malloc, assert, "
                       "device-side launches: calls out of the kernel)")
    if _CVTA_CONST.search(text):
        reasons.append("the compiled PTX turns the address of __constant__ data into a generic pointer "
                       "(cvta.const): constant memory could be written through it")
    return list(dict.fromkeys(reasons))
