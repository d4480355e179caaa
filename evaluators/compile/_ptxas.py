"""Parse ``ptxas -v`` output into :class:`populations.KernelStats` and apply the resource policy.

Both back ends print the same information in slightly different layouts (NVRTC prefixes the
property lines with ``ptxas .``; nvcc does not and adds ``cumulative stack size``). We read
line by line: ``Compiling entry function 'NAME'`` opens an entry, ``Function properties for
NAME`` names the function the next stack/spill line describes, ``Used N registers, ...`` closes
the entry's resource line. Only entry functions (kernels) become records; a non-inlined device
function's stack frame still counts against the local-memory policy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from populations import KernelStats

__all__ = ["PtxasReport", "parse_ptxas", "resource_problems", "MAX_LOCAL_BYTES"]

#: A kernel needing more than this much stack or local memory per thread is a register or
#: local-memory blow-up (e.g. a huge private array): it may still be correct, but it is not a
#: GEMM worth a GPU slot, and 16 KiB × 2048 threads × 132 SMs of local memory is 4 GiB.
MAX_LOCAL_BYTES = 16 * 1024

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BYTES = re.compile(r"(\d+) bytes (smem|lmem|cmem\[\d+\]|cumulative stack size)")


@dataclass
class PtxasReport:
    """Per-kernel stats plus the largest per-thread local footprint seen in any function."""

    kernels: tuple[KernelStats, ...]
    frames: dict[str, int] = field(default_factory=dict)  # function -> stack frame (+ lmem) bytes


def parse_ptxas(log: str) -> PtxasReport:
    """Read a ``ptxas -v`` log (possibly mixed with other compiler output)."""
    entries: dict[str, dict[str, int]] = {}
    frames: dict[str, int] = {}
    entry: str | None = None
    props_for: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            entries.setdefault(entry, {})
            continue
        if m := _PROPS.search(line):
            props_for = m.group(1)
            continue
        if (m := _FRAME.search(line)) and props_for is not None:
            frame, st, ld = (int(x) for x in m.groups())
            frames[props_for] = max(frames.get(props_for, 0), frame)
            if props_for in entries:
                entries[props_for].update(stack_frame=frame, spill_stores=st, spill_loads=ld)
            continue
        if (m := _USED.search(line)) and entry is not None:
            rec = entries[entry]
            rec["registers"] = int(m.group(1))
            for num, what in _BYTES.findall(line):
                n = int(num)
                if what == "smem":
                    rec["smem_static"] = n
                elif what.startswith("cmem"):
                    rec["cmem"] = rec.get("cmem", 0) + n
                elif what == "lmem":
                    frames[entry] = max(frames.get(entry, 0), n)
                else:  # cumulative stack size: the kernel's frame plus its callees'
                    frames[entry] = max(frames.get(entry, 0), n)
    kernels = tuple(KernelStats(name=name, **vals) for name, vals in entries.items())
    return PtxasReport(kernels=kernels, frames=frames)


def resource_problems(report: PtxasReport, limit: int = MAX_LOCAL_BYTES) -> list[str]:
    """Reasons to refuse a cubin before it reaches a GPU (empty when acceptable).

    Spills are telemetry (a little spilling can be the fastest choice); a per-thread stack or
    local-memory footprint above ``limit`` is refused.
    """
    return [
        f"function {name} needs {size} bytes of stack/local memory per thread (limit {limit}): "
        "a register/local-memory blow-up"
        for name, size in sorted(report.frames.items())
        if size > limit
    ]
