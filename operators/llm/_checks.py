"""Checking a model choice before any work starts: a model path that holds no model, a server
URL that does not parse or does not answer, a device that is not there. Each is a ValueError
with one line saying what is wrong, raised in seconds instead of after an archive was opened and
a pool started (or never: a run whose LLM operator cannot load just proposes nothing).

Hub ids (``org/name``) cannot be checked offline and are left to the loader.
"""
from __future__ import annotations

import functools
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from ._spec import ModelSpec

__all__ = ["check_spec", "check_device", "check_url", "probe_server"]

_DEVICE = re.compile(r"cpu|cuda(?::(\d+))?")
#: files that make a folder a model folder (transformers / vLLM), or a single-file model
_MODEL_FILES = ("config.json", "adapter_config.json")


def _local(model: str) -> bool:
    """The model names a path (not a hub id): absolute, relative with ./ ../ ~, or present on disk."""
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def check_device(text: str, visible: int) -> str:
    """``text`` as a device (cpu, cuda, cuda:N with N < ``visible`` GPUs); ValueError otherwise."""
    m = _DEVICE.fullmatch(text)
    if not m:
        raise ValueError(f"device {text!r}: write cpu, cuda or cuda:N")
    if text != "cpu" and visible == 0:
        raise ValueError(f"device {text!r}: no GPU is visible on this machine; use cpu")
    if m.group(1) is not None and int(m.group(1)) >= visible:
        raise ValueError(f"device {text!r}: only {visible} GPU(s) visible (cuda:0..cuda:{visible - 1})")
    return text


def check_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host; ValueError otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in url):
        raise ValueError(f"server URL {url!r} does not parse: write http://HOST:PORT/v1")
    try:
        parts.port  # a non-numeric port raises here
    except ValueError:
        raise ValueError(f"server URL {url!r}: the port is not a number") from None
    return url


@functools.lru_cache(maxsize=32)
def probe_server(url: str, timeout_s: float = 3.0) -> Optional[str]:
    """None when the OpenAI-compatible server at ``url`` answers ``GET url/models`` within
    ``timeout_s`` (any HTTP status counts: it is there), else why not, in a few words."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None  # it answered (401, 404, ...): the server is there
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"no answer within {timeout_s:g} s ({reason})"


def check_spec(spec: ModelSpec, *, probe_timeout_s: Optional[float] = 3.0, visible_gpus: Optional[int] = None) -> None:
    """ValueError when ``spec`` cannot work: a local model path missing or holding no model, a
    server URL that does not parse (or, with ``probe_timeout_s``, does not answer), a device
    that is not there (when ``visible_gpus`` is given)."""
    if spec.backend in ("transformers", "vllm") and _local(spec.model):
        path = Path(spec.model).expanduser()
        if not path.exists():
            raise ValueError(f"model {spec.name!r}: {spec.model} does not exist")
        if path.is_dir() and not any((path / f).is_file() for f in _MODEL_FILES):
            raise ValueError(f"model {spec.name!r}: {spec.model} holds no model ({' or '.join(_MODEL_FILES)} missing)")
        if path.is_file() and path.suffix != ".gguf":
            raise ValueError(f"model {spec.name!r}: {spec.model} is a file, not a model folder (or a .gguf file)")
    if spec.backend == "openai":
        check_url(spec.base_url)
        if probe_timeout_s:
            why = probe_server(spec.base_url, probe_timeout_s)
            if why:
                raise ValueError(f"model {spec.name!r}: the server {spec.base_url} gives {why}; start it, or fix the URL")
    if spec.backend == "transformers" and visible_gpus is not None:
        try:
            check_device(spec.device, visible_gpus)
        except ValueError as exc:
            raise ValueError(f"model {spec.name!r}: {exc}") from None
