"""The JAX sampler against HF ``generate`` (golden files) and against the model's own forward pass.

The shipped SmolLM2's greedy tokens against HF ``generate`` are checked through ``orchard serve``
(tests/rollout/test_server.py), whose continuous batcher gives what this sampler gives alone
(tests/rollout/test_batching.py): its 30 layers are unrolled in every program, which takes seconds of CPU to
compile."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchard.models import from_pretrained
from orchard.models.sharding import make_mesh
from orchard.rollout.sampler import Sampler
from orchard.rollout.types import SamplingParams

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def load(family: str, **kwargs):
    return from_pretrained(os.path.join(FIXTURES, family), dtype="float32", **kwargs)


def golden(family: str):
    return np.load(os.path.join(FIXTURES, family, "expected.npz"))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe"])
def test_greedy_matches_hf_generate_with_mixed_prompt_lengths(family):
    expected = golden(family)
    prompt = expected["tokens"][0].tolist()
    completions = Sampler(load(family)).generate([prompt[:5], prompt[:9]], GREEDY)  # one batch, left-padded
    assert completions[0].token_ids == expected["greedy_5"].tolist()
    assert completions[1].token_ids == expected["greedy_9"].tolist()
    assert all(c.finish_reason == "length" for c in completions)


def test_logprobs_are_those_of_the_full_forward_pass():
    model = load("qwen3")
    prompt = golden("qwen3")["tokens"][0, :6].tolist()
    completion = Sampler(model).generate([prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=3,
                                                                  top_logprobs=4))[0]
    sequence = jnp.asarray([prompt + completion.token_ids])
    logprobs = jax.nn.log_softmax(model(sequence)[0], axis=-1)
    positions = np.arange(len(prompt) - 1, len(prompt) - 1 + len(completion.token_ids))
    expected = np.asarray(logprobs)[positions, completion.token_ids]
    np.testing.assert_allclose(completion.logprobs, expected, rtol=1e-4, atol=1e-4)
    assert len(completion.alternatives) == len(completion.token_ids)
    for position, step in zip(positions, completion.alternatives, strict=True):  # the 4 most likely, in order
        best = np.argsort(-np.asarray(logprobs)[position])[:4]
        assert [token for token, _ in step] == best.tolist()
        np.testing.assert_allclose([value for _, value in step], np.asarray(logprobs)[position, best], atol=1e-4)


def test_seeds_temperature_top_k_and_top_p():
    sampler = Sampler(load("llama"))
    prompt = [golden("llama")["tokens"][0, :4].tolist()] * 4
    hot = SamplingParams(max_tokens=10, temperature=2.0, seed=1)
    first, again = sampler.generate(prompt, hot), sampler.generate(prompt, hot)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]  # same seed, same tokens
    assert len({tuple(c.token_ids) for c in first}) > 1  # rows of one batch sample independently
    other = sampler.generate(prompt, SamplingParams(max_tokens=10, temperature=2.0, seed=2))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]
    greedy = sampler.generate(prompt[:1], SamplingParams(max_tokens=10, temperature=0.0))[0]
    for narrow in (SamplingParams(max_tokens=10, temperature=5.0, top_k=1, seed=4),
                   SamplingParams(max_tokens=10, temperature=5.0, top_p=1e-6, seed=5)):
        assert sampler.generate(prompt[:1], narrow)[0].token_ids == greedy.token_ids


def test_stop_tokens_and_max_tokens():
    expected = golden("llama")
    prompt = expected["tokens"][0, :5].tolist()
    greedy = expected["greedy_5"].tolist()
    stop = greedy[3]
    completion = Sampler(load("llama")).generate(
        [prompt], SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(stop,)))[0]
    assert completion.token_ids == greedy[: greedy.index(stop) + 1] and completion.finish_reason == "stop"
    assert len(completion.logprobs) == len(completion.token_ids)


def test_sharded_sampler_matches():
    expected = golden("qwen3_moe")
    prompt = expected["tokens"][0].tolist()
    sampler = Sampler(load("qwen3_moe", mesh=make_mesh(2, 2, 2)))
    assert sampler.generate([prompt[:9]], GREEDY)[0].token_ids == expected["greedy_9"].tolist()


def test_bad_requests_are_clear_errors():
    sampler = Sampler(load("llama"))
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        sampler.generate([[1, 2]], SamplingParams(max_tokens=1000))
    with pytest.raises(ValueError, match="invalid sampling"):
        SamplingParams(top_p=0)


def test_streaming_yields_the_same_tokens_step_by_step():
    sampler = Sampler(load("qwen3"))
    prompt = golden("qwen3")["tokens"][0].tolist()
    params = SamplingParams(max_tokens=7, temperature=1.0, seed=11)
    prompts = [prompt[:5], prompt[:9]]
    whole = sampler.generate(prompts, params)
    deltas = list(sampler.stream(prompts, params, chunk_tokens=1))
    for row, completion in enumerate(whole):
        mine = [d for d in deltas if d.row == row]
        assert all(len(d.token_ids) == 1 for d in mine)  # one token per step
        assert [t for d in mine for t in d.token_ids] == completion.token_ids
        assert [p for d in mine for p in d.logprobs] == pytest.approx(completion.logprobs, abs=1e-6)
        assert [d.finish_reason for d in mine] == [None] * (len(mine) - 1) + [completion.finish_reason]


def test_varied_lengths_reuse_compiled_programs():
    from orchard.rollout import sampler as sampler_module

    sampler = Sampler(load("llama"))
    prompt = golden("llama")["tokens"][0].tolist()
    sampler.generate([prompt[:3]], SamplingParams(max_tokens=5, temperature=0.0))
    compiled = sampler_module._decode._cache_size(), sampler_module._prefill._cache_size()
    for length, max_tokens in [(4, 6), (9, 3), (12, 8)]:  # all bucket to a 16-token prompt and 8 new tokens
        completion = sampler.generate([prompt[:length]], SamplingParams(max_tokens=max_tokens, temperature=0.0))[0]
        assert len(completion.token_ids) == max_tokens
    assert (sampler_module._decode._cache_size(), sampler_module._prefill._cache_size()) == compiled


def test_bucket_pads_less_than_a_quarter_with_four_sizes_per_octave():
    from orchard.rollout.sampler import bucket

    assert [bucket(n) for n in (1, 16, 17, 96, 100, 513, 760, 900, 1025)] == [16, 16, 20, 96, 112, 640, 768, 1024, 1280]
    sizes = {bucket(n) for n in range(513, 1025)}
    assert sizes == {640, 768, 896, 1024}
    assert all(n <= bucket(n) < 1.25 * n + 1 for n in range(17, 5000))


def test_a_vision_language_model_samples_with_its_images_as_hf_generate_does():
    """Qwen3-VL through the engine: the image's pixels are processed with the model's own
    preprocessor settings and prefilled with the text; decoding continues from the prompt's rotary
    delta. The one-image prompt, left-padded in a batch beside a longer two-image prompt, still
    decodes as HF ``generate`` does alone."""
    from orchard.rollout.jax_engine import JaxEngine

    expected = golden("qwen3_vl")
    engine = JaxEngine(load("qwen3_vl"))
    one, two = expected["tokens_one"][0].tolist(), expected["tokens_two"][0].tolist()
    images = [[expected["image_0"]], [expected["image_0"], expected["image_1"]]]
    completions = engine.generate([one, two], GREEDY, images=images)
    assert completions[0].token_ids == expected["greedy_one"].tolist()
    [alone] = engine.generate([one], GREEDY, images=images[:1])
    assert alone.token_ids == expected["greedy_one"].tolist()
    with pytest.raises(ValueError, match="more image tokens"):  # its 6 placeholders are for image 0, not 1
        engine.generate([one], GREEDY, images=[[expected["image_1"]]])


def test_images_for_a_text_model_are_a_clear_error():
    with pytest.raises(ValueError, match="not a vision-language model"):
        Sampler(load("qwen3")).generate([[1, 2, 3]], GREEDY, images=[[np.zeros((8, 8, 3), np.uint8)]])


def test_a_batching_engine_decodes_prompts_with_images_in_a_batch_of_their_own():
    """The batcher's rows carry no image features: a prompt with images goes to the sampler, and gets
    HF's tokens, while text prompts still share the batcher's decode steps."""
    from orchard.rollout.jax_engine import JaxEngine

    expected = golden("qwen3_vl")
    engine = JaxEngine(load("qwen3_vl"), max_batch_rows=2)
    try:
        [with_image] = engine.generate([expected["tokens_one"][0].tolist()], GREEDY, images=[[expected["image_0"]]])
        assert with_image.token_ids == expected["greedy_one"].tolist()
        admitted = engine.batcher.stats["admitted"]
        engine.generate([[1, 2, 3]], GREEDY)
        assert engine.batcher.stats["admitted"] == admitted + 1
    finally:
        engine.close()
