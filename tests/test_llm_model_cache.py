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


def test_the_key_follows_the_gguf_content_and_off_disables(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    root = tmp_path / "cache"
    a = cached_folder(f, root)
    assert a is not None and a.parent == root and a.name.startswith("m-")
    assert cached_folder(f, root) == a
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000_000))
    assert cached_folder(f, root) == a  # installed again (new mtime), same bytes: the same copy
    other = tmp_path / "venv2" / "m.gguf"  # the same wheel in another virtual environment
    other.parent.mkdir()
    other.write_bytes(b"x" * 10)
    assert cached_folder(other, root) == a
    f.write_bytes(b"y" * 10)
    assert cached_folder(f, root) != a  # same size, other bytes: another copy
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


def test_prune_keeps_the_newest_copies_of_the_model_and_nothing_else_goes(tmp_path: Path) -> None:
    """A CI run per fresh venv once left a 517 MB copy per run (the key held the path) until the
    shared disk filled; now saving a copy leaves at most KEEP of one model name."""
    import time

    from operators.llm._model_cache import KEEP, prune

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    root = tmp_path / "cache"
    now = time.time()
    olds = []
    for i in range(4):
        p = root / f"m-{i:016x}"
        p.mkdir(parents=True)
        os.utime(p, (now - 100 * (i + 1), now - 100 * (i + 1)))  # m-0 the newest
        olds.append(p)
    stale_tmp, fresh_tmp = root / ".m-dead.abc", root / ".m-live.def"
    stale_tmp.mkdir()
    fresh_tmp.mkdir()
    os.utime(stale_tmp, (now - 7200, now - 7200))
    other_model = root / "other-0000000000000000"
    other_model.mkdir()
    os.utime(other_model, (now - 9999, now - 9999))
    current = root / "m-ffffffffffffffff"
    current.mkdir()
    removed = prune(current, gguf)
    kept = sorted(p.name for p in root.iterdir())
    assert current.is_dir() and other_model.is_dir() and fresh_tmp.is_dir()  # never theirs to remove
    assert not stale_tmp.exists()  # a writer killed over an hour ago
    assert [p for p in olds if p.is_dir()] == olds[:KEEP - 1]  # the most recently used others
    assert set(removed) == set(olds[KEEP - 1:]) | {stale_tmp}, kept


def test_a_copy_that_cannot_be_written_costs_a_warning_not_the_load(tmp_path: Path) -> None:
    """safetensors raises its own SafetensorError on a full disk (not an OSError): the load must
    still return its model, as it did not when CI's disk filled."""
    from operators.llm._model_cache import _save

    class NotSaveable:  # test double for a transformers model whose save fails (not a tensor dict)
        config = None

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    copy = tmp_path / "cache" / "m-0"
    with pytest.warns(UserWarning, match="cannot write"):
        assert _save(None, NotSaveable(), copy, gguf, {"name": "m.gguf"}) is False
    assert not copy.exists() and [p.name for p in copy.parent.iterdir()] == []  # no half-written folder
