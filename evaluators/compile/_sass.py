"""Judge the machine code: what the cubin's SASS and ELF say a kernel does, whatever its PTX looked like.

Why a second look after the PTX scan (:mod:`evaluators.compile._ptxscan`): that scan reads text, and
text can be arranged to mislead a reader (a directive whose string looks like a comment marker, on
the line before a forbidden instruction). The cubin is what runs: ``nvdisasm`` turns it into one
instruction per line, with no comments or strings a kernel author controls, and the cubin's ELF
relocations say which module symbols the code reaches. Refused here:

- **Time, performance counters and launch identity** read from special registers: ``S2R``/``S2UR``/
  ``CS2R`` of ``SR_CLOCKLO``/``HI``, ``SR_GLOBALTIMERLO``/``HI``, ``SR_PM*``, ``SR_VIRTUALSMID``/
  ``SR_SMID`` (the SM a block runs on), ``SR_VIRTID`` (the hardware warp slot, PTX's ``%warpid``).
- **Launch identity in the driver's constant bank**: PTX's ``%gridid``, ``%envreg<n>`` and
  ``%current_graph_exec`` are no registers on sm_80/sm_90 but words of constant bank 0 at offsets
  the compiler fixes per architecture (:data:`DRIVER_SLOTS`, found by compiling each read with this
  toolkit; ``tests/test_sass_check.py`` compiles them again, so a toolkit that moves them fails a
  test instead of opening a hole). Also there: the base of the generic window onto ``__constant__``
  data (``cvta.const``: a pointer through which constant memory could be written), and any
  register-indexed read of bank 0 (an out-of-range index into a parameter array reaches any of them).
- **Writable module-scope data**: a relocation whose target lives in ``.nv.global`` or
  ``.nv.global.init`` (``__device__`` variables const or not, static locals, string literals: all
  writable, all outlive a call). A variable that no instruction reaches (no relocation, or only a
  slot of the global-address table ``.nv.constant4`` that no instruction reads) is allowed: the
  helpers the CUDA atomics headers leave behind.
- **Calls out of the module**: a relocation to an undefined function (``vprintf``, ``malloc``...).

Also read, not refused: which kernels **may wait on other CTAs** (:func:`waiting_kernels`): a loop
(a backward branch) whose body holds a global or generic atomic with a result (``ATOMG``/``ATOM``),
a strong (volatile, relaxed or acquire) load or ``NANOSLEEP``, in the loop or in a subroutine it
calls. Such a kernel only works when its whole grid is resident, so the GPU worker checks residency
for it whether or not its plan declares ``coresident`` (:class:`populations.LaunchPlan`). Not counted:
``YIELD`` (ptxas puts it in honest loops, e.g. around mbarrier waits), atomics without a result
(``RED``) and shared-memory atomics. Not found: a spin on a plain (weak) load, which the compiler is
free to hoist out of the loop; such a kernel still meets the worker's per-phase deadline if it hangs.

Fails closed: no disassembler, or one that cannot read the cubin, is :class:`SassUnavailable`, which
the compile child reports as a failure without a verdict (``compile_error``, not cached), never a pass.
Runs in the compile child (:mod:`evaluators.compile._isolate`) under its deadline and memory cap; this
file imports only the standard library (the child and the fork server load it as a top-level module).
"""
from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from pathlib import Path

__all__ = ["SASS_CHECK_VERSION", "SassUnavailable", "DRIVER_SLOTS", "check_cubin", "judge_sass", "module_references",
           "waiting_kernels", "disassemble"]

#: Part of the cubin cache key: verdicts cached before a rule changed are not trusted.
SASS_CHECK_VERSION = "sass-1"

_FORBIDDEN_SR = {
    "SR_CLOCKLO": "a clock", "SR_CLOCKHI": "a clock", "SR_GLOBALTIMERLO": "the global timer",
    "SR_GLOBALTIMERHI": "the global timer", "SR_GLOBALTIMER": "the global timer",
    "SR_VIRTUALSMID": "the SM it runs on", "SR_SMID": "the SM it runs on",
    "SR_VIRTID": "its hardware warp slot",
}
_PM = re.compile(r"SR_PM\w*")

#: Words of constant bank 0 (per target) that hold launch identity or the constant-data window:
#: (first byte, end byte, what). Found by compiling each PTX read with CUDA 13's ptxas.
DRIVER_SLOTS: dict[str, tuple[tuple[int, int, str], ...]] = {
    "sm_90a": ((0x30, 0x38, "the launch's grid id (%gridid)"), (0x40, 0xc0, "a driver environment register (%envreg)"),
               (0xd0, 0xd8, "the generic address of __constant__ data (cvta.const)"),
               (0x190, 0x198, "the current graph handle (%current_graph_exec)")),
    "sm_80": ((0x30, 0x38, "the launch's grid id (%gridid)"), (0x50, 0x58, "the generic address of __constant__ data (cvta.const)"),
              (0x88, 0x108, "a driver environment register (%envreg)"),
              (0x130, 0x138, "the current graph handle (%current_graph_exec)")),
}
DRIVER_SLOTS["sm_90"] = DRIVER_SLOTS["sm_90a"]

_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);", re.M)
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);|^(\.L_x_\d+|[$\w][\w$.]*):|^\.text\.([\w$.]+):"
                   r"|^\s*\.target\s+(\w+)", re.M)
_SREG_READ = re.compile(r"^(?:@!?U?P\w+\s+)?(?:S2R|S2UR|CS2R)(?:\.\w+)*\s+[^,]+,\s*(SR_\w+)")
_BANK0 = re.compile(r"c\[0x0\]\[([^\]]+)\]")
_REG = re.compile(r"\bU?R(?:[0-9]+)\b")
_BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\w+)*\s+.*`\((\.L_x_\d+)\)")
_WAIT_OP = re.compile(r"^(?:@!?U?P\w+\s+)?(?:ATOMG|ATOM(?!S)(?=[.\s])|NANOSLEEP|(?:LDG|LD)\.[\w.]*STRONG)")
_CALL = re.compile(r"^(?:@!?U?P\w+\s+)?CALL\S*\s+`\(([^)]+)\)")


class SassUnavailable(RuntimeError):
    """The machine code could not be read (no disassembler, or it failed): no verdict, never a pass."""


def disassemble(cubin: bytes, tool: str | None, timeout_s: float = 120) -> str:
    """``nvdisasm -c -ndf`` of ``cubin`` (code sections, no data-flow pass: ~0.1 s cheaper)."""
    if not tool:
        raise SassUnavailable("no nvdisasm to read the machine code with (install the nvidia-cuda-nvdisasm wheel, "
                              "part of evo's cuda extra, or put a CUDA toolkit's nvdisasm on PATH)")
    with tempfile.TemporaryDirectory(prefix="evo-sass-") as tmp:
        path = Path(tmp) / "candidate.cubin"
        path.write_bytes(cubin)
        try:
            out = subprocess.run([tool, "-c", "-ndf", str(path)], capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SassUnavailable(f"nvdisasm could not run: {exc}") from None
    if out.returncode != 0 or not _INSN.search(out.stdout):
        raise SassUnavailable(f"nvdisasm could not read the cubin (exit {out.returncode}): {out.stderr.strip()[:300]}")
    return out.stdout


def _sections(blob: bytes) -> list[tuple[str, int, int, int, int, int, int]]:
    """(name, type, info, offset, size, link, entsize) per section of a 64-bit little-endian ELF."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF")
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_off = raw[shstrndx][4]

    def name(off: int) -> str:
        end = blob.index(b"\0", names_off + off)
        return blob[names_off + off:end].decode(errors="replace")
    return [(name(r[0]), r[1], r[7], r[4], r[5], r[6], r[9]) for r in raw]


def module_references(cubin: bytes) -> list[tuple[str, int, str]]:
    """(section, offset, reason) per relocation that reaches writable module data or calls an
    undefined function. A relocation in a constant bank (``.nv.constant4``: the table of global
    addresses) only counts when an instruction reads that slot (:func:`check_cubin` decides)."""
    try:
        secs = _sections(cubin)
    except (ValueError, struct.error, IndexError) as exc:
        raise SassUnavailable(f"the cubin is not an ELF this check can read ({exc})") from None
    found: list[tuple[str, int, str]] = []
    for _, kind, info_sec, off, size, link, entsize in secs:
        if kind not in (4, 9) or not entsize:  # SHT_RELA, SHT_REL
            continue
        target = secs[info_sec][0] if 0 < info_sec < len(secs) else ""
        _, _, _, sym_off, _, str_link, _ = secs[link]
        str_off = secs[str_link][3]
        for i in range(size // entsize):
            r_offset, info = struct.unpack_from("<QQ", cubin, off + i * entsize)
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", cubin, sym_off + (info >> 32) * 24)
            sym = cubin[str_off + st_name:cubin.index(b"\0", str_off + st_name)].decode(errors="replace")
            home = secs[st_shndx][0] if 0 < st_shndx < len(secs) else ""
            if home.startswith(".nv.global"):
                what = "a string literal" if sym.startswith("$str") else (sym or home)
                found.append((target, r_offset, f"the machine code reaches module-scope global data ({what}): writable "
                              "device memory the evaluator never hands out or resets could carry state from one call to the next"))
            elif st_shndx == 0 and (st_info & 0xF) in (0, 2) and sym and not sym.startswith("."):
                found.append((target, r_offset, f"the machine code calls {sym}, a function outside the module"))
    return found


def judge_sass(sass: str, arch: str | None = None) -> list[str]:
    """Reasons to refuse what ``sass`` (``nvdisasm`` output) does; ``arch`` defaults to its ``.target``."""
    target = arch or next((m.group(5) for m in _LINE.finditer(sass) if m.group(5)), "")
    slots = DRIVER_SLOTS.get(target)
    if slots is None:
        return [f"no map of the driver's constant bank for target {target or '?'}: the machine code cannot be judged"]
    reasons: list[str] = []
    for m in _INSN.finditer(sass):
        text = m.group(2).strip()
        if (sr := _SREG_READ.match(text)) is not None:
            name = sr.group(1)
            why = _FORBIDDEN_SR.get(name) or ("a performance counter" if _PM.fullmatch(name) else None)
            if why:
                reasons.append(f"the machine code reads {why} ({name}): a kernel's work must not depend on time, "
                               "placement or launch identity")
        for ref in _BANK0.findall(text):
            ref = ref.strip()
            if _REG.search(ref):
                reasons.append(f"the machine code reads the driver's constant bank at a computed index (c[0x0][{ref}]): "
                               "it could reach launch identity or the constant-data window")
                continue
            try:
                at = int(ref, 16)
            except ValueError:
                continue
            for lo, hi, what in slots:
                if lo <= at < hi:
                    reasons.append(f"the machine code reads {what} from the driver's constant bank (c[0x0][{ref}])")
    return list(dict.fromkeys(reasons))


def waiting_kernels(sass: str) -> dict[str, str]:
    """Kernel -> why it may wait on other CTAs: a loop (a branch back to an earlier label) holding an
    atomic with a result, a strong load or a sleep, directly or in a subroutine it calls."""
    kernel = ""
    code: dict[str, list[str]] = {}
    labels: dict[tuple[str, str], int] = {}
    for m in _LINE.finditer(sass):
        if m.group(4):
            kernel = m.group(4)
            code.setdefault(kernel, [])
        elif m.group(3):
            labels[(kernel, m.group(3))] = len(code.get(kernel, []))
        elif m.group(1):
            code.setdefault(kernel, []).append(m.group(2).strip())
    out: dict[str, str] = {}
    for name, insns in code.items():
        starts = sorted(i for (k, label), i in labels.items() if k == name and not label.startswith(".L_x_"))

        def subroutine(label: str) -> list[str]:
            first = labels.get((name, label))
            if first is None:
                return []
            return insns[first:next((s for s in starts if s > first), len(insns))]

        for end, text in enumerate(insns):
            b = _BRANCH.match(text)
            start = labels.get((name, b.group(1))) if b else None
            if start is None or start > end:
                continue
            body = insns[start:end + 1]
            body += [t for c in body if (call := _CALL.match(c)) for t in subroutine(call.group(1))]
            hit = next((t for t in body if _WAIT_OP.match(t)), None)
            if hit is not None:
                out[name] = f"a loop around '{hit.split()[1] if hit.startswith('@') else hit.split()[0]}'"
                break
    return out


_CONST_SECTION = re.compile(r"\.nv\.constant(\d+)$")


def _reached(section: str, offset: int, sass: str) -> bool:
    """Whether a relocation at ``section``+``offset`` is reached: always, unless it is a slot of a
    shared constant bank that no instruction reads (by that offset, or by a computed index)."""
    bank = _CONST_SECTION.match(section)
    if bank is None:
        return True
    reads = re.findall(rf"c\[{hex(int(bank.group(1)))}\]\[([^\]]+)\]", sass)
    for ref in reads:
        ref = ref.strip()
        if ref in ("RZ", "URZ"):
            ref = "0x0"
        if _REG.search(ref):
            return True
        try:
            if int(ref, 16) in (offset, offset + 4):
                return True
        except ValueError:
            return True
    return False


def check_cubin(cubin: bytes, tool: str | None, arch: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(reasons to refuse, kernels that may wait on other CTAs) for ``cubin``; raises SassUnavailable."""
    refs = module_references(cubin)
    sass = disassemble(cubin, tool)
    reached = [why for section, offset, why in refs if _reached(section, offset, sass)]
    return list(dict.fromkeys(judge_sass(sass, arch) + reached)), waiting_kernels(sass)
