"""Load and bind: a candidate's cubin loaded once per job and its plan bound per shape (the first
phase of the harness, :mod:`._harness`): the plan's arguments checked against each kernel's
parameter layout, the launchers and parameter packs built once, so a call costs only launches."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from populations import LaunchPlan, PlanError, Shape

from ._tmap import ParamPack, TmapCache


class CandidateKernels:
    """A loaded module and a ``call`` that runs a resolved plan on given buffers.

    ``tmaps`` (the worker's :class:`TmapCache`) is shared by every candidate, so the timing
    rotation's tensor maps are encoded once per worker, not once per candidate."""

    def __init__(self, loader: Any, cubin: bytes, plan: LaunchPlan, tmaps: Optional[TmapCache] = None) -> None:
        self.loader, self.plan = loader, plan
        self.module = loader.load(cubin)
        self.fns: dict[tuple[str, int], Any] = {}
        # the largest dynamic shared memory asked of each kernel so far: every size of one kernel
        # shares one driver function, whose opt-in a later, smaller size must not lower (a launch
        # bound earlier at the larger size would then fail: CUDA_ERROR_INVALID_VALUE)
        self.optin: dict[str, int] = {}
        self.layouts: dict[tuple[str, int], Optional[list[tuple[int, int]]]] = {}  # the driver's, per function
        self.tmaps = tmaps if tmaps is not None else TmapCache()

    def bind(self, shape: Shape) -> tuple[Callable[[Mapping[str, int], Optional[torch.Tensor]], None], int, int]:
        """(call(pointers, workspace_tensor), workspace bytes, launches) for ``shape``; raises
        PlanError, or TensorMapError for a tensor map this shape cannot have.

        The plan's arguments are checked against each kernel's parameters as the driver lays them
        out (count and sizes; where the driver can say): a mismatch is a PlanError, not a launch
        that reads garbage.

        Everything that does not depend on the pointers is done here, once: the functions, the
        bound launchers, one :class:`ParamPack` per launch (rewritten in place by every call: the
        driver copies the arguments at launch) and the tensor-map tables. A call then costs the
        raw stream handle, the pointer and tensor-map bytes written into the packs, and the
        launches."""
        launches, ws = self.plan.resolve(shape)
        steps = []
        for ln in launches:
            key = (ln.kernel, ln.smem)
            if key not in self.fns:
                self.optin[ln.kernel] = max(self.optin.get(ln.kernel, 0), ln.smem)
                self.fns[key] = self.loader.function(self.module, ln.kernel, self.optin[ln.kernel])
            pack = ParamPack(ln.args)
            if key not in self.layouts:
                self.layouts[key] = self.loader.param_layout(self.fns[key])
            if self.layouts[key] is not None:
                try:
                    pack.check_layout(self.layouts[key])
                except ValueError as exc:
                    raise PlanError(f"launch of {ln.kernel}: {exc}") from None
            if self.plan.coresident:
                self._check_resident(self.fns[key], ln)
            tables = tuple((i, self.plan.tensor_maps[name].pointer, self.tmaps.table(self.plan.tensor_maps[name], shape), name)
                           for i, name in enumerate(pack.tmap_names))
            steps.append((self.loader.launcher(self.fns[key], ln.grid, ln.block, ln.smem), pack, pack.pointer_names, tables))
        zero = self.plan.zero_workspace and ws > 0
        stream_of = _raw_stream_getter()
        # the alignment transform's copies: pointers into the workspace, after the plan's own part
        staged = tuple((f"staged{c.operand}", c.offset) for c in self.plan.staged_copies(shape))

        def call(ptrs: Mapping[str, int], wtensor: Optional[torch.Tensor]) -> None:
            stream = stream_of()
            if zero and wtensor is not None:
                wtensor.zero_()
            if staged:
                ptrs = {**ptrs, **{name: ptrs["workspace"] + off for name, off in staged}}
            for go, pack, names, tables in steps:
                pack.set_pointers([ptrs[n] for n in names])
                for i, matrix, get, name in tables:
                    pack.set_tmap(i, get(ptrs[matrix]), name)
                go(stream, pack)
        return call, ws, len(launches)

    def _check_resident(self, fn: Any, ln: Any) -> None:
        """A PlanError when the launch's whole grid cannot be resident on this GPU at once, as a
        ``coresident`` plan needs (its CTAs wait on each other: a CTA left waiting for an SM would
        hang them). Skipped where the loader cannot say."""
        threads = ln.block[0] * ln.block[1] * ln.block[2]
        per_sm = self.loader.resident_blocks(fn, threads, ln.smem)
        if per_sm is None:
            return
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        ctas = ln.grid[0] * ln.grid[1] * ln.grid[2]
        if per_sm * sms < ctas:
            raise PlanError(f"launch of {ln.kernel}: its {ctas} CTAs wait on each other and must be resident at once; "
                            f"this GPU holds {per_sm * sms} ({sms} SMs x {per_sm})")

    def unload(self) -> None:
        self.loader.unload(self.module)


def _raw_stream_getter() -> Callable[[], int]:
    """The current CUDA stream's raw handle, cheaply: ``torch._C._cuda_getCurrentRawStream``
    (what torch's own generated launchers use; no Stream object built per call), falling back
    to ``torch.cuda.current_stream().cuda_stream`` where that private entry point is missing."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return lambda: torch.cuda.current_stream().cuda_stream
    index = torch.cuda.current_device()
    return lambda: raw(index)
