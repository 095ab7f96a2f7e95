"""Decoding caches: the layers' keys and values, and how a pass writes its slots into them."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    k: jax.Array  # [B, S, K, Dh]
    v: jax.Array  # [B, S, K, Dh]


def write_slots(cache: jax.Array, update: jax.Array, index: jax.Array | int) -> jax.Array:
    """``update [B, T, K, Dh]`` written into ``cache [B, S, K, Dh]`` from slot ``index``: one slot for
    every row, or with ``index`` of shape ``[B]`` each row's own (continuous batching)."""
    update = update.astype(cache.dtype)
    if jnp.ndim(index) == 1:
        return jax.vmap(lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at, 0, 0)))(cache, update, index)
    return jax.lax.dynamic_update_slice(cache, update, (0, index, 0, 0))
