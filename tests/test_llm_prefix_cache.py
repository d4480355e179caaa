"""The transformers backend starts a prefill from the longest prefix it has cached (issue 35: "the
prompt's prefix cached across calls where it does not change"), with the real SmolLM2-135M: a
prompt that shares most of its tokens with a cached one computes only its own tail, and its
cache and logits are those a cold prefill gives; a short shared prefix is not worth a copy."""
from __future__ import annotations

import random

import pytest

from operators import available_operators

pytestmark = pytest.mark.skipif("llm" not in available_operators(), reason="the llm extra is not installed")

CONTEXT = ("You tune GEMM kernels. The parent uses BM 128, BN 256, BK 32, 4 stages, a direct epilogue, "
           "a group of 8 for the rasterisation and no split of K. Its speedup over cuBLAS is 0.92x at "
           "4096x4096x4096; the roofline floor is 174 us. ")


def _msgs(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": CONTEXT + question}]


@pytest.fixture()
def backend():
    from operators.llm import load_backend

    b = load_backend()
    b.clear_cache()
    yield b
    b.clear_cache()


def test_a_shared_prefix_is_reused_and_gives_the_cold_answer(backend) -> None:
    import torch

    from operators.llm._steps import MIN_REUSE

    first = backend.prompt_ids(_msgs("Propose a larger BK."))
    second = backend.prompt_ids(_msgs("Propose a deeper pipeline instead."))
    shared = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
    assert shared >= MIN_REUSE
    backend._prefill(first)
    computed, reused = backend.prefill_tokens, backend.prefill_reused_tokens
    past, logits = backend._prefill(second)
    assert backend.prefill_reused_tokens - reused == shared  # the shared part came from the cache ...
    assert backend.prefill_tokens - computed == len(second) - shared  # ... and only the tail was computed
    assert past.get_seq_length() == len(second)
    backend.clear_cache()
    cold_past, cold = backend._prefill(second)  # nothing cached: the whole prompt computed
    assert torch.allclose(logits, cold, atol=1e-4, rtol=1e-4)
    for layer in range(len(cold_past.layers)):
        assert torch.allclose(past.layers[layer].keys, cold_past.layers[layer].keys, atol=1e-4)
        assert torch.allclose(past.layers[layer].values, cold_past.layers[layer].values, atol=1e-4)
    # the answers, greedy, are the same with the prefix reused and without
    backend.clear_cache()
    backend._prefill(first)
    warm = backend.complete(_msgs("Propose a deeper pipeline instead."), rng=random.Random(0), temperature=0.0,
                            max_new_tokens=6)
    backend.clear_cache()
    cold_answer = backend.complete(_msgs("Propose a deeper pipeline instead."), rng=random.Random(0),
                                   temperature=0.0, max_new_tokens=6)
    assert warm.text == cold_answer.text


def test_a_prompt_inside_a_cached_one_and_a_short_shared_prefix(backend) -> None:
    import torch

    long_ids = backend.prompt_ids(_msgs("Propose a larger BK."))
    backend._prefill(long_ids)
    inner = long_ids[:-3]  # a strict prefix: the cut keeps all but its last token, which is computed
    computed = backend.prefill_tokens
    past, logits = backend._prefill(inner)
    assert backend.prefill_tokens - computed == 1 and past.get_seq_length() == len(inner)
    backend.clear_cache()
    assert torch.allclose(logits, backend._prefill(inner)[1], atol=1e-4, rtol=1e-4)
    other = backend.prompt_ids([{"role": "user", "content": "Hi."}])  # shares only the chat template's start
    computed, reused = backend.prefill_tokens, backend.prefill_reused_tokens
    backend._prefill(other)
    assert backend.prefill_reused_tokens == reused and backend.prefill_tokens - computed == len(other)
