"""``evo eval FILE.cu --shape S [--plan PLAN.json|toml] [--generic] [--json]``: evaluate one kernel.

The plan comes from ``--plan`` (JSON, or TOML with the plan at the top level or under
``[plan]``), or else from a leading comment in the source itself::

    /* evo-plan: {"launches": [{"kernel": "k", "grid": ["cdiv(N, 16)", "cdiv(M, 16)", 1],
                                "block": [16, 16, 1], "args": ["A", "B", "C", "M", "N", "K"]}]} */

The comment must be the first thing in the file (after blank lines) and hold one JSON object,
the same as ``LaunchPlan.to_dict()``. Prints one line per shape (status, speedup over
torch.matmul per timer, message), or the Evaluations as JSON with ``--json``. Exit status 0
when every shape is ``ok``, 1 otherwise, 2 on bad input.

One kernel is timed with ``evaluators.PRECISE_JOB`` (four times a run's device-timer replays,
over three freshly allocated rotations), so that the figure repeats across invocations;
``--quick`` times it as ``evo run`` does.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from populations import Candidate, LaunchPlan, PlanError, Shape, ShapeError, to_plain

from ._cmd_args import UsageError, add_arch, add_gpus, add_json, add_shapes, fail, parse_gpus, resolve_arch

EPILOG = """plan in the source (when --plan is not given): the file starts with one comment
  /* evo-plan: {"launches": [{"kernel": "k", "grid": ["cdiv(N, 16)", "cdiv(M, 16)", 1],
     "block": [16, 16, 1], "args": ["A", "B", "C", "M", "N", "K"]}], "workspace": 0} */
holding LaunchPlan.to_dict() as JSON (contracts.md section 1 and 2 name the fields).
without a GPU (or with --compile-only): the static scan, the compile, ptxas' registers, spills and
shared memory per kernel, and the plan's launches per shape; nothing is run or timed.
exit status: 0 every shape ok, 1 otherwise, 2 bad input or no usable GPU (after the static report);
with --compile-only 0 when it compiles and the plan resolves at every shape, 1 otherwise."""
#: The timers a kernel can be measured with (evaluators' names).
TIMERS = ("device", "offline", "server")
#: The largest kernel source and plan file read (real ones are tens of KB).
SOURCE_LIMIT, PLAN_LIMIT = 4 << 20, 1 << 20
PLAN_COMMENT = re.compile(r"\A\s*/\*\s*evo-plan:\s*(\{.*?\})\s*\*/", re.S)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("eval", help="evaluate one .cu kernel at one or more shapes on this machine's GPUs",
                              description=__doc__.split("\n\n")[0], epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="CUDA source: extern \"C\" __global__ kernels, no host code")
    add_shapes(p)
    p.add_argument("--plan", help="launch plan (.json or .toml); default: the /* evo-plan: {...} */ comment")
    p.add_argument("--generic", action="store_true", help="claim every M,N,K (adds small ragged checks)")
    add_gpus(p)
    p.add_argument("--timers", default="device,offline,server", metavar="LIST",
                   help="which timers measure the kernel, comma-separated: device (CUDA graph replays of the kernel "
                        "alone), offline (whole launch plan, events), server (the plan under a serving-like stream "
                        "of calls); default all three")
    p.add_argument("--loader", default="driver", metavar="NAME",
                   help="how the worker loads and launches the kernel: a name in evaluators.LOADERS (driver, "
                        "the default; pycuda where it is installed; any loader a plug-in registered)")
    p.add_argument("--quick", action="store_true",
                   help="time as a run does (fewer device-timer replays, one rotation) instead of the precise "
                        "preset (evaluators.PRECISE_JOB: 4x the replays over 3 fresh rotations, repeatable across starts)")
    p.add_argument("--compile-only", action="store_true",
                   help="no GPU needed: the static scan, the compile, ptxas' registers/spills/shared memory per "
                        "kernel and the plan's launches per shape (what evo eval prints first where no GPU is visible)")
    add_arch(p)
    add_json(p, "the Evaluations")


def load_plan(source: str, plan_path: str | None) -> LaunchPlan:
    """The plan from a file or from the source's leading ``evo-plan`` comment; raises ValueError
    naming the file the problem is in (the plan file, or the kernel's comment)."""
    from populations import load_toml, read_bounded

    if plan_path:
        where = f"--plan {plan_path}"
        try:
            if plan_path.endswith(".toml"):
                data = load_toml(plan_path, PLAN_LIMIT, "--plan")
                data = data.get("plan", data)
            else:
                data = json.loads(read_bounded(plan_path, PLAN_LIMIT, "--plan").decode("utf-8"))
            return LaunchPlan.from_dict(data)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where}: not UTF-8 text (byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
        except (PlanError, TypeError, AttributeError) as exc:
            raise ValueError(f"{where}: not a launch plan: {exc}") from None
    m = PLAN_COMMENT.match(source)
    if not m:
        raise ValueError("no plan: pass --plan FILE or start the source with /* evo-plan: {json} */")
    try:
        return LaunchPlan.from_dict(json.loads(m.group(1)))
    except json.JSONDecodeError as exc:
        raise ValueError(f"the evo-plan comment is not valid JSON: {exc.msg} (column {exc.colno})") from None
    except (PlanError, TypeError, AttributeError) as exc:
        raise ValueError(f"the evo-plan comment is not a launch plan: {exc}") from None


def build_candidate(args: argparse.Namespace) -> Candidate:
    from populations import read_bounded

    shapes = tuple(Shape.parse(s) for s in args.shape)  # first: a bad shape is named whatever the file holds
    try:
        source = read_bounded(args.file, SOURCE_LIMIT, "kernel").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"kernel {args.file}: not UTF-8 text (byte {exc.start})") from None
    try:
        plan = load_plan(source, args.plan)
    except ValueError as exc:
        raise ValueError(str(exc) if args.plan else f"kernel {args.file}: {exc}") from None
    return Candidate(source=source, plan=plan, shapes=shapes, generic=args.generic, operator="evo eval",
                     meta={"file": str(args.file)})


def _static(args: argparse.Namespace, cand: Candidate) -> int:
    """The CPU-only part (evo.cli._eval_static); without --compile-only, then the one-line error that
    there is no GPU to time it on."""
    from ._eval_static import render_static, static_report

    doc = static_report(cand, resolve_arch(args.arch) or "sm_90a")
    if args.json:
        print(json.dumps({"format": "evo-eval-static/1", **doc}, indent=1))
    else:
        sys.stdout.write(render_static(doc))
    if args.compile_only:
        return 0 if doc["ok"] and not any("error" in s for s in doc["shapes"]) else 1
    sys.stdout.flush()
    return fail("eval", "no GPU is visible, so the kernel was compiled and checked but not run or timed (above); "
                        "evo eval --compile-only asks for only that (exit 0), evo run on a GPU machine times it")


def parse_timers(text: str) -> tuple[str, ...]:
    """``--timers`` as a tuple of known timer names; UsageError naming the unknown ones."""
    names = tuple(t.strip() for t in text.split(","))
    bad = [t for t in names if t not in TIMERS]
    if not names or bad or len(set(names)) != len(names):
        raise UsageError(f"--timers {text!r}: a comma-separated list of distinct names from {', '.join(TIMERS)}")
    return names


def run(args: argparse.Namespace) -> int:
    try:
        gpus = parse_gpus(args.gpus)
        timers = parse_timers(args.timers)
        cand = build_candidate(args)
    except OSError as exc:
        return fail("eval", f"{exc.filename or args.file}: {exc.strerror or exc}")
    except (ValueError, PlanError, ShapeError, json.JSONDecodeError, UsageError) as exc:  # UnicodeDecodeError too
        return fail("eval", f"{args.file}: {exc}" if isinstance(exc, UnicodeDecodeError) else exc)
    from evaluators import LOADERS, PRECISE_JOB, LocalPool, WorkerUnavailable, visible_gpus

    if args.loader not in LOADERS:  # the registry, not a list here: a registered plug-in loader is a choice too
        return fail("eval", f"--loader {args.loader!r}: one of {', '.join(LOADERS.names())}")
    if args.compile_only or (gpus is None and not visible_gpus()):
        return _static(args, cand)
    try:
        with LocalPool(gpus=gpus, compile_workers=1, timers=timers,
                       job_options=None if args.quick else PRECISE_JOB, worker_options={"loader": args.loader}) as pool:
            evals = pool.evaluate([cand])
    except WorkerUnavailable as exc:
        return fail("eval", f"{exc}; evo eval --compile-only scans and compiles the kernel without a GPU")
    from evaluators import buffers_warning

    for why in sorted({w for w in (buffers_warning(e.provenance or {}) for e in evals) if w}):
        print(f"evo eval: WARNING: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps([to_plain(e) for e in evals], indent=1, default=str))
    else:
        for e in evals:
            times = "  ".join(f"{name} {t.median * 1e6:.2f}us x{t.speedup:.3f}" for name, t in sorted(e.timers.items()))
            print(f"{e.shape}  {e.status.value}  {times}  {e.message}".rstrip())
            if e.flags:
                print("  flags: " + "; ".join(e.flags))
    return 0 if all(e.status.value == "ok" for e in evals) else 1
