"""Causal attention by query blocks and blockwise (flash) attention, the training and scoring paths, give what
full masked attention gives, forward and backward."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchard.models import from_pretrained
from orchard.models.transformer import attend, attend_blockwise, attend_causal

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models")


def packed_mask(segment_ids: np.ndarray) -> np.ndarray:
    length = segment_ids.shape[1]
    causal = np.tril(np.ones((length, length), dtype=bool))[None]
    return causal & (segment_ids[:, :, None] == segment_ids[:, None, :])


def packed_rows(rng: np.random.Generator, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids of rows packed with a few sequences each, and positions that restart per sequence."""
    segment_ids = np.sort(rng.integers(1, 4, (rows, length)), axis=1)
    starts = np.maximum.accumulate(np.where(np.diff(segment_ids, prepend=0, axis=1) != 0, np.arange(length), 0),
                                   axis=1)
    return segment_ids, np.arange(length)[None] - starts


# 100: one block (below the block minimum); 300: blocks of 128 and a short last one; 1100: 7 blocks of 138 and one of 134.
@pytest.mark.parametrize("length", [100, 300, 1100])
def test_blockwise_causal_attention_equals_full_attention(length):
    rng = np.random.default_rng(length)
    q = jnp.asarray(rng.standard_normal((2, length, 2, 3, 8)), jnp.float32)  # grouped queries: 2 kv heads x 3
    k, v = (jnp.asarray(rng.standard_normal((2, length, 2, 8)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(packed_mask(packed_rows(rng, 2, length)[0]))
    np.testing.assert_allclose(np.asarray(attend_causal(q, k, v, mask)), np.asarray(attend(q, k, v, mask)),
                               rtol=1e-5, atol=1e-6)


# 256 in blocks of 64: 4 whole blocks; 200 in blocks of 64: a padded last block; 50 in blocks of 64: one padded block.
@pytest.mark.parametrize(("length", "block"), [(256, 64), (200, 64), (50, 64)])
def test_flash_attention_equals_full_attention_forward_and_backward(length, block):
    """Packed segments, grouped queries (2 kv heads x 3): outputs and the gradients of q, k and v."""
    rng = np.random.default_rng(length)
    q = jnp.asarray(rng.standard_normal((2, length, 2, 3, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((2, length, 2, 8)), jnp.float32) for _ in range(2))
    segment_ids = packed_rows(rng, 2, length)[0]
    mask, segment_ids = jnp.asarray(packed_mask(segment_ids)), jnp.asarray(segment_ids)
    cotangent = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def full(q, k, v):
        return attend(q, k, v, mask)

    def flash(q, k, v):
        return attend_blockwise(q, k, v, segment_ids, block)

    np.testing.assert_allclose(np.asarray(flash(q, k, v)), np.asarray(full(q, k, v)), rtol=1e-5, atol=1e-5)
    grads = [jax.grad(lambda *a, f=f: jnp.sum(f(*a) * cotangent), argnums=(0, 1, 2))(q, k, v) for f in (flash, full)]
    for mine, reference in zip(*grads, strict=True):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(reference), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("family", "attention_block"), [("llama", 0), ("qwen3", 0), ("llama", 128), ("qwen3", 96)])
def test_model_causal_pass_matches_the_general_pass_on_packed_rows(family, attention_block):
    """``model(tokens, positions, segment_ids)`` (query blocks over a dense mask, or blockwise with
    ``attention_block`` below the 400 tokens) against ``forward`` with the same mask given explicitly
    (full attention, which test_parity checks against transformers)."""
    model = from_pretrained(os.path.join(FIXTURES, family), dtype="float32", attention_block=attention_block)
    rng = np.random.default_rng(0)
    segment_ids, positions = packed_rows(rng, 2, 400)
    tokens = rng.integers(0, model.cfg.vocab_size, (2, 400))
    blockwise = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))
    full, _ = model.forward(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(packed_mask(segment_ids)))
    np.testing.assert_allclose(np.asarray(blockwise), np.asarray(full), rtol=1e-4, atol=1e-5)
