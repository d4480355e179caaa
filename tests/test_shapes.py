"""``evo shapes``: GEMM shapes from transformer configs.

Checked three ways: against the hand-derived ``../shared/shapes/llm_layers.csv`` (every row of it
is produced, except two errors of that file named below), against expectations written here for
Llama-3-8B, SmolLM2-135M and Gemma-2-2B (so the test can fail where the shared file is absent),
and against the ``nn.Linear`` / ``Conv1D`` modules transformers itself builds from the same
configs on the meta device (no weights, no hub).
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

from evo.cli._shapes import ShapesError, load_config, model_layers, rows, to_csv
from evo.cli import main
from populations import Shape

CONFIGS = Path(__file__).with_name("model_configs")
MODELS = ("gpt2", "smollm2-135m", "qwen2.5-0.5b", "gemma-2-2b", "phi-3-mini", "llama-3-8b")
ROOT = Path(__file__).resolve().parents[1]
SHARED_CANDIDATES = [Path(os.environ["EVO_SHARED"]) if os.environ.get("EVO_SHARED") else None,
                     ROOT.parent / "shared", ROOT.parent.parent / "shared"]

# Rows of the hand-derived file that the public configs contradict (transformers builds the
# modules of test_native_view_matches_transformers): Gemma-2-2B's o_proj reads 8 heads x 256 =
# 2048 features, not 2304; GPT-2's MLP has no gate (c_fc is 768 -> 3072, not a 6144 gate_up).
ERRATA = {("gemma-2-2b", "o"): (2304, 2304, 2304, 2048), ("gpt2", "gate_up"): (6144, 768, 3072, 768)}


def _models(fuse: str) -> list:
    return [model_layers(*load_config(CONFIGS / name), fuse=fuse) for name in MODELS]


def _shared_csv() -> Path:
    for base in SHARED_CANDIDATES:
        if base is not None and (base / "shapes" / "llm_layers.csv").is_file():
            return base / "shapes" / "llm_layers.csv"
    pytest.skip("../shared/shapes/llm_layers.csv is not here (it is not part of the repository)")


def test_every_hand_derived_row_is_produced() -> None:
    got = {(r.shape.m, r.shape.n, r.shape.k, r.model, r.layer.role) for r in rows(_models("all"), [1, 8, 64, 512, 4096])}
    missing, corrected = [], 0
    with open(_shared_csv()) as f:
        for rec in csv.DictReader(f):
            m, n, k, model, layer = int(rec["M"]), int(rec["N"]), int(rec["K"]), rec["model"], rec["layer"]
            if (model, layer) in ERRATA:
                n0, k0, n1, k1 = ERRATA[model, layer]
                assert (n, k) == (n0, k0), rec  # the erratum is still what the file says
                role = "up" if layer == "gate_up" and model == "gpt2" else layer
                assert (m, n1, k1, model, role) in got
                corrected += 1
            elif (m, n, k, model, layer) not in got:
                missing.append(rec)
    assert missing == [] and corrected == 10


# Written here from the public configs, so that this test fails in CI too: (role, N, K, layout, count).
EXPECTED = {
    "llama-3-8b": [("q", 4096, 4096, "TN", 32), ("k", 1024, 4096, "TN", 32), ("v", 1024, 4096, "TN", 32),
                   ("o", 4096, 4096, "TN", 32), ("gate", 14336, 4096, "TN", 32), ("up", 14336, 4096, "TN", 32),
                   ("down", 4096, 14336, "TN", 32), ("lm_head", 128256, 4096, "TN", 1)],
    "smollm2-135m": [("q", 576, 576, "TN", 30), ("k", 192, 576, "TN", 30), ("v", 192, 576, "TN", 30),
                     ("o", 576, 576, "TN", 30), ("gate", 1536, 576, "TN", 30), ("up", 1536, 576, "TN", 30),
                     ("down", 576, 1536, "TN", 30), ("lm_head", 49152, 576, "TN", 1)],
    "gemma-2-2b": [("q", 2048, 2304, "TN", 26), ("k", 1024, 2304, "TN", 26), ("v", 1024, 2304, "TN", 26),
                   ("o", 2304, 2048, "TN", 26), ("gate", 9216, 2304, "TN", 26), ("up", 9216, 2304, "TN", 26),
                   ("down", 2304, 9216, "TN", 26), ("lm_head", 256000, 2304, "TN", 1)],
    "gpt2": [("qkv", 2304, 768, "NN", 12), ("o", 768, 768, "NN", 12), ("up", 3072, 768, "NN", 12),
             ("down", 768, 3072, "NN", 12), ("lm_head", 50257, 768, "TN", 1)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_native_layers_written_here(name: str) -> None:
    ms = model_layers(*load_config(CONFIGS / name))
    assert ms.model == name
    assert [(l.role, l.n, l.k, l.layout, l.count) for l in ms.layers] == EXPECTED[name]


def test_fused_views() -> None:
    llama = {l.role: (l.n, l.k) for l in model_layers(*load_config(CONFIGS / "llama-3-8b"), fuse="all").layers}
    assert llama == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                     "lm_head": (128256, 4096)}
    phi = [l.role for l in model_layers(*load_config(CONFIGS / "phi-3-mini"), fuse="none").layers]
    assert phi == ["q", "k", "v", "o", "gate", "up", "down", "lm_head"]
    tied = {l.role: l.note for l in model_layers(*load_config(CONFIGS / "qwen2.5-0.5b")).layers}
    assert "tied" in tied["lm_head"]
    assert "tied" not in model_layers(*load_config(CONFIGS / "llama-3-8b")).layers[-1].note


@pytest.mark.parametrize("name", MODELS)
def test_native_view_matches_transformers(name: str) -> None:
    """The modules transformers builds from the same config (one decoder layer, meta device)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = json.loads((CONFIGS / name / "config.json").read_text())
    kind = data.pop("model_type")
    data.pop("_name_or_path")
    cfg = transformers.AutoConfig.for_model(kind, **data)
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(cfg, key):
            setattr(cfg, key, 1)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    built = set()
    for mod_name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            built.add((mod_name.rsplit(".", 1)[-1], mod.out_features, mod.in_features, "TN"))
        elif type(mod).__name__ == "Conv1D":  # weight K x N
            built.add((mod_name.rsplit(".", 1)[-1], mod.weight.shape[1], mod.weight.shape[0], "NN"))
    ours = {(l.module.rsplit(".", 1)[-1], l.n, l.k, l.layout) for l in model_layers(*load_config(CONFIGS / name)).layers}
    assert ours == built


def test_config_class_defaults_and_errors(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    name, cfg = load_config("LlamaConfig")
    assert name == "LlamaConfig"
    roles = {l.role: (l.n, l.k) for l in model_layers(name, cfg).layers}
    assert roles["gate"] == (11008, 4096) and roles["lm_head"] == (32000, 4096)
    with pytest.raises(ShapesError, match="no such config class"):
        load_config("NoSuchModelConfig")
    with pytest.raises(ShapesError, match="no such file"):
        load_config(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ShapesError, match="not a readable JSON"):
        load_config(tmp_path / "bad.json")
    with pytest.raises(ShapesError, match="'hidden_size'"):
        model_layers("x", {"model_type": "llama", "num_attention_heads": 2})
    with pytest.raises(ShapesError, match="positive integer"):
        model_layers("x", {"model_type": "llama", "hidden_size": "big"})
    with pytest.raises(ShapesError, match="token counts"):
        rows([model_layers(*load_config(CONFIGS / "gpt2"))], [0])


def test_cli_csv_toml_and_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shapes", str(CONFIGS / "smollm2-135m"), str(CONFIGS / "gpt2" / "config.json"), "--tokens", "1,8"]) == 0
    out = capsys.readouterr().out
    recs = list(csv.DictReader(out.splitlines()))
    assert len(recs) == 2 * (8 + 5) and recs[0]["M"] == "1" and recs[0]["layer"] == "q"
    assert out == to_csv(rows([model_layers(*load_config(CONFIGS / "smollm2-135m")),
                               model_layers(*load_config(CONFIGS / "gpt2"))], [1, 8]))
    toml_path = tmp_path / "run.toml"
    assert main(["shapes", str(CONFIGS / "llama-3-8b"), "--tokens", "1", "--format", "toml",
                 "--archive", "runs/llama", "--out", str(toml_path)]) == 0
    data = tomllib.loads(toml_path.read_text())
    shapes = [Shape.parse(s) for s in data["shapes"]]
    assert data["archive"] == "runs/llama" and len(shapes) == len(set(shapes)) == 5  # q and o share 1x4096x4096, k and v, gate and up too
    assert Shape(1, 1024, 4096) in shapes and Shape(1, 128256, 4096) in shapes
    from evo.search._config import load_config as load_run_config, merge

    run_cfg = merge(load_run_config(toml_path), {})  # what evo run --config makes of it
    assert list(run_cfg.shapes) == shapes and Path(run_cfg.archive) == tmp_path / "runs" / "llama"
    assert main(["shapes", str(CONFIGS / "gpt2"), "--json", "--tokens", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc[0]["shape"] == "1x2304x768:NN:f32" and doc[-1]["layer"] == "lm_head"
    for argv, what in ((["shapes", str(tmp_path / "nope.json")], "nope.json"),
                       (["shapes", str(CONFIGS / "gpt2"), "--tokens", "1,x"], "--tokens"),
                       (["shapes", str(CONFIGS / "gpt2"), "--tokens", "-4"], "--tokens"),
                       (["shapes", str(CONFIGS / "gpt2"), "--out", str(tmp_path / "no" / "dir" / "f.csv")], "f.csv")):
        assert main(argv) == 2
        err = capsys.readouterr()
        assert err.out == "" and err.err.startswith("evo shapes: error: ") and what in err.err
        assert len(err.err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["run.toml"]
