"""The copy head (orchard/models/copy_head.py): one distribution however it is computed, and a pointer that copies.

Every path a policy's tokens go through must give the same log-probabilities: the full pass (the probe, a
prefill), the training loss's targets-only path, a decode step over the cache (one write index for the batch,
or each row's own, as the continuous batcher writes), a left-padded prompt, a packed row, and a checkpoint
written and read back. The last test trains: with the head, a model learns to copy tokens that training never
had it write, where only copying predicts them; without it, the same model in the same steps does not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from orchard.models import ModelConfig, Transformer
from orchard.models.weights import from_pretrained, save_pretrained
from orchard.rollout.batching import ContinuousBatcher
from orchard.rollout.sampler import Sampler, collect
from orchard.rollout.types import SamplingParams
from orchard.train.state import batch_target_logprobs

VOCAB, LENGTH = 97, 24


def copy_model(seed: int = 0, copy_head: int = 16, sharpen: bool = True) -> Transformer:
    model = Transformer(ModelConfig.tiny(VOCAB, copy_head=copy_head, dtype="float32"), rngs=nnx.Rngs(seed))
    if copy_head and sharpen:  # a gate away from one half and a sharper pointer than at initialisation, so both shares show
        model.copy_head.gate.bias[...] = jnp.full((1,), 0.7)
        model.copy_head.query.kernel[...] *= 30.0
        model.copy_head.match.weight[...] = jnp.asarray([2.0, 3.0, 1.0])
    return model


@pytest.fixture(scope="module")
def model() -> Transformer:
    return copy_model()


@pytest.fixture(scope="module")
def tokens() -> jax.Array:
    # a dozen distinct tokens, so that tokens and pairs of them recur and the pointer's matches count
    return jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, LENGTH)), jnp.int32)


def _positions(batch: int, length: int) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(length), (batch, length))


def _batch(tokens: jax.Array, segment_ids: jax.Array | None = None) -> dict[str, jax.Array]:
    return {"tokens": tokens, "positions": _positions(*tokens.shape), "targets": jnp.roll(tokens, -1, axis=1),
            "segment_ids": jnp.zeros_like(tokens) if segment_ids is None else segment_ids}


def test_the_mixed_distribution_is_normalised_and_the_pointer_moves_it(model, tokens):
    logits = model(tokens)
    np.testing.assert_allclose(jax.nn.logsumexp(logits, axis=-1), 0.0, atol=1e-5)
    without = nnx.merge(*nnx.split(copy_model(copy_head=0)))
    assert float(jnp.max(jnp.abs(logits - jax.nn.log_softmax(without(tokens), axis=-1)))) > 0.1
    # a token in the context gets the pointer's share: more probable than one the context never held
    context = set(np.asarray(tokens[0]).tolist())
    absent = [token for token in range(VOCAB) if token not in context]
    last = np.asarray(logits[0, -1])
    assert last[list(context)].min() > last[absent].max() - 1.0


def test_the_training_loss_reads_the_targets_of_the_full_distribution(model, tokens):
    batch = _batch(tokens)
    expected = jnp.take_along_axis(model(tokens), batch["targets"][..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(batch_target_logprobs(model, batch), expected, atol=1e-5)


def test_packed_segments_neither_point_nor_look_across_their_boundary(model, tokens):
    first, second = tokens[:1, :10], tokens[1:, :14]
    packed = jnp.concatenate([first, second], axis=1)
    segment_ids = jnp.asarray([[0] * 10 + [1] * 14])
    batch = _batch(packed, segment_ids)
    batch["positions"] = jnp.asarray([list(range(10)) + list(range(14))])
    batch["targets"] = jnp.concatenate([jnp.roll(first, -1, 1), jnp.roll(second, -1, 1)], axis=1)
    logprobs = nnx.jit(batch_target_logprobs)
    np.testing.assert_allclose(logprobs(model, batch)[:, 10:], logprobs(model, _batch(second)), atol=1e-5)


@pytest.mark.parametrize("per_row_index", [False, True])
def test_decoding_over_the_cache_gives_the_full_pass(model, tokens, per_row_index):
    full, prompt = model(tokens), 10
    caches = model.init_cache(2, LENGTH)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((prompt, LENGTH), bool)), (2, prompt, LENGTH))
    logits, caches = model.forward(tokens[:, :prompt], _positions(2, LENGTH)[:, :prompt], mask, caches, 0,
                                   causal=True)
    np.testing.assert_allclose(logits, full[:, :prompt], atol=1e-5)
    step = nnx.jit(lambda model, *args: model.forward(*args))  # the write index traced: one compiled step
    for slot in range(prompt, LENGTH):
        index = jnp.full((2,), slot) if per_row_index else jnp.int32(slot)
        mask = jnp.broadcast_to(jnp.arange(LENGTH) <= slot, (2, 1, LENGTH))
        logits, caches = step(model, tokens[:, slot:slot + 1], jnp.full((2, 1), slot), mask, caches, index)
        np.testing.assert_allclose(logits[:, 0], full[:, slot], atol=1e-5)


def _full_pass_logprobs(model: Transformer, prompt: list[int], completion) -> np.ndarray:
    """The model's own full-pass log-probabilities of a completion's tokens after its prompt."""
    logprobs = np.asarray(model(jnp.asarray([prompt + completion.token_ids]))[0])
    positions = np.arange(len(prompt) - 1, len(prompt) + len(completion.token_ids) - 1)
    return logprobs[positions, completion.token_ids]


def test_the_sampler_left_pads_and_reports_the_full_pass_logprobs(model, tokens):
    prompts = [tokens[0, :5].tolist(), tokens[1, :11].tolist()]  # one batch: the first row is left-padded
    completions = Sampler(model).generate(prompts, SamplingParams(max_tokens=6, temperature=1.0, seed=1))
    for prompt, completion in zip(prompts, completions, strict=True):
        np.testing.assert_allclose(completion.logprobs, _full_pass_logprobs(model, prompt, completion), atol=1e-4)


def test_the_continuous_batcher_reports_the_full_pass_logprobs(model, tokens):
    requests = [tokens[0, :5].tolist(), tokens[1, :13].tolist(), tokens[0, 3:12].tolist()]  # one prompt bucket
    batcher = ContinuousBatcher(Sampler(model), max_rows=4, chunk_steps=2)
    try:  # all at once: rows of the batch at different slots, written at each row's own index
        streams = [batcher.stream([prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=2))
                   for prompt in requests]
        completions = [collect(stream, 1)[0] for stream in streams]
    finally:
        batcher.close()
    for prompt, completion in zip(requests, completions, strict=True):
        assert len(completion.token_ids) == 6
        np.testing.assert_allclose(completion.logprobs, _full_pass_logprobs(model, prompt, completion), atol=1e-4)


def test_a_checkpoint_keeps_the_head(model, tokens, tmp_path):
    save_pretrained(model, str(tmp_path))
    loaded = from_pretrained(str(tmp_path), dtype="float32")
    assert loaded.cfg.copy_head == 16 and loaded.copy_head is not None
    np.testing.assert_allclose(loaded(tokens), model(tokens), atol=1e-6)


def _copy_accuracy(copy_head: int, steps: int = 100) -> float:
    """Train on rows ``[context..., SEP, span, SEP, span]``, the loss on the second copy of the span; score the
    greedy second copy of spans drawn from tokens that training rows hold only in their context, never in a
    span: tokens the model was never trained to write there, as a new name's pieces are to a policy."""
    rng = np.random.default_rng(0)
    separator, held_out = 1, np.arange(40, 60)
    trained = np.setdiff1d(np.arange(2, VOCAB), held_out)

    def rows(count: int, pool: np.ndarray) -> np.ndarray:
        out = []
        for _ in range(count):
            span = rng.choice(pool, 6, replace=False)
            out.append(np.concatenate([rng.choice(np.arange(2, VOCAB), 10), [separator], span, [separator], span]))
        return np.asarray(out, np.int32)

    model = copy_model(copy_head=copy_head, sharpen=False)
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = optax.adam(3e-3)
    opt_state = optimizer.init(params)
    mask = np.zeros(rows(1, trained).shape, np.float32)
    mask[:, -7:-1] = 1.0  # the positions that predict the second copy's tokens

    @jax.jit
    def step(params, opt_state, tokens):
        def loss(params):
            logprobs = batch_target_logprobs(nnx.merge(graphdef, params), _batch(tokens))
            return -jnp.sum(logprobs * mask) / jnp.sum(mask * len(tokens))
        grads = jax.grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    for _ in range(steps):
        params, opt_state = step(params, opt_state, jnp.asarray(rows(16, trained)))
    test = jnp.asarray(rows(64, held_out))
    predicted = jnp.argmax(nnx.merge(graphdef, params)(test), axis=-1)
    return float(jnp.mean(predicted[:, -7:-1] == test[:, -6:]))


def test_the_head_copies_tokens_it_was_never_trained_to_write():
    with_head, without = _copy_accuracy(16), _copy_accuracy(0)
    assert with_head > 0.9, with_head
    assert without < 0.5, without
