"""The in-process JAX sampler: batched prefill, then decode with a KV cache, all under ``jit``.

Prompts of different lengths share a batch by left padding: every prompt ends at slot ``P - 1`` of
the cache, so each decode step writes one slot for the whole batch, while positions (for RoPE) and
the attention mask skip each row's padding. The decode loop is a ``lax.while_loop`` inside one
compiled program, which stops as soon as every row has hit a stop token or ``max_tokens``; the
cache is created and updated in place inside that program and never leaves the device.

Sampling: greedy (``temperature == 0``), or temperature with optional top-k then top-p. The
logprob returned for each token is that of the model's own distribution (log-softmax of the raw
logits), as vLLM reports it by default and as RL importance ratios need.

Generation is a prefill program, then a decode program that runs a chunk of steps and takes the
decode state (the cache included) as a donated buffer, so the cache is updated in place across
chunks. ``generate`` runs one chunk to the end; ``stream`` runs short chunks and yields each row's
new tokens between them. Prompt and output lengths are bucketed (four sizes per octave), so the number of
compiled programs stays small under varied requests.

With a prefix cache (:mod:`orchard.rollout.prefix_cache`), a single text prompt starts from the keys and
values of the longest earlier prompt and completion it extends, and runs only the rest through the model
(:func:`prefill_after_prefix`); the tokens and logprobs are those of a whole prefill, to float tolerance.

Stop strings need a tokenizer, so engines apply them (:class:`~orchard.rollout.jax_engine.JaxEngine`).
Requests that arrive at different times share decode steps in
:class:`~orchard.rollout.batching.ContinuousBatcher`, over this sampler's model.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard.models.pixels import patchify
from orchard.models.transformer import Transformer
from orchard.models.vlm import Images, VLMConfig, vision_inputs
from orchard.rollout.prefix_cache import PrefixCache
from orchard.rollout.types import Completion, SamplingParams, StreamDelta


def _top_k_top_p(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Mask logits outside the top-k, then outside the smallest prefix holding ``top_p`` of the mass."""
    ordered = jnp.sort(scaled, axis=-1)[:, ::-1]  # [B, V], descending
    rank = jnp.arange(scaled.shape[-1])
    ordered = jnp.where((top_k > 0) & (rank >= top_k), -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    kept = ((jnp.cumsum(probs, axis=-1) - probs) < top_p) & jnp.isfinite(ordered)
    threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def sample_rows(logits: jax.Array, seeds: jax.Array, subrows: jax.Array, steps: jax.Array,
                temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token per row of ``logits [B, V]``, each row with its own parameters (arrays of ``[B]``), and
    its logprob under the raw distribution.

    A row's randomness is keyed by (its request's seed, its index in the request, its step), so a
    request samples the same tokens here and in the continuous batcher, whatever shares its batch.
    Greedy rows take the argmax; the branches are ``lax.cond``s, so a greedy batch never pays for the
    vocabulary sort that top-k/top-p need, nor for drawing.
    """
    greedy = jnp.argmax(logits, axis=-1)

    def draw(_) -> jax.Array:
        scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
        scaled = jax.lax.cond(jnp.any((top_k > 0) | (top_p < 1)), _top_k_top_p, lambda s, *_: s, scaled,
                              top_k[:, None], top_p[:, None])
        keys = jax.vmap(lambda seed, sub, step: jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), sub),
                                                                    step))(seeds, subrows, steps)
        return jax.vmap(jax.random.categorical)(keys, scaled)

    token = jax.lax.cond(jnp.all(temperature == 0), lambda _: greedy, draw, None)
    token = jnp.where(temperature == 0, greedy, token)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    return token, jnp.take_along_axis(logprobs, token[:, None], axis=-1)[:, 0]


def _prefill_mask(pad: jax.Array, prompt_len: int, cache_len: int) -> jax.Array:
    slots = jnp.arange(cache_len)
    steps = jnp.arange(prompt_len)
    return (slots[None, None, :] <= steps[None, :, None]) & (slots[None, None, :] >= pad[:, None, None])


# An image (uint8 [H, W, 3]), or with the index of its first placeholder in the prompt (which a caller that
# rendered the prompt knows; otherwise the placeholders are found by scanning for the image token).
PromptImage = np.ndarray | tuple[np.ndarray, int]
PromptImages = Sequence[Sequence[PromptImage]]  # per prompt, its images in placeholder order


class DecodeState(NamedTuple):
    """Everything decoding carries from one step to the next; it stays on the device."""

    step: jax.Array  # tokens sampled so far (per batch)
    caches: list
    last_logits: jax.Array  # [B, V]: the distribution of the next token
    tokens: jax.Array  # [B, max_new]
    logprobs: jax.Array  # [B, max_new]
    done: jax.Array  # [B]
    lengths: jax.Array  # [B]
    top_ids: jax.Array  # [B, max_new, K]: the K most likely tokens of each step (K may be 0)
    top_logprobs: jax.Array  # [B, max_new, K]


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "top"))
def _prefill(graphdef, state, tokens, pad, positions=None, images: Images | None = None, *, max_new: int,
             top: int) -> DecodeState:
    """The prompt into a fresh cache. ``positions`` (``[3, B, P]`` for a prompt with images) default to
    each row's index after its padding; ``images`` go to a vision-language model."""
    model = nnx.merge(graphdef, state)
    batch, prompt_len = tokens.shape
    cache_len = prompt_len + max_new
    caches = model.init_cache(batch, cache_len)
    if positions is None:
        positions = jnp.maximum(jnp.arange(prompt_len)[None, :] - pad[:, None], 0)
    extra = {} if images is None else {"images": images}
    logits, caches = model.forward(tokens, positions, _prefill_mask(pad, prompt_len, cache_len), caches, 0,
                                   causal=True, **extra)
    return DecodeState(jnp.int32(0), caches, logits[:, -1], jnp.zeros((batch, max_new), jnp.int32),
                       jnp.zeros((batch, max_new), jnp.float32), jnp.zeros((batch,), bool),
                       jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, max_new, top), jnp.int32),
                       jnp.zeros((batch, max_new, top), jnp.float32))


PREFIX_CHUNK = 64  # tokens a step of a cached prefill runs (the steps loop in one program for any count)
MIN_REUSE = PREFIX_CHUNK  # fewer shared tokens than this: prefill the whole prompt


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_len"))
def prefill_after_prefix(graphdef, state, prefix, tokens, pad, end, reused, *, cache_len: int) -> tuple[list, jax.Array]:
    """A prompt (a batch of one: ``tokens [1, T]`` hold it in slots ``[pad, end)``) whose first ``reused`` tokens'
    keys and values are in ``prefix`` (the cache pytree, each leaf ``[1, L, ...]`` by position), into a fresh
    cache of ``cache_len`` slots: those keys and values fill their slots, and only the rest of the prompt runs
    through the model, ``PREFIX_CHUNK`` tokens a step (the first step runs a few of the reused tokens again,
    so that the steps end at ``end``; the caller makes sure they start after ``pad``). Returns the cache and
    the last token's logits ``[1, V]``. One program for every ``reused`` and ``end``."""
    model = nnx.merge(graphdef, state)
    steps = (end - pad[0] - reused + PREFIX_CHUNK - 1) // PREFIX_CHUNK
    first = end - steps * PREFIX_CHUNK  # the slot the steps start at
    slots = jnp.arange(cache_len)
    position = slots - pad[0]
    kept = (position >= 0) & (slots < first)

    def fill(empty: jax.Array, cached: jax.Array) -> jax.Array:
        taken = jnp.take(cached, jnp.clip(position, 0, cached.shape[1] - 1), axis=1).astype(empty.dtype)
        return jnp.where(kept.reshape((1, cache_len) + (1,) * (empty.ndim - 2)), taken, empty)

    def step(index, carry):
        caches, _ = carry
        start = first + index * PREFIX_CHUNK
        queries = start + jnp.arange(PREFIX_CHUNK)
        mask = ((slots[None, :] <= queries[:, None]) & (slots[None, :] >= pad[0]))[None]  # [1, C, S]
        logits, caches = model.forward(jax.lax.dynamic_slice(tokens, (0, start), (1, PREFIX_CHUNK)),
                                       (queries - pad[0])[None], mask, caches, start,
                                       logits_at=jnp.array([PREFIX_CHUNK - 1]))
        return caches, logits[:, -1]

    caches = jax.tree.map(fill, model.init_cache(1, cache_len), prefix)
    return jax.lax.fori_loop(0, steps, step, (caches, jnp.zeros((1, model.cfg.vocab_size), jnp.float32)))


def reusable(cache: PrefixCache, prompt: Sequence[int]) -> tuple[Any, int]:
    """The prefix-cache entry a prompt's prefill starts from and how many of its tokens it shares, or
    ``(None, 0)`` where too few are shared; the lookup is counted either way."""
    entry, shared = cache.longest(np.asarray(prompt, np.int32))
    shared = min(shared, len(prompt) - 1)  # at least the last token runs: its logits are the first draw's
    reused = len(prompt) - -(-(len(prompt) - shared) // PREFIX_CHUNK) * PREFIX_CHUNK  # before the first step
    if entry is None or shared < MIN_REUSE or reused <= 0:
        cache.record(len(prompt), 0)
        return None, 0
    cache.record(len(prompt), reused)
    return entry, shared


@jax.jit
def _by_position(caches: list, pad: jax.Array) -> list:
    """A batch of one's cache with its slots shifted so that index ``i`` holds position ``i``."""
    def shift(leaf: jax.Array) -> jax.Array:
        return jnp.take(leaf, jnp.clip(pad[0] + jnp.arange(leaf.shape[1]), 0, leaf.shape[1] - 1), axis=1)

    return jax.tree.map(shift, caches)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("decode",))
def _decode(graphdef, state, decode: DecodeState, until, prompt_len, pad, delta, seed, temperature, top_k, top_p,
            stop_ids) -> DecodeState:
    """Sample until step ``until`` or until every row is done, in one compiled loop. A token at slot ``s``
    takes position ``s - pad + delta`` (``delta``: 0, or a prompt with images' rotary delta)."""
    model = nnx.merge(graphdef, state)
    slots = jnp.arange(decode.caches[0].k.shape[1])

    def cond(carry: DecodeState):
        return (carry.step < until) & ~jnp.all(carry.done)

    def body(carry: DecodeState) -> DecodeState:
        step, done = carry.step, carry.done
        rows = jnp.arange(done.shape[0])
        token, logprob = sample_rows(carry.last_logits, jnp.full_like(rows, seed), rows, jnp.full_like(rows, step),
                                     *(jnp.full(rows.shape, v) for v in (temperature, top_k, top_p)))
        top_ids, top_logprobs = carry.top_ids, carry.top_logprobs
        if top_ids.shape[-1]:  # static: only requests that ask for alternatives pay for them
            values, ids = jax.lax.top_k(jax.nn.log_softmax(carry.last_logits, axis=-1), top_ids.shape[-1])
            top_ids, top_logprobs = top_ids.at[:, step].set(ids), top_logprobs.at[:, step].set(values)
        tokens = carry.tokens.at[:, step].set(jnp.where(done, 0, token))
        logprobs = carry.logprobs.at[:, step].set(jnp.where(done, 0.0, logprob))
        lengths = carry.lengths + (~done).astype(jnp.int32)
        done = done | jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        slot = prompt_len + step
        mask = ((slots <= slot)[None, :] & (slots[None, :] >= pad[:, None]))[:, None, :]  # [B, 1, S]
        logits, caches = model.forward(token[:, None], (slot - pad + delta)[:, None], mask, carry.caches, slot)
        return DecodeState(step + 1, caches, logits[:, -1], tokens, logprobs, done, lengths, top_ids, top_logprobs)

    return jax.lax.while_loop(cond, body, decode)


def bucket(length: int, smallest: int = 16) -> int:
    """Round a length up to the next of four steps per octave (512, 640, 768, 896, 1024, 1280, ...), so
    a handful of shapes cover every request and the compiled programs are reused, while padding
    stays under a quarter. (Powers of two wasted up to half: on the CPU the embedded default's
    policy prefilled a 768-token prompt in 17 ms and the same prompt padded to 1024 in 52 ms.)"""
    if length <= smallest:
        return smallest
    step = max(1 << (length - 1).bit_length() >> 3, 1)  # an eighth of the next power of two
    return -(-length // step) * step


def collect(deltas: Iterable[StreamDelta], rows: int) -> list[Completion]:
    """Join each row's stream deltas into its completion."""
    parts: list[list[StreamDelta]] = [[] for _ in range(rows)]
    for delta in deltas:
        parts[delta.row].append(delta)
    completions = []
    for row in parts:
        finish = next((d.finish_reason for d in reversed(row) if d.finish_reason), "length")
        text = None if not row or row[0].text is None else "".join(d.text for d in row)
        alternatives = None if not row or row[0].alternatives is None else [a for d in row for a in d.alternatives]
        version = next((d.weight_version for d in row if d.weight_version is not None), None)
        completions.append(Completion([t for d in row for t in d.token_ids], [lp for d in row for lp in d.logprobs],
                                      finish, text, alternatives, version))
    return completions


class Sampler:
    """Generates continuations of token-id prompts with a :class:`~orchard.models.Transformer`.

    ``prefix_cache_bytes`` > 0: single text prompts reuse the keys and values of earlier generations that
    their tokens start with (:mod:`orchard.rollout.prefix_cache`), within that many bytes."""

    def __init__(self, model: Transformer, prefix_cache_bytes: int = 0) -> None:
        self.graphdef, state = nnx.split(model)
        # Committed where they lie, as :meth:`update` places the weights it takes (a program is compiled
        # for its arguments' placement and commitment both).
        self.state = jax.device_put(state, jax.tree.map(lambda array: array.sharding, state))
        self.cfg = model.cfg
        self.config = getattr(model, "config", model.cfg)  # a VLM's whole config (its vision tower's too)
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None

    def update(self, params: nnx.State) -> None:
        """Take new parameters of the same architecture (a trainer's ``nnx.split(model, nnx.Param)``):
        the next call uses them and nothing recompiles: they are placed as the served ones are (arrays
        placed otherwise, such as a learner's on its mesh, are a new signature to a compiled program:
        every RL run compiled prefill and decode again at its first sync). Parameters of another shape
        or dtype, or a different set of them, are a ``ValueError``."""
        def signature(state: nnx.State) -> tuple:
            flat = nnx.to_flat_state(state)
            return tuple((path, tuple(v.get_value().shape), str(v.get_value().dtype)) for path, v in flat)

        if signature(params) != signature(self.state):
            raise ValueError("update_weights needs parameters of the same architecture as the served model "
                             "(the same names, shapes and dtypes)")
        self.state = jax.device_put(params, jax.tree.map(lambda served: served.sharding, self.state))
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # keys and values of the old weights

    def _vision(self, tokens: np.ndarray, pad: np.ndarray, images: PromptImages | None
                ) -> tuple[jax.Array | None, Images | None, jax.Array]:
        """Positions, images and rotary deltas of a padded batch (None, None, zeros without images)."""
        none = jnp.zeros(tokens.shape[0], jnp.int32)
        if images is None or not any(images):
            return None, None, none
        if not isinstance(self.config, VLMConfig):
            raise ValueError("this model takes no images: it is not a vision-language model")
        if len(images) != tokens.shape[0]:
            raise ValueError(f"images for {len(images)} prompts, {tokens.shape[0]} prompts")
        patches = [[self._patches(image) for image in row] for row in images]
        positions, batch_images, delta = vision_inputs(tokens, patches, self.config, pad)
        return jnp.asarray(positions), batch_images, jnp.asarray(delta)

    def _patches(self, image: PromptImage) -> tuple:
        """An image (or ``(image, start)``) processed as the model does: ``(patches, grid[, start])``."""
        pixels, start = image if isinstance(image, tuple) else (image, None)
        patches, grid = patchify(np.asarray(pixels), self.config.vision, self.config.processing)
        return (patches, grid) if start is None else (patches, grid, start)

    def check(self, prompts: list[list[int]], params: SamplingParams) -> None:
        """Raise ``ValueError`` for a request this model cannot serve."""
        if not prompts or any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        longest = max(len(p) for p in prompts)
        if longest + params.max_tokens > self.cfg.max_position_embeddings:
            raise ValueError(f"prompt ({longest}) + max_tokens ({params.max_tokens}) exceeds the model's "
                             f"context of {self.cfg.max_position_embeddings}")
        if any(not 0 <= t < self.cfg.vocab_size for p in prompts for t in p):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size})")

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: PromptImages | None = None) -> list[Completion]:
        return collect(self.stream(prompts, params, chunk_tokens=params.max_tokens, images=images), len(prompts))

    def stream(self, prompts: list[list[int]], params: SamplingParams, chunk_tokens: int = 1,
               images: PromptImages | None = None) -> Iterator[StreamDelta]:
        """Generate, yielding each row's new tokens every ``chunk_tokens`` decode steps.

        ``images``: per prompt, its images (uint8 ``[H, W, 3]``, or ``(image, start)`` with the index of
        its first placeholder) in the order of their placeholders, for a vision-language model.
        Sampling is keyed by step, so the tokens are the same whatever the chunk size.
        """
        self.check(prompts, params)
        prompt_len = bucket(max(len(p) for p in prompts))
        tokens = np.zeros((len(prompts), prompt_len), np.int32)
        pad = np.zeros((len(prompts),), np.int32)
        for row, prompt in enumerate(prompts):
            pad[row] = prompt_len - len(prompt)
            tokens[row, pad[row]:] = prompt
        positions, batch_images, delta = self._vision(tokens, pad, images)
        pad = jnp.asarray(pad)
        stop_ids = jnp.asarray(params.stop_token_ids or (-1,), jnp.int32)
        sampling = (jnp.int32(params.seed % 2**31), jnp.float32(params.temperature), jnp.int32(params.top_k),
                    jnp.float32(params.top_p), stop_ids)
        cached = self.prefix_cache is not None and len(prompts) == 1 and batch_images is None
        decode = self._prefill_cached(prompts[0], tokens, pad, params) if cached else None
        if decode is None:
            decode = _prefill(self.graphdef, self.state, jnp.asarray(tokens), pad, positions, batch_images,
                              max_new=bucket(params.max_tokens), top=params.top_logprobs)
        sent = np.zeros(len(prompts), np.int64)
        finished = np.zeros(len(prompts), bool)
        last = {"decode": decode, "tokens": np.zeros(0, np.int32)}
        try:
            yield from self._decode_chunks(last, prompts, params, chunk_tokens, prompt_len, pad, delta, sampling,
                                           sent, finished)
        except GeneratorExit:  # the caller stopped reading (a stop string): what was decoded is still good
            if cached:
                self._remember(prompts[0], last, pad)
            raise
        if cached:
            self._remember(prompts[0], last, pad)

    def _remember(self, prompt: list[int], last: dict, pad: jax.Array) -> None:
        """Keep the prompt and what was sampled of its completion (every token's keys and values are written)."""
        self.prefix_cache.add(np.concatenate([np.asarray(prompt, np.int32), last["tokens"]]).astype(np.int32),
                              _by_position(last["decode"].caches, pad))

    def _prefill_cached(self, prompt: list[int], tokens: np.ndarray, pad: jax.Array,
                        params: SamplingParams) -> DecodeState | None:
        """The prefill of one prompt from the prefix cache's longest match, or None where too little matches."""
        entry, shared = reusable(self.prefix_cache, prompt)
        if entry is None:
            return None
        prompt_len, max_new, top = tokens.shape[1], bucket(params.max_tokens), params.top_logprobs
        caches, logits = prefill_after_prefix(self.graphdef, self.state, entry.caches, jnp.asarray(tokens), pad,
                                              jnp.int32(prompt_len), jnp.int32(shared),
                                              cache_len=prompt_len + max_new)
        return DecodeState(jnp.int32(0), caches, logits, jnp.zeros((1, max_new), jnp.int32),
                           jnp.zeros((1, max_new), jnp.float32), jnp.zeros((1,), bool), jnp.zeros((1,), jnp.int32),
                           jnp.zeros((1, max_new, top), jnp.int32), jnp.zeros((1, max_new, top), jnp.float32))

    def _decode_chunks(self, last: dict, prompts: list[list[int]], params: SamplingParams, chunk_tokens: int,
                       prompt_len: int, pad: jax.Array, delta: jax.Array, sampling: tuple, sent: np.ndarray,
                       finished: np.ndarray) -> Iterator[StreamDelta]:
        """Decode from ``last["decode"]`` chunk by chunk, yielding each row's new tokens; ``last`` keeps the
        latest state and row 0's tokens so far (for the prefix cache)."""
        decode = last["decode"]
        while not finished.all():
            until = min(int(decode.step) + chunk_tokens, params.max_tokens)
            decode = _decode(self.graphdef, self.state, decode, jnp.int32(until), jnp.int32(prompt_len), pad,
                             delta, *sampling)
            out_tokens, out_logprobs, lengths, done, step, top_ids, top_values = jax.device_get(
                (decode.tokens, decode.logprobs, decode.lengths, decode.done, decode.step, decode.top_ids,
                 decode.top_logprobs))
            last.update(decode=decode, tokens=out_tokens[0, :lengths[0]])
            for row in np.flatnonzero(~finished):
                over = bool(done[row]) or int(step) >= params.max_tokens
                if lengths[row] > sent[row] or over:
                    new = slice(sent[row], lengths[row])
                    alternatives = [list(zip(ids.tolist(), values.tolist(), strict=True))
                                    for ids, values in zip(top_ids[row, new], top_values[row, new], strict=True)]
                    yield StreamDelta(int(row), out_tokens[row, new].tolist(), out_logprobs[row, new].tolist(),
                                      ("stop" if done[row] else "length") if over else None,
                                      alternatives=alternatives if params.top_logprobs else None)
                    sent[row], finished[row] = lengths[row], over
