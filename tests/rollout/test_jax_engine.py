"""JaxEngine: the RolloutEngine protocol over the sampler, with immediate weight updates."""

from __future__ import annotations

import os

import numpy as np
import pytest

from orchard.models import from_pretrained
from orchard.models.weights import ModelWeights
from orchard.rollout.engine import RolloutEngine
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.types import SamplingParams

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
    assert engine.generate([prompt], GREEDY)[0].weight_version == 0
    engine.update_weights(ModelWeights.of(updated, version=7))  # parameters, not the model class
    [completion] = engine.generate([prompt], GREEDY)
    fresh = JaxEngine(updated).generate([prompt], GREEDY)[0].token_ids
    assert completion.token_ids == fresh and fresh != expected["greedy_5"].tolist()
    assert completion.weight_version == 7  # every completion says which weights sampled it


def test_weights_synced_from_a_learner_reuse_the_compiled_programs():
    """A learner's parameters lie on its mesh (and committed); before they were placed as the served ones,
    an RL run's first sync compiled prefill and decode again."""
    from orchard.models.sharding import make_mesh
    from orchard.rollout import sampler as sampler_module
    from orchard.train.state import OptimConfig, init_state, make_optimizer

    engine = JaxEngine.from_pretrained(FIXTURE, dtype="float32")
    prompt = np.load(os.path.join(FIXTURE, "expected.npz"))["tokens"][0, :5].tolist()
    sampled = SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    before = engine.generate([prompt], sampled)[0]
    compiled = sampler_module._decode._cache_size(), sampler_module._prefill._cache_size()
    optimizer, _ = make_optimizer(OptimConfig(), 4)
    graphdef, state = init_state(from_pretrained(FIXTURE, dtype="float32"), optimizer, make_mesh(1, 1))
    engine.update_weights(ModelWeights(graphdef, state.params, version=1))
    after = engine.generate([prompt], sampled)[0]
    assert (after.token_ids, after.weight_version) == (before.token_ids, 1)  # the same weights, now version 1
    assert (sampler_module._decode._cache_size(), sampler_module._prefill._cache_size()) == compiled


def test_weights_of_another_architecture_are_refused():
    engine = JaxEngine.from_pretrained(FIXTURE, dtype="float32")
    other = from_pretrained(os.path.join(os.path.dirname(FIXTURE), "qwen3"), dtype="float32")
    with pytest.raises(ValueError, match="same architecture"):
        engine.update_weights(ModelWeights.of(other))


def test_text_and_stop_strings_with_a_tokenizer(random_policy):
    """Detokenising and stop strings over SmolLM2's tokenizer, on a random policy sampled with a seed (its
    greedy text is one token repeated; sampling is keyed by step, so each call draws the same tokens)."""
    from orchard.data.chat import smollm2_format
    from orchard.data.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(random_policy)
    engine = JaxEngine.from_pretrained(random_policy, tokenizer=tokenizer, dtype="float32")
    prompt = smollm2_format(tokenizer).render([{"role": "user", "content": "Count: 1, 2, 3, 4, 5"}],
                                              add_generation_prompt=True).token_ids
    full = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=1.0, seed=1))[0]
    assert full.text == tokenizer.decode(full.token_ids, skip_special_tokens=True) and len(full.text) > 10
    stop = full.text[5:8]  # a stop string that starts inside the generated text
    cut = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=1.0, seed=1, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and len(cut.logprobs) == len(cut.token_ids)
    assert stop in tokenizer.decode(cut.token_ids) and stop not in tokenizer.decode(cut.token_ids[:-1])

    # Streamed token by token: the same tokens and text, and no text that is part of the stop string.
    deltas = list(engine.stream([prompt], SamplingParams(max_tokens=24, temperature=1.0, seed=1, stop=(stop,))))
    assert "".join(d.text for d in deltas) == cut.text
    assert [t for d in deltas for t in d.token_ids] == cut.token_ids
    assert deltas[-1].finish_reason == "stop" and len(deltas) < 24  # decoding stopped at the stop string
    assert not any(stop[:2] in d.text for d in deltas)
    with pytest.raises(ValueError, match="need a tokenizer"):
        JaxEngine.from_pretrained(FIXTURE).generate([[1]], SamplingParams(stop=("x",)))
