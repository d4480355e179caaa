"""The dequantised-model cache (issue 25): the first load of the GGUF model saves a safetensors
copy, later processes load that copy in seconds and get the same model (same prompt ids, same
greedy answer); the copy is keyed by the GGUF file, so a changed file never reads a stale copy,
and an incomplete copy (no marker) is never trusted."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from operators.llm._model_cache import MARKER, cached_folder, model_cache_dir


def test_the_key_follows_the_gguf_file_and_off_disables(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    root = tmp_path / "cache"
    a = cached_folder(f, root)
    assert a is not None and a.parent == root and a.name.startswith("m-")
    assert cached_folder(f, root) == a
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000_000))
    assert cached_folder(f, root) != a  # same path and size, newer file: another copy
    f.write_bytes(b"x" * 11)
    assert cached_folder(f, root) != a
    monkeypatch.setenv("EVO_MODEL_CACHE", str(root))
    assert model_cache_dir() == root
    monkeypatch.setenv("EVO_MODEL_CACHE", "off")
    assert model_cache_dir() is None and cached_folder(f) is None


def test_a_cached_copy_loads_the_same_model(tmp_path: Path, monkeypatch) -> None:
    from operators import available_operators
    if "llm" not in available_operators():
        pytest.skip("the llm extra is not installed")
    from operators.llm import TransformersBackend

    monkeypatch.setenv("EVO_MODEL_CACHE", str(tmp_path))
    first = TransformersBackend()
    assert first.loaded_from == "gguf+saved"
    copies = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(copies) == 1 and (copies[0] / MARKER).is_file() and (copies[0] / "model.safetensors").is_file()
    second = TransformersBackend()
    assert second.loaded_from == "cache"
    assert second.load_s < first.load_s / 3  # the point of the copy (measured: 3 s against 21-25 s)
    msgs = [{"role": "system", "content": "You tune kernels."}, {"role": "user", "content": "Name one GPU."}]
    assert first.prompt_ids(msgs, "{") == second.prompt_ids(msgs, "{")
    a = first.complete(msgs, rng=random.Random(0), temperature=0.0, max_new_tokens=12)
    b = second.complete(msgs, rng=random.Random(0), temperature=0.0, max_new_tokens=12)
    assert a.text == b.text and a.completion_tokens == b.completion_tokens > 0

    (copies[0] / MARKER).unlink()  # as if the writer was killed before the marker
    third = TransformersBackend()
    assert third.loaded_from == "gguf+saved" and (copies[0] / MARKER).is_file()
