"""Training at long context computes what it did before: the chunked LM head (SFT loss, GRPO token logprobs),
per-layer rematerialisation and blockwise attention give the full computation's losses and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard.models.config import ModelConfig
from orchard.models.transformer import Transformer
from orchard.train.grpo import make_policy_loss
from orchard.train.state import batch_target_logprobs, chunked_target_logprobs, target_logprobs, token_losses

FULL = {"attention_block": 0, "remat": "none", "logits_chunk": 0}  # today's computation
EPS32 = float(np.finfo(np.float32).eps)


def _batch(rng: np.random.Generator, rows: int, length: int, vocab: int) -> dict[str, jax.Array]:
    segment_ids = np.sort(rng.integers(1, 4, (rows, length)), axis=1)
    starts = np.maximum.accumulate(np.where(np.diff(segment_ids, prepend=0, axis=1) != 0, np.arange(length), 0),
                                   axis=1)
    batch = {"tokens": rng.integers(0, vocab, (rows, length)), "targets": rng.integers(0, vocab, (rows, length)),
             "positions": np.arange(length)[None] - starts, "segment_ids": segment_ids,
             "loss_mask": rng.random((rows, length)) < 0.7,
             "old_logprobs": -rng.random((rows, length)) * 5, "advantages": rng.standard_normal((rows, length))}
    return {k: jnp.asarray(v, jnp.float32 if k in ("old_logprobs", "advantages") else None) for k, v in batch.items()}


def _model(tied: bool, **compute) -> Transformer:
    cfg = ModelConfig.tiny(vocab_size=97, dtype="float32", tie_word_embeddings=tied, **{**FULL, **compute})
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _loss_and_grads(loss_fn, model: Transformer, batch: dict) -> tuple[float, list[np.ndarray]]:
    graphdef, params = nnx.split(model, nnx.Param)
    (loss, count), grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(graphdef, p, batch), has_aux=True))(params)
    return float(loss / count), [np.asarray(g) for g in jax.tree.leaves(grads)]


def _assert_same(mine: tuple[float, list], reference: tuple[float, list], tokens: int) -> None:
    """The same loss and gradients, up to float32 sums taken in another order (blockwise attention's online
    softmax, the head's chunks, recomputed activations).

    Reordering a float32 sum of n terms is a random walk of n roundings of at most eps/2 of the partial
    sums: it moves the sum by about eps sqrt(n) of its terms' magnitude. A weight's gradient sums over the
    batch's tokens, so each gradient tensor may differ by 8 eps sqrt(tokens) (1.3e-5 for 200 tokens) of its
    largest element; the 8 covers the smaller sums along the way (the keys of a row, hidden units, two
    layers forward and back). Not relative to each element: one that cancels to near zero has no bounded
    relative error (1 of 6,208 was seen at 3.7e-4). A mask that lets a token see the next one or another
    segment, or a key block left out, moves some gradient by half its tensor's largest element or more
    (tried: 3e4 to 1e5 times this bound; the unchanged code stays under a tenth of it).
    The losses are means of per-token terms that hardly cancel (the policy loss's sum is half the sum of
    their sizes here), so they keep twice that bound relative to themselves."""
    tolerance = 8 * EPS32 * np.sqrt(tokens)
    np.testing.assert_allclose(mine[0], reference[0], rtol=2 * tolerance)
    for a, b in zip(mine[1], reference[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=tolerance * np.abs(b).max())


@pytest.mark.parametrize("length", [64, 70])
def test_chunked_target_logprobs_equal_the_full_logits(length):
    """Values and the gradients of the hidden states and the output weight; 70 leaves a padded last chunk."""
    rng = np.random.default_rng(length)
    hidden = jnp.asarray(rng.standard_normal((2, length, 16)), jnp.float32)
    weight = jnp.asarray(rng.standard_normal((16, 50)) * 0.3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 50, (2, length)))
    cotangent = jnp.asarray(rng.standard_normal((2, length)), jnp.float32)

    def chunked(h, w):
        return chunked_target_logprobs(h, w, targets, 16)

    def full(h, w):
        return target_logprobs(h @ w, targets)

    np.testing.assert_allclose(np.asarray(chunked(hidden, weight)), np.asarray(full(hidden, weight)), rtol=1e-5,
                               atol=1e-5)
    grads = [jax.grad(lambda h, w, f=f: jnp.sum(f(h, w) * cotangent), argnums=(0, 1))(hidden, weight)
             for f in (chunked, full)]
    for mine, reference in zip(*grads, strict=True):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(reference), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tied", [True, False])
def test_the_sft_and_grpo_losses_with_a_chunked_head_equal_the_full_logits(tied):
    batch = _batch(np.random.default_rng(1), 2, 100, 97)
    full, chunked = _model(tied), _model(tied, logits_chunk=32)
    np.testing.assert_allclose(np.asarray(batch_target_logprobs(chunked, batch)),
                               np.asarray(batch_target_logprobs(full, batch)), rtol=1e-5, atol=1e-5)
    for loss_fn in (token_losses, make_policy_loss()):
        _assert_same(_loss_and_grads(loss_fn, chunked, batch), _loss_and_grads(loss_fn, full, batch),
                     batch["tokens"].size)


def test_per_layer_remat_keeps_the_losses_and_gradients():
    batch = _batch(np.random.default_rng(2), 2, 48, 97)
    for loss_fn in (token_losses, make_policy_loss()):
        _assert_same(_loss_and_grads(loss_fn, _model(True, remat="layer"), batch),
                     _loss_and_grads(loss_fn, _model(True), batch), batch["tokens"].size)


def test_long_context_settings_together_keep_the_losses_and_gradients():
    """Blockwise attention (blocks of 32 over 100 tokens), remat and the chunked head against none of them."""
    batch = _batch(np.random.default_rng(3), 2, 100, 97)
    new = _model(False, attention_block=32, remat="layer", logits_chunk=40)
    for loss_fn in (token_losses, make_policy_loss()):
        _assert_same(_loss_and_grads(loss_fn, new, batch), _loss_and_grads(loss_fn, _model(False), batch),
                     batch["tokens"].size)


def test_an_unknown_remat_setting_is_an_error():
    with pytest.raises(ValueError, match="remat"):
        _model(True, remat="everything")(jnp.zeros((1, 4), jnp.int32))
