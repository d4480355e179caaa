#!/usr/bin/env python3
"""Device check of the seed templates: correctness at ragged shapes and timing against torch.matmul.

Run on the GPU machine from the repository root::

    PYTHONUNBUFFERED=1 python3 bench/template_check.py --out "$OUT"

1. Build (CPU, parallel NVRTC processes, before any CUDA context exists): for each template and
   layout, the heuristic picks of every check shape plus seeded random samples, generic and
   specialised, and the timing candidates. Cubins go to a temporary folder.
2. Correctness (one child process per template and layout, so a kernel that poisons its context
   loses only its group): every knob set at every check shape it is valid for, inputs drawn
   fresh, C poisoned with NaN plus a guard band after it, reference fp32 (TF32 off) of the same
   fp16 inputs (fp64 for small shapes); pass = finite, guard untouched, relative Frobenius error
   below 2e-3.
3. Timing (one child): CUDA-graph replays of back-to-back launches over rotating buffer sets
   (>= 256 MiB in total where the shape is small), interleaved with torch.matmul captured the
   same way; medians of per-launch time.
Writes ``results.jsonl`` and ``summary.txt`` under --out and prints the summary last.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from populations import LaunchPlan, Shape, load_templates  # noqa: E402

CHECK_DIMS = [(1, 1, 1), (7, 13, 17), (129, 257, 65), (1000, 1000, 1000), (77, 4096, 4096)]
TIME_SHAPES = ["64x64x64", "256x512x1024", "4096x4096x4096", "8192x8192x8192", "64x8192x8192",
               "4096x4096x4096:NN", "64x8192x8192:NN"]
TOL = 2e-3


# ---- build (CPU) ----------------------------------------------------------------------------
def nvrtc_compile(job: tuple[str, str]) -> tuple[bool, bytes, str, float]:
    source, arch = job
    from cuda.bindings import nvrtc

    t0 = time.time()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--ptxas-options=-v", b"-lineinfo"]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, n = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * n
    nvrtc.nvrtcGetProgramLog(prog, log)
    cubin = b""
    if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, n = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        nvrtc.nvrtcGetCUBIN(prog, cubin)
    nvrtc.nvrtcDestroyProgram(prog)
    return bool(cubin), cubin, log.decode(errors="replace"), time.time() - t0


def build(args: argparse.Namespace, workdir: Path) -> dict:
    templates = load_templates(errors="warn")
    names = [n for n in args.templates.split(",") if n in templates]
    rng = random.Random(args.seed)
    units: dict[str, str] = {}  # sha -> source
    checks, timings = [], []

    def unit(source: str) -> str:
        sha = hashlib.sha256(source.encode()).hexdigest()[:16]
        units[sha] = source
        return sha

    for name in names:
        t = templates[name]
        for layout in t.layouts:
            shapes = [Shape(m, n, k, layout) for m, n, k in CHECK_DIMS]
            shapes = [s for s in shapes if t.applicable(s, 90)]
            if not shapes:
                continue
            knob_sets, seen = [], set()
            for s in shapes:
                for k in t.heuristic(s):
                    knob_sets.append(k)
            knob_sets += t.sample(rng, None, args.samples)
            for k in knob_sets:
                key = json.dumps(k, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                valid = [s for s in shapes if not t.check(k, s)]
                if not valid:
                    continue
                src, plan = t.render(k, valid[0])
                checks.append(dict(template=name, layout=layout, knobs=k, unit=unit(src), plan=plan.to_dict(),
                                   shapes=[str(s) for s in valid], specialized=False))
            for s in shapes:  # specialised first picks
                picks = t.heuristic(s)
                if picks:
                    src, plan = t.render(picks[0], s, specialize=True)
                    checks.append(dict(template=name, layout=layout, knobs=picks[0], unit=unit(src),
                                       plan=plan.to_dict(), shapes=[str(s)], specialized=True))
        for text in TIME_SHAPES:
            s = Shape.parse(text)
            if not t.applicable(s, 90):
                continue
            picks = t.heuristic(s)[: args.time_picks]
            extra = t.sample(rng, s, args.time_samples)
            for i, k in enumerate(picks + extra):
                src, plan = t.render(k, s)
                timings.append(dict(template=name, shape=str(s), knobs=k, unit=unit(src), plan=plan.to_dict(),
                                    specialized=False, origin="heuristic" if i < len(picks) else "sample"))
            if picks:
                src, plan = t.render(picks[0], s, specialize=True)
                timings.append(dict(template=name, shape=str(s), knobs=picks[0], unit=unit(src), plan=plan.to_dict(),
                                    specialized=True, origin="heuristic"))

    t0 = time.time()
    compiled: dict[str, dict] = {}
    with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        shas = list(units)
        for sha, (ok, cubin, log, secs) in zip(shas, pool.map(nvrtc_compile, [(units[s], args.arch) for s in shas])):
            path = workdir / f"{sha}.cubin"
            if ok:
                path.write_bytes(cubin)
            regs = [line.strip() for line in log.splitlines() if "Used" in line or "spill" in line]
            compiled[sha] = dict(ok=ok, path=str(path), log=log[-2000:] if not ok else "", secs=secs, ptxas=regs)
    print(f"built {len(units)} units in {time.time() - t0:.1f} s "
          f"({sum(not c['ok'] for c in compiled.values())} failed)", flush=True)
    return dict(checks=checks, timings=timings, compiled=compiled)


# ---- GPU side ---------------------------------------------------------------------------------
class Runner:
    """Loads cubins and launches plans with cuda.bindings on torch's current stream."""

    def __init__(self) -> None:
        import torch
        from cuda.bindings import driver

        self.torch, self.drv = torch, driver
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        self.ok(driver.cuInit(0), "cuInit")
        self.modules: dict[str, object] = {}

    def ok(self, res, what: str):
        err, *rest = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise RuntimeError(f"{what}: {getattr(err, 'name', err)}")
        return rest[0] if len(rest) == 1 else rest

    def function(self, cubin_path: str, name: str, smem: int):
        mod = self.modules.get(cubin_path)
        if mod is None:
            mod = self.ok(self.drv.cuModuleLoadData(Path(cubin_path).read_bytes()), "cuModuleLoadData")
            self.modules[cubin_path] = mod
        fn = self.ok(self.drv.cuModuleGetFunction(mod, name.encode()), f"cuModuleGetFunction {name}")
        if smem > 48 * 1024:
            attr = self.drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self.ok(self.drv.cuFuncSetAttribute(fn, attr, smem), "cuFuncSetAttribute")
        return fn

    def prepare(self, cubin_path: str, plan: LaunchPlan, shape: Shape):
        """A callable launching the plan for (A, B, C, W), and the workspace bytes it needs."""
        launches, ws = plan.resolve(shape)
        fns = [self.function(cubin_path, rl.kernel, rl.smem) for rl in launches]
        torch, drv = self.torch, self.drv

        def run(A, B, C, W) -> None:
            ptrs = {"A": A.data_ptr(), "B": B.data_ptr(), "C": C.data_ptr(), "workspace": W.data_ptr() if W is not None else 0}
            stream = drv.CUstream(torch.cuda.current_stream().cuda_stream)
            for fn, rl in zip(fns, launches):
                vals = [ctypes.c_void_p(ptrs[a]) if isinstance(a, str) else ctypes.c_int(a) for a in rl.args]
                arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
                self.ok(drv.cuLaunchKernel(fn, *rl.grid, *rl.block, rl.smem, stream, ctypes.addressof(arr), 0),
                        f"cuLaunchKernel {rl.kernel}")

        return run, ws


def make_inputs(torch, shape: Shape, gen):
    a = torch.randn(shape.m, shape.k, generator=gen, device="cuda").half()
    b = torch.randn(*((shape.n, shape.k) if shape.layout == "TN" else (shape.k, shape.n)), generator=gen, device="cuda").half()
    return a, b


def reference(torch, a, b, layout: str):
    small = a.shape[0] * a.shape[1] * (b.shape[0] if layout == "TN" else b.shape[1]) <= 1 << 27
    dt = torch.float64 if small else torch.float32
    bb = b.to(dt).t() if layout == "TN" else b.to(dt)
    return a.to(dt) @ bb


def correctness_child(jobfile: str, template: str, layout: str, out: str, lite: bool = False) -> None:
    """Check the jobs of one template and layout ("*" for all). ``lite``: a few knob sets per group
    at small shapes only (for runs under compute-sanitizer, which is slow)."""
    jobs = json.loads(Path(jobfile).read_text())
    r = Runner()
    torch = r.torch
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    GUARD = 4096
    selected = [j for j in jobs["checks"] if template in ("*", j["template"]) and layout in ("*", j["layout"])]
    if lite:
        groups: dict[tuple, list] = {}
        for j in selected:
            groups.setdefault((j["template"], j["layout"]), []).append(j)
        selected = [j for g in groups.values() for j in g[::3][:5]]
    with open(out, "a") as fh:
        for job in selected:
            comp = jobs["compiled"][job["unit"]]
            for text in job["shapes"]:
                s = Shape.parse(text)
                if lite and s.m * s.n * s.k > 4_000_000:
                    continue
                rec = dict(kind="sanitize" if lite else "check", template=job["template"], layout=job["layout"],
                           shape=text, knobs=job["knobs"], specialized=job["specialized"])
                if not comp["ok"]:
                    rec.update(ok=False, error="compile: " + comp["log"][-400:])
                    fh.write(json.dumps(rec) + "\n")
                    continue
                try:
                    plan = LaunchPlan.from_dict(job["plan"])
                    run, ws = r.prepare(comp["path"], plan, s)
                    a, b = make_inputs(torch, s, gen)
                    cbuf = torch.full((s.m * s.n + GUARD,), float("nan"), dtype=torch.float16, device="cuda")
                    wbuf = torch.full((max(ws, 4) // 4,), float("nan"), dtype=torch.float32, device="cuda")
                    a0, b0 = a.clone(), b.clone()
                    run(a, b, cbuf, wbuf)
                    torch.cuda.synchronize()
                    c = cbuf[: s.m * s.n].view(s.m, s.n)
                    ref = reference(torch, a, b, s.layout)
                    finite = bool(torch.isfinite(c).all())
                    guard_ok = bool(torch.isnan(cbuf[s.m * s.n:]).all())
                    inputs_ok = bool(torch.equal(a, a0) and torch.equal(b, b0))
                    err = float(torch.linalg.norm(c.to(ref.dtype) - ref) / max(float(torch.linalg.norm(ref)), 1e-30)) if finite else float("nan")
                    ok = finite and guard_ok and inputs_ok and err < TOL
                    rec.update(ok=ok, rel_err=err, finite=finite, guard_ok=guard_ok, inputs_ok=inputs_ok)
                except Exception as exc:  # a poisoned context fails every later call: stop this group
                    rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                    fh.write(json.dumps(rec) + "\n")
                    fh.flush()
                    if "ILLEGAL" in str(exc) or "illegal" in str(exc) or "LAUNCH_FAILED" in str(exc) or "MISALIGNED" in str(exc):
                        return
                    continue
                fh.write(json.dumps(rec) + "\n")
                fh.flush()


def graph_time(torch, calls, reps: int = 15):
    """Per-launch milliseconds of each callable list, captured as graphs and replayed interleaved."""
    graphs = []
    for fns in calls:
        for f in fns:  # warm-up outside capture
            f()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        graphs.append((g, len(fns)))
    times = [[] for _ in graphs]
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        for i, (g, n) in enumerate(graphs):
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            times[i].append(e0.elapsed_time(e1) / n)
    return [sorted(t)[len(t) // 2] for t in times]


def timing_child(jobfile: str, out: str) -> None:
    jobs = json.loads(Path(jobfile).read_text())
    r = Runner()
    torch = r.torch
    gen = torch.Generator(device="cuda")
    gen.manual_seed(99)
    by_shape: dict[str, list] = {}
    for job in jobs["timings"]:
        by_shape.setdefault(job["shape"], []).append(job)
    with open(out, "a") as fh:
        for text, group in by_shape.items():
            s = Shape.parse(text)
            per_set = 2 * (s.m * s.k + s.n * s.k + s.m * s.n)
            nsets = max(1, min(64, -(-(256 << 20) // per_set)))
            launches = max(nsets, 20 if s.flops > 1e11 else 100)
            sets = []
            for _ in range(nsets):
                a, b = make_inputs(torch, s, gen)
                sets.append((a, b, torch.empty(s.m, s.n, dtype=torch.float16, device="cuda")))
            if s.layout == "TN":
                base = [lambda a=a, b=b, c=c: torch.matmul(a, b.t(), out=c) for a, b, c in sets]
            else:
                base = [lambda a=a, b=b, c=c: torch.matmul(a, b, out=c) for a, b, c in sets]
            base = [base[i % nsets] for i in range(launches)]
            ref_ms = None
            for job in group:
                comp = jobs["compiled"][job["unit"]]
                rec = dict(kind="time", template=job["template"], shape=text, knobs=job["knobs"],
                           specialized=job["specialized"], origin=job["origin"], ptxas=comp.get("ptxas"))
                if not comp["ok"]:
                    rec.update(ok=False, error="compile failed")
                    fh.write(json.dumps(rec) + "\n")
                    continue
                try:
                    run, ws = r.prepare(comp["path"], LaunchPlan.from_dict(job["plan"]), s)
                    w = torch.empty(max(ws, 4), dtype=torch.uint8, device="cuda")
                    # correctness at the timed shape first
                    a, b, c = sets[0]
                    c.fill_(float("nan"))
                    run(a, b, c, w)
                    torch.cuda.synchronize()
                    ref = reference(torch, a, b, s.layout)
                    err = float(torch.linalg.norm(c.float().double() - ref.double()) / torch.linalg.norm(ref.double()))
                    mine = [lambda a=a, b=b, c=c: run(a, b, c, w) for a, b, c in sets]
                    mine = [mine[i % nsets] for i in range(launches)]
                    t_mine, t_ref = graph_time(torch, [mine, base])
                    ref_ms = t_ref
                    rec.update(ok=err < TOL, rel_err=err, ms=t_mine, torch_ms=t_ref, speedup=t_ref / t_mine,
                               tflops=s.flops / (t_mine * 1e-3) / 1e12)
                except Exception as exc:
                    rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                    fh.write(json.dumps(rec) + "\n")
                    fh.flush()
                    if "ILLEGAL" in str(exc) or "illegal" in str(exc) or "LAUNCH_FAILED" in str(exc):
                        return
                    continue
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
            print(f"timed {text}: torch {ref_ms} ms", flush=True)


# ---- orchestration ---------------------------------------------------------------------------
def summarize(results: Path) -> str:
    recs = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    lines = []
    checks = [r for r in recs if r["kind"] == "check"]
    lines.append(f"correctness: {sum(r['ok'] for r in checks)}/{len(checks)} passed")
    lite = [r for r in recs if r["kind"] == "sanitize"]
    if lite:
        lines.append(f"under memcheck: {sum(r['ok'] for r in lite)}/{len(lite)} passed (see sanitize.txt for its report)")
    groups: dict[tuple, list] = {}
    for r in checks:
        groups.setdefault((r["template"], r["layout"], r["shape"]), []).append(r)
    for (t, lay, sh), rs in sorted(groups.items()):
        errs = [r.get("rel_err") for r in rs if r.get("rel_err") is not None]
        lines.append(f"  {t:9s} {sh:24s} {sum(r['ok'] for r in rs)}/{len(rs)} ok, max rel err "
                     f"{max(errs) if errs else float('nan'):.2e}")
    for r in checks:
        if not r["ok"]:
            lines.append(f"  FAIL {r['template']} {r['shape']} spec={r['specialized']} {json.dumps(r['knobs'])} "
                         f"err={r.get('rel_err')} finite={r.get('finite')} guard={r.get('guard_ok')} {r.get('error', '')}")
    times = [r for r in recs if r["kind"] == "time"]
    lines.append("timing (CUDA-graph replay, median per launch):")
    lines.append(f"  {'shape':26s} {'template':9s} {'origin':9s} {'spec':5s} {'us':>9s} {'torch us':>9s} {'x torch':>7s} {'TFLOP/s':>8s} knobs")
    for r in times:
        if r.get("ms") is None:
            lines.append(f"  {r['shape']:26s} {r['template']:9s} FAILED {r.get('error', '')}")
            continue
        lines.append(f"  {r['shape']:26s} {r['template']:9s} {r['origin']:9s} {str(r['specialized'])[0]:5s} "
                     f"{r['ms'] * 1e3:9.2f} {r['torch_ms'] * 1e3:9.2f} {r['speedup']:7.3f} {r['tflops']:8.1f} "
                     f"{'' if r['ok'] else 'WRONG '}{json.dumps(r['knobs'], separators=(',', ':'))}")
    best: dict[str, dict] = {}
    for r in times:
        if r.get("ok") and (r["shape"] not in best or r["speedup"] > best[r["shape"]]["speedup"]):
            best[r["shape"]] = r
    lines.append("best per shape:")
    for sh, r in best.items():
        lines.append(f"  {sh:26s} {r['template']:9s} {r['ms'] * 1e3:9.2f} us vs torch {r['torch_ms'] * 1e3:9.2f} us = {r['speedup']:.3f}x")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    p.add_argument("--templates", default="sm80_mma,tiny")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--samples", type=int, default=10, help="random knob sets per template and layout for correctness")
    p.add_argument("--time-picks", type=int, default=3)
    p.add_argument("--time-samples", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 2))
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--sanitize", type=int, default=0, metavar="SECONDS",
                   help="also run a few small checks under compute-sanitizer memcheck, with this time limit")
    p.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, jobfile, out, *rest = args.child
        if kind in ("check", "lite"):
            correctness_child(jobfile, rest[0], rest[1], out, lite=kind == "lite")
        else:
            timing_child(jobfile, out)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    results.write_text("")
    workdir = Path(tempfile.mkdtemp(prefix="evo_tpl_"))
    jobs = build(args, workdir)
    jobfile = workdir / "jobs.json"
    jobfile.write_text(json.dumps(jobs))
    (out / "build.json").write_text(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "path"} for k, v in jobs["compiled"].items()}, indent=1))
    groups = sorted({(j["template"], j["layout"]) for j in jobs["checks"]})
    for t, lay in groups:
        t0 = time.time()
        rc = subprocess.run([sys.executable, __file__, "--child", "check", str(jobfile), str(results), t, lay]).returncode
        print(f"checked {t} {lay} in {time.time() - t0:.1f} s (rc {rc})", flush=True)
    if not args.skip_timing:
        t0 = time.time()
        rc = subprocess.run([sys.executable, __file__, "--child", "time", str(jobfile), str(results)]).returncode
        print(f"timed in {time.time() - t0:.1f} s (rc {rc})", flush=True)
    if args.sanitize:
        tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        t0 = time.time()
        if Path(tool).exists():
            with open(out / "sanitize.txt", "w") as log:
                try:
                    rc = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "9", sys.executable, __file__,
                                         "--child", "lite", str(jobfile), str(results), "*", "*"],
                                        stdout=log, stderr=subprocess.STDOUT, timeout=args.sanitize).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            print(f"memcheck in {time.time() - t0:.1f} s (rc {rc}; 9 = errors found)", flush=True)
        else:
            print("compute-sanitizer not found", flush=True)
    summary = summarize(results)
    (out / "summary.txt").write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
