"""The GEMM shapes of a transformer, from its config (``evo shapes``).

A decoder layer runs, per token in flight (M), the projections q/k/v (or one fused qkv), o,
gate/up (or one fused gate_up, or a plain up projection) and down, and the model ends with
lm_head. Each is ``nn.Linear``-shaped: C (M x N) = A (M x K) · W^T with W stored N x K, the TN
layout of evo's shapes (GPT-2's ``Conv1D`` stores W as K x N: NN). This module derives N and K
from the hyper-parameters of a Hugging Face ``config.json`` (or of a transformers config class's
defaults, no hub): GQA through ``num_key_value_heads``, an explicit ``head_dim`` where the model
has one (Gemma-2: 8 heads x 256 != 2304), tied embeddings (lm_head is still a GEMM, over the
embedding matrix). How each ``model_type`` lays its projections out is data:
``evo/cli/model_families.toml``.

``fuse`` picks the view: ``native`` (the modules transformers builds, what ``evo.torch.patch``
can replace), ``all`` (qkv and gate_up fused, as serving engines run them) or ``none``.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from populations import Shape, ShapeError

__all__ = ["ShapesError", "Layer", "ModelShapes", "FUSE_MODES", "load_config", "model_layers", "rows",
           "to_csv", "to_toml", "DEFAULT_TOKENS"]

FUSE_MODES = ("native", "all", "none")
DEFAULT_TOKENS = (1, 8, 64, 512)
_FAMILIES = Path(__file__).with_name("model_families.toml")


class ShapesError(Exception):
    """A config that cannot be read or lacks a hyper-parameter: one line for the user."""


@dataclass(frozen=True)
class Layer:
    """One projection of the model: role (``q``, ``qkv``, ``gate_up``, ``lm_head``, ...), the
    transformers module name, N (output features), K (input features), the layout, and how many
    such modules the model has (one per decoder layer; lm_head once)."""

    role: str
    module: str
    n: int
    k: int
    layout: str
    count: int
    note: str = ""


@dataclass(frozen=True)
class ModelShapes:
    """A model's name (``_name_or_path``, the file's folder or the class name) and its projections."""

    model: str
    model_type: str
    layers: tuple[Layer, ...]


def _families() -> dict[str, Any]:
    with open(_FAMILIES, "rb") as f:
        return tomllib.load(f)


def _family(model_type: str) -> dict[str, Any]:
    data = _families()
    base = dict(data["default"])
    extra = data.get("families", {}).get(model_type, {})
    fam = {**base, **{k: v for k, v in extra.items() if k not in ("modules", "keys")}}
    fam["modules"] = {**base["modules"], **extra.get("modules", {})}
    fam["keys"] = {**base["keys"], **extra.get("keys", {})}
    return fam


def load_config(spec: Union[str, os.PathLike]) -> tuple[str, dict[str, Any]]:
    """(model name, config dict) from a ``config.json`` path, a folder holding one, or the name of
    a transformers config class (``LlamaConfig``: its defaults, nothing downloaded)."""
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.exists() and not path.is_dir():
        from populations import read_bounded

        try:
            cfg = json.loads(read_bounded(path, 16 << 20, "config").decode("utf-8"))  # a FIFO or device: refused
        except (OSError, ValueError) as exc:  # InputFileError, not UTF-8, not JSON
            raise ShapesError(f"{spec}: not a readable JSON config ({exc})") from None
        if not isinstance(cfg, dict):
            raise ShapesError(f"{spec}: a config must be a JSON object")
        name = str(cfg.get("_name_or_path") or path.parent.name or path.stem)
        return name.rsplit("/", 1)[-1], cfg
    text = str(spec)
    if text.isidentifier() and text.endswith("Config"):
        try:
            import transformers
        except ImportError:
            raise ShapesError(f"{spec}: naming a config class needs transformers installed") from None
        cls = getattr(transformers, text, None)
        if cls is None:
            raise ShapesError(f"{spec}: transformers has no such config class")
        return text, cls().to_dict()
    raise ShapesError(f"{spec}: no such file, and not a transformers config class name (e.g. LlamaConfig)")


def _int(cfg: Mapping[str, Any], key: str, what: str, default: Optional[int] = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ShapesError(f"config has no {key!r} ({what})")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ShapesError(f"config's {key!r} ({what}) must be a positive integer, got {value!r}")
    return value


def model_layers(name: str, cfg: Mapping[str, Any], fuse: str = "native") -> ModelShapes:
    """The projections of the model ``cfg`` describes, in the view ``fuse`` (see the module doc)."""
    if fuse not in FUSE_MODES:
        raise ShapesError(f"fuse must be one of {', '.join(FUSE_MODES)}, got {fuse!r}")
    if isinstance(cfg.get("text_config"), Mapping):  # multimodal wrappers: the language model's config
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    model_type = str(cfg.get("model_type") or "")
    fam = _family(model_type)
    keys, mods = fam["keys"], fam["modules"]
    hidden = _int(cfg, keys["hidden"], "hidden size")
    heads = _int(cfg, keys["heads"], "attention heads")
    kv_heads = _int(cfg, keys["kv_heads"], "key/value heads", heads)
    head_dim = _int(cfg, keys["head_dim"], "head dimension", hidden // heads)
    inter = _int(cfg, keys["intermediate"], "MLP width", 4 * hidden if fam["mlp"] == "plain" else None)
    layers = _int(cfg, keys["layers"], "decoder layers")
    vocab = _int(cfg, keys["vocab"], "vocabulary size")
    tie = cfg.get(keys["tie"], fam["tie_default"])
    layout = fam["layout"]
    q, kv = heads * head_dim, kv_heads * head_dim
    fused_attn = fuse == "all" or (fuse == "native" and fam["attention"] == "fused")
    out: list[Layer] = []
    if fused_attn:
        out.append(Layer("qkv", mods["qkv"], q + 2 * kv, hidden, layout, layers))
    else:
        out += [Layer("q", mods["q"], q, hidden, layout, layers), Layer("k", mods["k"], kv, hidden, layout, layers),
                Layer("v", mods["v"], kv, hidden, layout, layers)]
    out.append(Layer("o", mods["o"], hidden, q, layout, layers))
    if fam["mlp"] == "plain":
        out.append(Layer("up", mods["up"], inter, hidden, layout, layers, "no gate"))
    elif fuse == "all" or (fuse == "native" and fam["mlp"] == "gated_fused"):
        out.append(Layer("gate_up", mods["gate_up"], 2 * inter, hidden, layout, layers))
    else:
        out += [Layer("gate", mods["gate"], inter, hidden, layout, layers),
                Layer("up", mods["up"], inter, hidden, layout, layers)]
    out.append(Layer("down", mods["down"], hidden, inter, layout, layers))
    # lm_head is an nn.Linear in every transformers causal LM (GPT-2's too): always TN
    out.append(Layer("lm_head", mods["lm_head"], vocab, hidden, "TN", 1, "tied to the embeddings" if tie else ""))
    return ModelShapes(name, model_type, tuple(out))


@dataclass(frozen=True)
class Row:
    """One GEMM: the shape at ``m`` tokens in flight, and where in which model it comes from."""

    shape: Shape
    model: str
    layer: Layer


def rows(models: Iterable[ModelShapes], tokens: Sequence[int] = DEFAULT_TOKENS) -> list[Row]:
    """Every (model, layer, token count) as a shape, models and layers in order, tokens ascending."""
    if not tokens or any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in tokens):
        raise ShapesError(f"token counts must be positive integers, got {list(tokens)!r}")
    try:
        return [Row(Shape(m, layer.n, layer.k, layer.layout), ms.model, layer)
                for ms in models for layer in ms.layers for m in sorted(set(tokens))]
    except ShapeError as exc:  # a token count beyond a shape's limits: the input's fault, one line
        raise ShapesError(str(exc)) from None


CSV_FIELDS = ("M", "N", "K", "model", "layer", "layout", "module", "count", "note")


def to_csv(rs: Sequence[Row]) -> str:
    """CSV with the hand-derived file's columns first (M,N,K,model,layer), then layout, module,
    count (modules of that shape per model) and a note."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in rs:
        w.writerow((r.shape.m, r.shape.n, r.shape.k, r.model, r.layer.role, r.shape.layout, r.layer.module,
                    r.layer.count, r.layer.note))
    return buf.getvalue()


def to_toml(rs: Sequence[Row], archive: Optional[str] = None) -> str:
    """The ``shapes`` list ``evo run --config`` reads (each distinct shape once, commented with
    the layers it serves), and ``archive`` when given."""
    uses: dict[Shape, list[str]] = {}
    for r in rs:
        uses.setdefault(r.shape, []).append(f"{r.model} {r.layer.role}")
    lines = ["# written by evo shapes: the GEMMs of the models below, in nn.Linear's layout", ""]
    if archive is not None:
        lines.append(f"archive = {json.dumps(archive)}")
    lines.append("shapes = [")
    for shape, where in uses.items():
        lines.append(f"  {json.dumps(str(shape).removesuffix(':f32'))},  # {', '.join(dict.fromkeys(where))}")
    lines.append("]")
    return "\n".join(lines) + "\n"
