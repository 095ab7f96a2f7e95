"""The in-process JAX sampler: batched prefill, then decode with a KV cache, all under ``jit``.

Prompts of different lengths share a batch by left padding: every prompt ends at slot ``P - 1`` of
the cache, so each decode step writes one slot for the whole batch, while positions (for RoPE) and
the attention mask skip each row's padding. The decode loop is a ``lax.while_loop`` inside one
compiled program, which stops as soon as every row has hit a stop token or ``max_tokens``; the
cache is created and updated in place inside that program and never leaves the device.

Sampling: greedy (``temperature == 0``), or temperature with optional top-k then top-p. The
logprob returned for each token is that of the model's own distribution (log-softmax of the raw
logits), as vLLM reports it by default and as RL importance ratios need.

Stop strings need a tokenizer, so engines apply them (:class:`~orchard.rollout.jax_engine.JaxEngine`).
Not here yet: a token budget shared across requests (continuous batching).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard.models.transformer import Transformer


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings: applied by engines that have a tokenizer
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"invalid sampling parameters: {self}")


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    text: str | None = None  # set by engines that have a tokenizer


def _top_k_top_p(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Mask logits outside the top-k, then outside the smallest prefix holding ``top_p`` of the mass."""
    ordered = jnp.sort(scaled, axis=-1)[:, ::-1]  # [B, V], descending
    rank = jnp.arange(scaled.shape[-1])
    ordered = jnp.where((top_k > 0) & (rank >= top_k), -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    kept = ((jnp.cumsum(probs, axis=-1) - probs) < top_p) & jnp.isfinite(ordered)
    threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def sample_logits(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token per row of ``logits [B, V]`` and its logprob under the raw distribution.

    The branches are ``lax.cond``s, so greedy decoding never pays for the vocabulary sort that
    top-k/top-p need.
    """

    def sample(_) -> jax.Array:
        scaled = logits / temperature
        scaled = jax.lax.cond((top_k > 0) | (top_p < 1), _top_k_top_p, lambda s, *_: s, scaled, top_k, top_p)
        return jax.random.categorical(key, scaled, axis=-1)

    token = jax.lax.cond(temperature == 0, lambda _: jnp.argmax(logits, axis=-1), sample, None)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    return token, jnp.take_along_axis(logprobs, token[:, None], axis=-1)[:, 0]


def _prefill_mask(pad: jax.Array, prompt_len: int, cache_len: int) -> jax.Array:
    slots = jnp.arange(cache_len)
    steps = jnp.arange(prompt_len)
    return (slots[None, None, :] <= steps[None, :, None]) & (slots[None, None, :] >= pad[:, None, None])


@functools.partial(jax.jit, static_argnames=("graphdef", "max_tokens"))
def _generate(graphdef, state, tokens, pad, key, temperature, top_k, top_p, stop_ids, *, max_tokens):
    model = nnx.merge(graphdef, state)
    batch, prompt_len = tokens.shape
    cache_len = prompt_len + max_tokens
    caches = model.init_cache(batch, cache_len)
    positions = jnp.maximum(jnp.arange(prompt_len)[None, :] - pad[:, None], 0)
    logits, caches = model.forward(tokens, positions, _prefill_mask(pad, prompt_len, cache_len), caches, 0)
    slots = jnp.arange(cache_len)

    def cond(carry):
        step, _, _, _, _, done, _ = carry
        return (step < max_tokens) & ~jnp.all(done)

    def body(carry):
        step, caches, last_logits, out_tokens, out_logprobs, done, lengths = carry
        token, logprob = sample_logits(last_logits, jax.random.fold_in(key, step), temperature, top_k, top_p)
        out_tokens = out_tokens.at[:, step].set(jnp.where(done, 0, token))
        out_logprobs = out_logprobs.at[:, step].set(jnp.where(done, 0.0, logprob))
        lengths = lengths + (~done).astype(jnp.int32)
        done = done | jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        slot = prompt_len + step
        mask = ((slots <= slot)[None, :] & (slots[None, :] >= pad[:, None]))[:, None, :]  # [B, 1, S]
        logits, caches = model.forward(token[:, None], (slot - pad)[:, None], mask, caches, slot)
        return step + 1, caches, logits[:, -1], out_tokens, out_logprobs, done, lengths

    carry = (jnp.int32(0), caches, logits[:, -1], jnp.zeros((batch, max_tokens), jnp.int32),
             jnp.zeros((batch, max_tokens), jnp.float32), jnp.zeros((batch,), bool), jnp.zeros((batch,), jnp.int32))
    _, _, _, out_tokens, out_logprobs, done, lengths = jax.lax.while_loop(cond, body, carry)
    return out_tokens, out_logprobs, lengths, done


class Sampler:
    """Generates continuations of token-id prompts with a :class:`~orchard.models.Transformer`."""

    def __init__(self, model: Transformer) -> None:
        self.graphdef, self.state = nnx.split(model)
        self.cfg = model.cfg

    def update(self, model: Transformer) -> None:
        """Take new weights (same architecture): the next call uses them, nothing recompiles."""
        self.graphdef, self.state = nnx.split(model)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if not prompts or any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        prompt_len = max(len(p) for p in prompts)
        if prompt_len + params.max_tokens > self.cfg.max_position_embeddings:
            raise ValueError(f"prompt ({prompt_len}) + max_tokens ({params.max_tokens}) exceeds the model's "
                             f"context of {self.cfg.max_position_embeddings}")
        tokens = np.zeros((len(prompts), prompt_len), np.int32)
        pad = np.zeros((len(prompts),), np.int32)
        for row, prompt in enumerate(prompts):
            pad[row] = prompt_len - len(prompt)
            tokens[row, pad[row]:] = prompt
        stop_ids = jnp.asarray(params.stop_token_ids or (-1,), jnp.int32)
        out_tokens, out_logprobs, lengths, done = jax.device_get(_generate(
            self.graphdef, self.state, jnp.asarray(tokens), jnp.asarray(pad),
            jax.random.key(params.seed), jnp.float32(params.temperature), jnp.int32(params.top_k),
            jnp.float32(params.top_p), stop_ids, max_tokens=params.max_tokens))
        return [Completion(token_ids=out_tokens[row, :n].tolist(), logprobs=out_logprobs[row, :n].tolist(),
                           finish_reason="stop" if done[row] else "length")
                for row, n in enumerate(lengths.tolist())]
