"""The export manifest and the RL adapter manifest are frozen records (issue 37): the JSON on
disk keeps its keys (a manifest written before reads back and writes the same bytes), an older,
smaller manifest still loads, and one that is not a manifest is a one-line error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from evo.rl import AdapterManifest, read_manifest
from evo.runtime import ExportError, ExportManifest, KernelEntry, PreparedB, load_library

#: An entry as ``evo export`` wrote it before the records (every key it wrote, with prepared_b
#: and verify); built by hand so the test does not depend on the writer it checks.
OLD_ENTRY = {
    "shape": "8x4096x4100:TN:f32", "key": "8x4096x4100_TN_f32", "m": 8, "n": 4096, "k": 4100, "layout": "TN",
    "contract": "f32", "symbol": "evo_hgemm_8x4096x4100_TN_f32", "candidate": "ab" * 10, "template": "sm90_wgmma",
    "knobs": {"BM": 64}, "operator": "knob", "generation": 3, "source_sha256": "0" * 64, "unit_sha256": "1" * 64,
    "fitness": 1.21, "measurements": 2, "speedups": {"device": 1.21}, "baselines": {"device": "torch.matmul NN"},
    "workspace_bytes": 4096, "zero_workspace": False, "tensor_maps": ["tmA", "tmB"], "arch": "sm_90a",
    "provenance": {"gpu": "NVIDIA H200", "checks": ["smoke"], "rotation_sets": 6}, "measured_at": 1.5,
    "why": "fastest", "verify": {"path": "evolved", "speedup": 1.2},
    "prepared_b": {"symbol": "evo_hgemm_8x4096x4100_TN_f32_wb", "rows": 4096, "cols": 4100, "pitch_multiple": 8,
                   "abi": "int f(...)"},
}
OLD_MANIFEST = {
    "format": "evo-export/1", "arch": "sm_90a", "library": "libevo_hgemm.so", "evo": "0.1.0", "archive": "/runs/a",
    "kernels": [OLD_ENTRY], "skipped": [{"shape": "64x64x64:TN:f32", "reason": "no ok candidate"}],
    "paths": {"8x4096x4100:TN:f32": {"path": "evolved", "why": "fastest"}}, "damage": [], "test_double": False,
    "verify": {"ran": False, "why": "not asked for"}, "fallback": "cuBLAS", "abi": "int evo_hgemm(...)",
}


def test_an_export_manifest_written_before_reads_back_to_the_same_bytes(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(OLD_MANIFEST, indent=1, sort_keys=True))
    m = ExportManifest.read(tmp_path)
    (entry,) = m.kernels
    assert isinstance(entry, KernelEntry) and entry.workspace_bytes == 4096 and entry.tensor_maps == ("tmA", "tmB")
    assert entry.prepared_b == PreparedB("evo_hgemm_8x4096x4100_TN_f32_wb", 4096, 4100, 8, "int f(...)")
    assert entry.measurement is None  # an old entry: its measurement keys still sit in its provenance
    before = (tmp_path / "manifest.json").read_bytes()
    m.write(tmp_path)
    assert (tmp_path / "manifest.json").read_bytes() == before
    assert ExportManifest.from_dict(m.to_dict()) == m


def test_new_keys_round_trip_and_unknown_ones_are_kept() -> None:
    entry = KernelEntry.from_dict({**OLD_ENTRY, "measurement": {"checks": ["smoke"]}, "later": 1})
    assert entry.measurement == {"checks": ["smoke"]} and entry.extra == {"later": 1}
    assert KernelEntry.from_dict(entry.to_dict()) == entry and entry.to_dict()["later"] == 1
    plain = KernelEntry.from_dict({k: v for k, v in OLD_ENTRY.items() if k not in ("prepared_b", "verify")})
    assert "prepared_b" not in plain.to_dict() and "verify" not in plain.to_dict()  # only when set, as before


def test_a_small_old_manifest_still_loads(tmp_path: Path) -> None:
    """The fields the loader needs are all an older manifest must have."""
    (tmp_path / "manifest.json").write_text(json.dumps({
        "format": "evo-export/1", "arch": "sm_90a", "library": "libevo_hgemm.so",
        "kernels": [{"m": 8, "n": 64, "k": 64, "layout": "TN", "symbol": "evo_hgemm_x", "workspace_bytes": 0}]}))
    lib = load_library(tmp_path)
    assert set(lib.kernels) == {(8, 64, 64, "TN")} and lib.kernels[(8, 64, 64, "TN")].symbol == "evo_hgemm_x"
    assert lib.manifest.skipped == () and not lib.active


@pytest.mark.parametrize("text,why", [
    ("{", "Expecting"), ("[]", "not an evo-export/1 manifest"), ('{"format": "evo-export/2"}', "not an evo-export/1"),
    ('{"format": "evo-export/1", "arch": "sm_90a"}', "has no 'kernels'"),
    ('{"format": "evo-export/1", "arch": "sm_90a", "kernels": {}}', "kernels is not a list"),
    ('{"format": "evo-export/1", "arch": "sm_90a", "kernels": [{"m": 1}]}', "has no 'n'"),
    ('{"format": "evo-export/1", "arch": "sm_90a", "kernels": [{"m": "8", "n": 1, "k": 1, "layout": "TN", '
     '"symbol": "s"}]}', "m is not an integer"),
    ('{"format": "evo-export/1", "arch": "sm_90a", "kernels": [{"m": 8, "n": 1, "k": 1, "layout": "TN", '
     '"symbol": "s", "prepared_b": 3}]}', "prepared_b is a int"),
])
def test_a_bad_export_manifest_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ExportError, match=why) as info:
        load_library(tmp_path)
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)
    with pytest.raises(ExportError, match="cannot read"):
        load_library(tmp_path / "absent")


#: evo-adapter.json as train_adapter wrote it before the record.
OLD_ADAPTER = {
    "format": "evo-adapter/1", "version": 2, "name": "v2-0123456789ab", "seed": 0, "base_model": "Qwen/x",
    "base_model_hash": "a" * 64, "adapter_hash": "0123456789ab" + "c" * 52, "parent_adapter": "v1-ffffffffffff",
    "config": {"grpo": {"steps": 2}, "lora": {"r": 16}}, "dataset": {"rows": 6, "groups": 1},
    "reward_sources": {"archive": 4}, "train_seconds": 1.25, "metrics": [{"step": 0, "reward_mean": 0.5}],
    "created": 1.0,
}


def test_an_adapter_manifest_written_before_reads_back_to_the_same_bytes(tmp_path: Path) -> None:
    text = json.dumps(OLD_ADAPTER, indent=2, sort_keys=True) + "\n"
    (tmp_path / "evo-adapter.json").write_text(text)
    m = read_manifest(tmp_path)
    assert m.version == 2 and m.name == "v2-0123456789ab" and m.metrics == ({"step": 0, "reward_mean": 0.5},)
    m.write(tmp_path)
    assert (tmp_path / "evo-adapter.json").read_text() == text
    assert AdapterManifest.from_dict(m.to_dict()) == m
    older = {k: v for k, v in OLD_ADAPTER.items() if k in ("version", "name", "adapter_hash")}  # fewer keys
    assert AdapterManifest.from_dict(older).parent_adapter is None


@pytest.mark.parametrize("text,why", [
    ("nope", "Expecting value"), ("[1]", "JSON object"), ('{"version": 1}', "no 'name'"),
    ('{"version": "1", "name": "v1-x"}', "version must be an integer"),
    ('{"version": 1, "name": "v1-x", "format": "evo-adapter/9"}', "is not evo-adapter/1"),
    ('{"version": 1, "name": "v1-x", "metrics": [3]}', "metrics must be a list of objects"),
])
def test_a_bad_adapter_manifest_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "evo-adapter.json").write_text(text)
    with pytest.raises(ValueError, match=why) as info:
        read_manifest(tmp_path)
    assert "\n" not in str(info.value) and "is not an evo adapter" in str(info.value)
