"""JaxEngine: the RolloutEngine protocol over the sampler, with immediate weight updates."""

from __future__ import annotations

import os

import numpy as np
import pytest

from orchard.models import from_pretrained
from orchard.rollout.engine import RolloutEngine
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.sampler import SamplingParams

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models", "llama")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def test_engine_generates_like_hf_and_takes_new_weights():
    engine: RolloutEngine = JaxEngine.from_pretrained(FIXTURE, dtype="float32")
    expected = np.load(os.path.join(FIXTURE, "expected.npz"))
    prompt = expected["tokens"][0, :5].tolist()
    assert engine.generate([prompt], GREEDY)[0].token_ids == expected["greedy_5"].tolist()

    updated = from_pretrained(FIXTURE, dtype="float32")
    embed = updated.model.embed_tokens.weight
    embed[...] = embed[...] * -1.0  # a different policy, same architecture
    engine.update_weights(updated)
    after = engine.generate([prompt], GREEDY)[0].token_ids
    fresh = JaxEngine(updated).generate([prompt], GREEDY)[0].token_ids
    assert after == fresh and after != expected["greedy_5"].tolist()


def test_weights_of_another_architecture_are_refused():
    engine = JaxEngine.from_pretrained(FIXTURE, dtype="float32")
    other = from_pretrained(os.path.join(os.path.dirname(FIXTURE), "qwen3"), dtype="float32")
    with pytest.raises(ValueError, match="same architecture"):
        engine.update_weights(other)
