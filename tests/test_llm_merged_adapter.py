"""The transformers backend serves a LoRA adapter merged into a copy of the base (issue 35: an
unmerged adapter made every decoding step 2-2.8x slower). With the real SmolLM2-135M and real
peft adapters (random LoRA weights, saved as ``evo rl`` saves them): the served model answers as
the adapter does, has no LoRA layers left, the base stays bit-identical over switches, and RL
trains from that pristine base."""
from __future__ import annotations

import copy
import importlib.util
import random
from pathlib import Path

import pytest

from operators import available_operators

try:
    import peft  # noqa: F401
    PEFT = True
except ImportError:
    PEFT = False

pytestmark = [pytest.mark.skipif("llm" not in available_operators(), reason="the llm extra is not installed"),
              pytest.mark.skipif(not PEFT, reason="peft is not installed (the rl and dev extras have it)")]

MSGS = [{"role": "user", "content": "Name one prime number."}]
ROOT = Path(__file__).resolve().parents[1]


def _adapter(base, folder: Path, seed: int) -> Path:
    """A real LoRA adapter with the RL trainer's settings and random non-zero weights (the
    benchmark's maker: ``bench/lora_merge_bench.py``)."""
    spec = importlib.util.spec_from_file_location("lora_merge_bench", ROOT / "bench" / "lora_merge_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.random_adapter(base, folder, seed)


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


@pytest.fixture(scope="module")
def backend():
    from operators.llm import load_backend

    b = load_backend()
    b.load_adapter(None, "")
    yield b
    b.load_adapter(None, "")  # the session's shared backend goes back to the base model


def test_a_merged_adapter_answers_as_the_adapter_does_with_no_lora_layers(backend, tmp_path: Path) -> None:
    import torch
    from peft import PeftModel

    base = backend.model
    pristine = {n: p.detach().clone() for n, p in base.state_dict().items()}
    ids = backend.prompt_ids(MSGS)
    base_logits = _logits(base, ids)
    folder = _adapter(base, tmp_path / "a1", seed=1)
    unmerged = PeftModel.from_pretrained(copy.deepcopy(base), str(folder)).eval()  # the reference: LoRA products apart
    want = _logits(unmerged, ids)

    backend.load_adapter(folder, "a1")
    assert backend.adapter == "a1" and backend.base_model is base and backend.model is not base
    assert not isinstance(backend.model, PeftModel)
    assert not any("lora_" in n for n, _ in backend.model.named_parameters())
    got = _logits(backend.model, ids)
    assert float((want - base_logits).abs().max()) > 1e-2  # the adapter changes the answer ...
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4)  # ... and the merged copy gives the adapter's
    c = backend.complete(MSGS, rng=random.Random(0), temperature=0.0, max_new_tokens=4)
    assert c.adapter == "a1" and not c.error

    backend.load_adapter(None, "")
    assert backend.model is base and backend.base_model is base and backend.adapter == ""
    assert all(torch.equal(p, pristine[n]) for n, p in base.state_dict().items())
    assert torch.equal(_logits(backend.model, ids), base_logits)


def test_switching_adapters_never_drifts_the_base_and_rl_trains_from_it(backend, tmp_path: Path) -> None:
    import torch

    from evo.rl._policy import Policy, model_hash

    base = backend.model
    pristine_hash = model_hash(base)
    ids = backend.prompt_ids(MSGS)
    first = _adapter(base, tmp_path / "v1", seed=2)
    second = _adapter(base, tmp_path / "v2", seed=3)
    try:
        backend.load_adapter(first, "v1")
        one = _logits(backend.model, ids)
        backend.load_adapter(second, "v2")  # merged into the pristine base, not on top of v1
        backend.load_adapter(first, "v1")
        assert torch.allclose(_logits(backend.model, ids), one, atol=1e-5)
        assert model_hash(backend.base_model) == pristine_hash
        policy = Policy(backend, seed=0)  # training starts from the base, not from the served merge
        assert policy.base_hash == pristine_hash
        assert any("lora_" in n for n, _ in policy.model.named_parameters())
    finally:
        backend.load_adapter(None, "")
    assert model_hash(backend.model) == pristine_hash
