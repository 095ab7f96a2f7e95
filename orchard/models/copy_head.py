"""A copy head: a pointer over the context mixed into the vocabulary distribution.

A small policy trained from scratch on a few hundred agent runs writes the names it has seen most,
not the ones it has just read: on the SWE skills split the tiny transformer wrote ``test_span_span``
for ``test_hesnoks`` (issue 45's copy probe: 0.13-0.17 of a new name's pieces right). An agent copies
at every step (a test id from the task into ``pytest``, a function from a traceback into ``grep``, a
path and a line number into an edit), so a policy that cannot copy a name it has never seen resolves
nothing held out, whatever it learned about fixing bugs.

This head is the pointer-generator's answer (See, Liu and Manning, 2017, "Get To The Point"), in a
decoder-only model. At each position ``t`` it attends over the context's positions ``j <= t`` and
proposes the token at ``j`` as the next one; a gate ``g_t`` mixes the two distributions:

    p(w) = g_t softmax(vocabulary logits)(w) + (1 - g_t) sum_j a_tj [x_j = w]

Where it points is an induction head built in rather than learned (Olsson et al., 2022, "In-context
learning and induction heads"): the score of position ``j`` for the query at ``t`` is a learned content
score (the query's hidden state against a key made of ``j``'s hidden state and the embedding of the
token before ``j``, the "smeared key") plus learned weights on three exact matches: the token before
``j`` is ``x_t``, the two before it are ``x_{t-1} x_t``, the three ``x_{t-2} x_{t-1} x_t``. So the head
finds the earlier place where the current token (and the ones before it) occurred and proposes what
followed, for tokens it was never trained to write (three tokens tell line 16 from lines 6 and 26 when
digits are tokens of their own); a two-layer model trained from scratch otherwise has to assemble that circuit
from a previous-token head and a matching head, and on a few hundred agent runs it did not. This is
prompt-lookup decoding's match, learned and weighed against the model's own prediction by the gate.

Departures and consequences:
* The model returns ``log p(w)`` as its logits (a log-softmax of them is themselves), so samplers, the
  server and every loss read it as any model's logits; the training loss asks only for the targets'
  probabilities (:meth:`CopyHead.target_logprobs`), which never builds a ``[B, T, V]`` copy distribution.
* Decoding keeps the head's keys and each slot's token and the three before it in one more cache after
  the layers' (:meth:`CopyHead.init_cache`: a :class:`~orchard.models.cache.KVCache` whose ``v`` holds
  the ids as float32, exact below 2**24; -1: none), so the batching and the sampler move it as they move
  the others.
* It is Orchard's own architecture: ``config.json`` names it (``orchard_copy_head``), and transformers
  or vLLM cannot load such a checkpoint; ``orchard serve`` can.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orchard.models.cache import write_slots
from orchard.models.config import ModelConfig
from orchard.models.params import Linear

CONTEXT = 4  # a position's token and the three before it
MATCHES = CONTEXT - 1  # exact matches of the last one, two and three tokens
MATCH_INIT = 6.0  # the match weights at initialisation: the pointer starts as an induction head


class Pointer(NamedTuple):
    """Where a pass's queries point: ``log_weights [B, T, S]`` over the key positions, and the token at each
    ``[B, S]``."""

    log_weights: jax.Array
    key_ids: jax.Array


def _safe_log(p: jax.Array) -> jax.Array:
    """``log p`` with ``-inf`` (and a zero gradient, not NaN) where ``p`` is 0."""
    positive = p > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, p, 1.0)), -jnp.inf)


class MatchWeights(nnx.Module):
    """The pointer's learned weights on its exact matches (``copy_head.match.weight`` in a checkpoint)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.weight = nnx.Param(jnp.full((MATCHES,), MATCH_INIT, cfg.param_dtype), logical_axes=(None,))


class CopyHead(nnx.Module):
    """The pointer (query, key, previous-token key, match weights) and the gate, of width ``cfg.copy_head``."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        d, c = cfg.hidden_size, cfg.copy_head
        self.query = Linear(d, c, bias=False, axes=("embed", None), cfg=cfg, rngs=rngs)
        self.key = Linear(d, c, bias=False, axes=("embed", None), cfg=cfg, rngs=rngs)
        self.previous = Linear(d, c, bias=False, axes=("embed", None), cfg=cfg, rngs=rngs)
        self.match = MatchWeights(cfg)
        self.gate = Linear(d, 1, bias=True, axes=("embed", None), cfg=cfg, rngs=rngs)
        self.cfg = cfg

    def point(self, hidden: jax.Array, tokens: jax.Array, embed: Callable[[jax.Array], jax.Array],
              mask: jax.Array, segment_ids: jax.Array | None, cache: tuple[jax.Array, jax.Array] | None,
              write_index: jax.Array | int, fresh: bool, queries_at: jax.Array | None = None
              ) -> tuple[Pointer, tuple[jax.Array, jax.Array] | None]:
        """Point from a pass over ``tokens [B, T]`` (final-normed ``hidden [B, T, D]``): over its own positions
        (``fresh``: no cache, or a prefill into an empty one; ``mask [B, T, T]``, causal within ``segment_ids``
        when given) or over the whole cache after writing this pass into it at ``write_index`` (``mask [B, T,
        S]``). ``queries_at [B]``: only that position of each row queries (a prefill's last token). Returns the
        pointer and the updated cache."""
        context = _context(tokens, mask, segment_ids, None if cache is None else cache[1], write_index, fresh)
        previous = context[..., 1]
        keys = self.key(hidden) + self.previous(jnp.where(previous[..., None] >= 0, embed(jnp.maximum(previous, 0)),
                                                          0))
        key_context = context
        if cache is not None:
            cache = (write_slots(cache[0], keys[:, :, None, :], write_index),
                     write_slots(cache[1], context[:, :, None, :].astype(cache[1].dtype), write_index))
            if not fresh:
                keys, key_context = cache[0][:, :, 0, :].astype(keys.dtype), cache[1][:, :, 0, :].astype(jnp.int32)
        if queries_at is not None:
            hidden, context, mask = (jnp.take_along_axis(x, queries_at[:, None, None], axis=1)
                                     for x in (hidden, context, mask))
        scores = jnp.einsum("btc,bsc->bts", self.query(hidden), keys).astype(jnp.float32) / jnp.sqrt(keys.shape[-1])
        match = self.match.weight[...].astype(jnp.float32)
        follows = jnp.ones(scores.shape, bool)
        for n in range(MATCHES):  # the n + 1 tokens before s are the query's last n + 1
            same = context[:, :, None, n] == key_context[:, None, :, n + 1]
            follows = follows & same & (context[:, :, n, None] >= 0)
            scores = scores + match[n] * follows
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        return Pointer(jax.nn.log_softmax(scores, axis=-1), key_context[..., 0]), cache

    def _gates(self, hidden: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``log g`` and ``log (1 - g)`` ``[B, T]``: the vocabulary's share and the pointer's."""
        gate = self.gate(hidden)[..., 0].astype(jnp.float32)
        return jax.nn.log_sigmoid(gate), jax.nn.log_sigmoid(-gate)

    def mix(self, vocab_logits: jax.Array, hidden: jax.Array, pointer: Pointer) -> jax.Array:
        """``log p [B, T, V]``: the whole mixed distribution (what a sampler draws from)."""
        _, t, v = vocab_logits.shape
        weights = jnp.exp(pointer.log_weights)
        copied = jax.vmap(lambda w, ids: jnp.zeros((t, v), jnp.float32).at[:, ids].add(w))(weights, pointer.key_ids)
        vocab_share, copy_share = self._gates(hidden)
        return jnp.logaddexp(vocab_share[..., None] + jax.nn.log_softmax(vocab_logits.astype(jnp.float32), axis=-1),
                             copy_share[..., None] + _safe_log(copied))

    def target_logprobs(self, vocab_logprobs: jax.Array, hidden: jax.Array, pointer: Pointer, targets: jax.Array
                        ) -> jax.Array:
        """``log p(target) [B, T]`` from the vocabulary's ``log softmax(logits)[target]``: no ``[B, T, V]`` array."""
        chosen = pointer.key_ids[:, None, :] == targets[:, :, None]
        copied = jnp.sum(jnp.exp(pointer.log_weights) * chosen, axis=-1)
        vocab_share, copy_share = self._gates(hidden)
        return jnp.logaddexp(vocab_share + vocab_logprobs, copy_share + _safe_log(copied))

    def init_cache(self, batch: int, length: int, dtype) -> tuple[jax.Array, jax.Array]:
        """The empty cache: keys ``[B, S, 1, C]``, and each slot's context ``[B, S, 1, CONTEXT]`` (float32 ids, -1:
        none)."""
        return (jnp.zeros((batch, length, 1, self.cfg.copy_head), dtype),
                jnp.full((batch, length, 1, CONTEXT), -1.0, jnp.float32))


def _context(tokens: jax.Array, mask: jax.Array, segment_ids: jax.Array | None, cached: jax.Array | None,
             write_index: jax.Array | int, fresh: bool) -> jax.Array:
    """``[B, T, CONTEXT]``: each position's token and the tokens before it, nearest first (-1: none). A token has
    one before it when its packed segment does, or when its mask shows it the slot before (not padding); before
    a pass's first token come the cache's, from the context of its last written slot."""
    b, t = tokens.shape
    shift = lambda x, fill: jnp.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=fill)  # noqa: E731
    index = jnp.broadcast_to(jnp.asarray(write_index, jnp.int32), (b,))
    if segment_ids is not None:
        present = (jnp.arange(t)[None, :] > 0) & (segment_ids == shift(segment_ids, -1))
    else:
        slots = index[:, None] + jnp.arange(t)[None, :] - 1
        present = jnp.take_along_axis(mask, jnp.maximum(slots, 0)[:, :, None], axis=2)[..., 0] & (slots >= 0)
    last = None
    if not fresh:  # the slot before this pass's first token: its own context
        last = jnp.take_along_axis(cached[:, :, 0, :], jnp.maximum(index - 1, 0)[:, None, None], axis=1)[:, 0]
    columns = [tokens]
    for n in range(1, CONTEXT):  # the token n before: the previous position's token n - 1 before
        column = shift(columns[-1], -1)
        if last is not None:
            column = column.at[:, 0].set(last[:, n - 1].astype(jnp.int32))
        columns.append(jnp.where(present, column, -1))
    return jnp.stack(columns, axis=-1)
