"""An OpenAI-compatible chat-completions client: ``vllm serve``, SGLang, hosted APIs.

Standard library only (``urllib``), so it runs wherever evo runs. Each call is one
``POST {base_url}/chat/completions`` with a per-request timeout, at most ``concurrency`` requests
at once (a semaphore shared by every thread of the process using this model), and retries with
exponential backoff and jitter after a timeout, a refused connection, HTTP 429/5xx or a reply
that is not a chat completion. Nothing raises for a bad server: every call returns a
:class:`Completion`, with ``error`` saying why there is no answer, and :attr:`OpenAIBackend.stats`
counts the outcomes (ok, timeout, connection, http_<code>, garbage, retries, structured_fallback)
and the tokens and seconds spent.

Knob edits: where the operator passes a grammar with ``json_schema()``, the request asks the
server to decode under that schema (``response_format`` json_schema by default, vLLM's older
``guided_json`` where configured). A server that refuses it (HTTP 400) is asked again without,
once, and then never again in this process: the free answer is parsed and validated instead.

Adapters (RL updates, issue 8): :meth:`OpenAIBackend.load_adapter` asks a vLLM server to load a
LoRA adapter folder at runtime (``POST {base_url}/load_lora_adapter``; the server must run with
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and see the folder's path), then
sends the adapter's name as the request's model; the previous adapter is unloaded
(``/unload_lora_adapter``). Completions record the base model's name and the adapter's.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from ._base import Choices, Completion, Gate, LLMBackend
from ._spec import ModelSpec

__all__ = ["OpenAIBackend"]

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class _Outcome(Exception):
    """One failed attempt: ``kind`` is the counted outcome, ``retry`` whether another try may help."""

    def __init__(self, kind: str, detail: str, retry: bool) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.retry = kind, detail, retry


class OpenAIBackend(LLMBackend):
    """Chat completions against one model of an OpenAI-compatible server (see the module docstring)."""

    def __init__(self, spec: ModelSpec) -> None:
        if spec.backend != "openai":
            raise ValueError(f"OpenAIBackend needs an openai model spec, got backend {spec.backend!r}")
        self.spec = spec
        self.name = spec.model
        self.url = spec.base_url.rstrip("/") + "/chat/completions"
        self.structured = spec.structured
        self.stats: Counter = Counter()
        self._slots = threading.BoundedSemaphore(spec.concurrency)
        self._lock = threading.Lock()
        self._jitter = random.Random()
        self.adapter = ""  # the adapter in use (its version name, sent as the model); "" for the base model

    def _count(self, **deltas: float) -> None:
        with self._lock:
            self.stats.update(deltas)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.spec.api_key_env, "") if self.spec.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _body(self, messages: list[dict[str, str]], temperature: float, max_new_tokens: int, seed: int,
              schema: Optional[dict]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.adapter or self.spec.model, "messages": messages, "temperature": temperature,
                                "max_tokens": max_new_tokens, "seed": seed, "n": 1, "stream": False}
        if schema is not None and self.structured == "json_schema":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "knob_edit", "schema": schema, "strict": True}}
        elif schema is not None and self.structured == "guided_json":
            body["guided_json"] = schema
        return body

    # -- adapters (RL updates, issue 8) -----------------------------------------------------
    def load_adapter(self, folder: Any, name: str, gate: Optional[Gate] = None) -> None:
        """Serve the peft LoRA adapter in ``folder`` as ``name`` from the next completion on (a
        hot reload through the server's runtime LoRA endpoints); ``folder=None`` goes back to the
        base model. The previous adapter is unloaded after the new one is in. Raises RuntimeError
        with the server's answer when it refuses (e.g. started without ``--enable-lora``). With
        ``gate`` (a server on the timing GPU) the load request is one slice: the server copies the
        weights to its GPU while no region is timed."""
        base = self.spec.base_url.rstrip("/")
        old = self.adapter
        if folder is not None:
            if not name:
                raise ValueError("an adapter needs a name (what requests send as the model)")
            if name != old:
                with gate.slice() if gate is not None else contextlib.nullcontext():
                    self._admin(base + "/load_lora_adapter", {"lora_name": name,
                                                              "lora_path": str(Path(folder).resolve())})
        with self._lock:
            self.adapter = name if folder is not None else ""
        if old and old != self.adapter:
            try:
                self._admin(base + "/unload_lora_adapter", {"lora_name": old})
            except RuntimeError:
                self._count(unload_failed=1)  # the new adapter is in use; a leftover one costs server memory only

    def _admin(self, url: str, body: dict[str, Any]) -> str:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.spec.timeout_s) as reply:
                return reply.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode("utf-8", "replace").strip().replace("\n", " ")[:400]
            raise RuntimeError(f"{url}: HTTP {exc.code}: {detail}") from None
        except (OSError, urllib.error.URLError) as exc:
            raise RuntimeError(f"{url}: {exc}") from None

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self._headers(),
                                         method="POST")
        try:
            with self._slots, urllib.request.urlopen(request, timeout=self.spec.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode("utf-8", "replace").strip().replace("\n", " ")[:300]
            raise _Outcome(f"http_{exc.code}", f"HTTP {exc.code}: {detail}", exc.code in _RETRY_STATUS) from None
        except (socket.timeout, TimeoutError) as exc:
            raise _Outcome("timeout", f"no reply within {self.spec.timeout_s:g} s", True) from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (socket.timeout, TimeoutError)):
                raise _Outcome("timeout", f"no reply within {self.spec.timeout_s:g} s", True) from None
            raise _Outcome("connection", f"cannot reach {self.url}: {exc.reason}", True) from None
        except (ConnectionError, OSError) as exc:  # reset mid-reply, broken pipe
            raise _Outcome("connection", f"connection to {self.url} failed: {exc}", True) from None
        try:
            doc = json.loads(raw)
            choice = doc["choices"][0]
            text = choice["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("content is not a string")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            shown = raw[:120].decode("utf-8", "replace")
            raise _Outcome("garbage", f"the reply is not a chat completion ({type(exc).__name__}): {shown!r}",
                           True) from None
        return doc

    def complete(self, messages: list[dict[str, str]], *, rng: random.Random, temperature: float = 0.7,
                 max_new_tokens: int = 256, prefix: str = "", grammar: Optional[Choices] = None,
                 cancel: Optional[threading.Event] = None, gate: Optional[Gate] = None) -> Completion:
        """One answer (``prefix`` is not sent: a server cannot be made to continue it; with a
        grammar that has ``json_schema()`` the server decodes under that schema where it can;
        ``cancel`` and ``gate`` are the caller's, around the whole request)."""
        start = time.perf_counter()
        seed = rng.getrandbits(31)
        schema = self.json_schema(grammar)
        error, attempts, fell_back = "", 0, False
        while True:
            attempts += 1
            body = self._body(messages, temperature, max_new_tokens, seed, schema)
            try:
                doc = self._post(body)
            except _Outcome as out:
                self._count(**{out.kind: 1})
                error = f"{out.kind}: {out.detail}"
                structured = "response_format" in body or "guided_json" in body
                if out.kind == "http_400" and structured and not fell_back:
                    fell_back = True  # the server cannot decode under a schema: ask for free text
                    with self._lock:
                        self.structured = "none"
                    self._count(structured_fallback=1)
                    continue
                if not out.retry or attempts > self.spec.retries:
                    break
                self._count(retries=1)
                time.sleep(self.spec.backoff_s * 2 ** (attempts - 1) * (0.5 + self._jitter.random()))
                continue
            usage = doc.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens") or 0)
            completion_tokens = int(usage.get("completion_tokens") or 0)
            seconds = time.perf_counter() - start
            self._count(ok=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, seconds=seconds)
            choice = doc["choices"][0]
            adapter = body["model"] if body["model"] != self.spec.model else ""
            return Completion(text=choice["message"]["content"], prompt_tokens=prompt_tokens,
                              completion_tokens=completion_tokens, seconds=seconds,
                              model=self.name if adapter else str(doc.get("model") or self.name),
                              temperature=temperature, finished=choice.get("finish_reason") != "length",
                              adapter=adapter)
        seconds = time.perf_counter() - start
        self._count(failed=1, seconds=seconds)
        return self.failure(f"{error} (after {attempts} attempt{'s' if attempts > 1 else ''})", seconds, temperature)
