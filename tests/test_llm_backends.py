"""LLM backends without a model: the OpenAI-compatible client's outcomes against a misbehaving
server, model configuration as data, and the model bandit.

The server here is a test double for a boundary we do not own (an HTTP server that times out,
answers garbage, fails with 5xx or refuses structured output on purpose); the client against a
real server that serves the default model is in tests/test_llm_http.py.
"""
from __future__ import annotations

import json
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from operators.llm import ModelBandit, ModelSpec, get_backend, load_models, resolve_model
from operators.llm._openai import OpenAIBackend

OK = {"model": "m", "choices": [{"message": {"role": "assistant", "content": '{"BM": 64}'}, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 11, "completion_tokens": 5}}


class MisbehavingServer:
    """Test double of an OpenAI-compatible server: ``script`` maps the request number (from 1) and
    body to (status, body bytes, delay seconds)."""

    def __init__(self, script: Callable[[int, dict], tuple[int, bytes, float]]) -> None:
        self.script, self.requests, self.bodies = script, 0, []
        self.active = self.max_active = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests += 1
                    n = outer.requests
                    outer.bodies.append(body)
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                try:
                    status, data, delay = outer.script(n, body)
                    time.sleep(delay)
                finally:
                    # The request stops counting as active before its reply goes out: a client that
                    # gets the reply may send its next request at once, and this thread could still
                    # be between the write and a later decrement (seen as max_active 3 of 2 in CI).
                    with outer.lock:
                        outer.active -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., MisbehavingServer]]:
    servers: list[MisbehavingServer] = []

    def start(script: Callable[[int, dict], tuple[int, bytes, float]]) -> MisbehavingServer:
        servers.append(MisbehavingServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def client(url: str, **kw: Any) -> OpenAIBackend:
    values = {"timeout_s": 2.0, "retries": 2, "backoff_s": 0.01, "concurrency": 4, **kw}
    return OpenAIBackend(ModelSpec(name="test", backend="openai", model="m", base_url=url, **values))


MSGS = [{"role": "user", "content": "hi"}]


class Schema:
    def json_schema(self) -> dict:
        return {"type": "object", "properties": {"BM": {"enum": [32, 64]}}, "additionalProperties": False}


def test_answer_with_accounting_and_structured_request(serve) -> None:
    srv = serve(lambda n, body: (200, json.dumps(OK).encode(), 0.0))
    c = client(srv.url).complete(MSGS, rng=random.Random(0), temperature=0.5, max_new_tokens=20, grammar=Schema())
    assert c.text == '{"BM": 64}' and c.finished and not c.error
    assert (c.prompt_tokens, c.completion_tokens, c.model) == (11, 5, "m") and c.seconds > 0
    body = srv.bodies[0]
    assert body["response_format"]["json_schema"]["schema"]["properties"]["BM"] == {"enum": [32, 64]}
    assert body["temperature"] == 0.5 and body["max_tokens"] == 20 and body["messages"] == MSGS
    guided = client(srv.url, structured="guided_json")
    guided.complete(MSGS, rng=random.Random(0), grammar=Schema())
    assert "guided_json" in srv.bodies[1] and "response_format" not in srv.bodies[1]


def test_garbage_timeouts_and_errors_are_counted_outcomes(serve) -> None:
    garbage = serve(lambda n, body: (200, b"<html>not json</html>", 0.0))
    b = client(garbage.url)
    c = b.complete(MSGS, rng=random.Random(0))
    assert c.text == "" and not c.finished and c.error.startswith("garbage: the reply is not a chat completion")
    assert "after 3 attempts" in c.error and b.stats["garbage"] == 3 and b.stats["retries"] == 2
    assert garbage.requests == 3
    slow = serve(lambda n, body: (200, json.dumps(OK).encode(), 1.5))
    b = client(slow.url, timeout_s=0.3, retries=1)
    start = time.monotonic()
    c = b.complete(MSGS, rng=random.Random(0))
    assert c.error.startswith("timeout: no reply within 0.3 s") and b.stats["timeout"] == 2
    assert time.monotonic() - start < 1.5  # gave up on its own deadline, not the server's
    flaky = serve(lambda n, body: (503, b'{"error": "busy"}', 0.0) if n == 1 else (200, json.dumps(OK).encode(), 0.0))
    b = client(flaky.url)
    assert b.complete(MSGS, rng=random.Random(0)).text == '{"BM": 64}'
    assert b.stats["http_503"] == 1 and b.stats["retries"] == 1 and b.stats["ok"] == 1
    bad = serve(lambda n, body: (404, b'{"error": "no such model"}', 0.0))
    b = client(bad.url)
    c = b.complete(MSGS, rng=random.Random(0))
    assert c.error.startswith("http_404: HTTP 404") and "no such model" in c.error and bad.requests == 1  # no retry
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = client(f"http://127.0.0.1:{port}/v1", retries=0).complete(MSGS, rng=random.Random(0))
    assert c.error.startswith("connection: cannot reach")


def test_a_server_that_refuses_structured_output_gets_free_text(serve) -> None:
    srv = serve(lambda n, body: (400, b'{"error": "response_format unsupported"}', 0.0) if "response_format" in body
                else (200, json.dumps(OK).encode(), 0.0))
    b = client(srv.url)
    c = b.complete(MSGS, rng=random.Random(0), grammar=Schema())
    assert c.text == '{"BM": 64}' and not c.error and b.structured == "none" and b.stats["structured_fallback"] == 1
    b.complete(MSGS, rng=random.Random(0), grammar=Schema())
    assert srv.requests == 3 and "response_format" not in srv.bodies[2]  # not asked again


def test_concurrency_limit(serve) -> None:
    srv = serve(lambda n, body: (200, json.dumps(OK).encode(), 0.15))
    b = client(srv.url, concurrency=2)
    threads = [threading.Thread(target=b.complete, args=(MSGS,), kwargs={"rng": random.Random(i)}) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert srv.requests == 6 and srv.max_active == 2 and b.stats["ok"] == 6


# -- configuration ---------------------------------------------------------------------------------
def test_models_as_data(tmp_path: Path) -> None:
    tables = load_models()
    assert tables["smollm2-135m"].backend == "transformers" and tables["smollm2-135m"].device == "cpu"
    assert tables["smollm2-135m-http"].backend == "openai"
    extra = tmp_path / "models.toml"
    extra.write_text('[big]\nbackend = "openai"\nmodel = "qwen"\nbase_url = "http://127.0.0.1:9/v1"\n'
                     'temperature = [0.2, 0.6]\nprice = 4.0\n')
    big = resolve_model("big", [extra])
    assert (big.model, big.temperature, big.price) == ("qwen", (0.2, 0.6), 4.0)
    assert resolve_model("openai:qwen@http://h:1/v1").base_url == "http://h:1/v1"
    assert resolve_model("transformers:/m@cuda").device == "cuda"
    assert resolve_model("smollm2-135m", device="cuda").device == "cuda"
    assert resolve_model("big", [extra], device="cpu").device == "cpu"  # device concerns transformers only
    assert resolve_model("vllm:/models/x").backend == "vllm"
    extra.write_text('[bad]\nbackend = "openai"\nmodel = "x"\nbase_url = "http://h/v1"\ncolour = "red"\n')
    with pytest.raises(ValueError, match="unknown keys"):
        load_models(extra)
    with pytest.raises(ValueError, match="needs base_url"):
        ModelSpec(name="x", backend="openai")
    with pytest.raises(ValueError, match="openai:MODEL@URL"):
        resolve_model("openai:qwen")
    with pytest.raises(ValueError, match="does not exist"):
        load_models(tmp_path / "missing.toml")


def test_a_plug_in_backend_brings_its_own_spec_string() -> None:
    """Spec strings are read per backend (``SPEC_STRINGS``), not by a branch per built-in: a backend
    registered from outside (here a test double, never built) is reachable as ``NAME:REST``, with
    its own parser or, without one, REST as the model."""
    from operators.llm import LLM_BACKENDS, SPEC_STRINGS, spec_string

    LLM_BACKENDS.register("double-test", lambda spec: None)
    try:
        assert resolve_model("double-test:some/model").model == "some/model"

        @spec_string("double-test")
        def _parse(name: str, rest: str) -> ModelSpec:
            model, _, price = rest.partition("#")
            return ModelSpec(name=name, backend="double-test", model=model, price=float(price or 1))
        spec = resolve_model("double-test:m#3")
        assert (spec.backend, spec.model, spec.price) == ("double-test", "m", 3.0)
        assert resolve_model("nobody:m").backend == "transformers"  # not a backend: a transformers model name
    finally:
        if "double-test" in SPEC_STRINGS:
            SPEC_STRINGS.unregister("double-test")
        LLM_BACKENDS.unregister("double-test")


def test_vllm_backend_is_lazy_and_skips_without_vllm() -> None:
    import importlib.util
    import sys
    import operators.llm  # noqa: F401
    assert "vllm" not in sys.modules  # importing the package never imports vLLM
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed here (GPU machines only; the CPU build runs as a server in test_llm_http)")
    get_backend(resolve_model("vllm:" + "HuggingFaceTB/SmolLM2-135M-Instruct"))


# -- the bandit ------------------------------------------------------------------------------------
def test_bandit_prefers_improvements_per_token() -> None:
    rng = random.Random(0)
    b = ModelBandit(["cheap", "dear", "new"])
    b.spend("cheap", 20_000)
    b.reward("cheap", 10)
    b.spend("dear", 200_000)
    b.reward("dear", 10)
    b.spend("new", 0)
    picks = [b.choose(rng) for _ in range(2000)]
    assert picks.count("cheap") > picks.count("dear") * 5  # same improvements, a tenth of the tokens
    assert picks.count("new") > 20  # untried: the wide prior still gets it tried
    assert b.rate("cheap") > b.rate("dear")
    assert b.summary()["dear"] == {"calls": 1, "tokens": 200_000, "improvements": 10,
                                   "rate_per_1k_tokens": round(b.rate("dear"), 4)}
    assert ModelBandit(["only"]).choose(rng) == "only"
    with pytest.raises(ValueError):
        ModelBandit(["a", "a"])


def test_a_model_that_cannot_load_is_a_counted_failure_and_not_reloaded(tmp_path: Path) -> None:
    from operators import OperatorContext, ParentView, get_operator
    from populations import Shape, load_templates
    templates = load_templates()
    shape = Shape.parse("128x256x64")
    t = templates["sm80_mma"]
    parent = ParentView(t.candidate(t.heuristic(shape, arch=90)[0], shape))
    op = get_operator("llm", models=[f"transformers:{tmp_path / 'no-model-here'}"], max_attempts=2)
    start = time.monotonic()
    props = op.propose([parent], shape, random.Random(0), 2, OperatorContext([], templates, arch=90))
    assert [p.ok for p in props] == [False, False] and time.monotonic() - start < 60
    assert all(p.reason.startswith("no usable answer in 2 attempts; last: model transformers:") for p in props)
    # knob mode asks for both children in one call per attempt: two attempts, two (empty) calls
    assert op.bandit.summary()[op.models[0]]["calls"] == 2 and op.take_tokens() == 0
