"""Causal attention by query blocks (the training and scoring path) gives what full masked attention gives."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

from orchard.models import from_pretrained
from orchard.models.transformer import attend, attend_causal

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


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_model_causal_pass_matches_the_general_pass_on_packed_rows(family):
    """``model(tokens, positions, segment_ids)`` (blockwise) against ``forward`` with the same mask
    given explicitly (full attention, which test_parity checks against transformers)."""
    model = from_pretrained(os.path.join(FIXTURES, family), dtype="float32")
    rng = np.random.default_rng(0)
    segment_ids, positions = packed_rows(rng, 2, 400)
    tokens = rng.integers(0, model.cfg.vocab_size, (2, 400))
    blockwise = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))
    full, _ = model.forward(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(packed_mask(segment_ids)))
    np.testing.assert_allclose(np.asarray(blockwise), np.asarray(full), rtol=1e-4, atol=1e-5)
