"""Continuous batching: requests join the running decode batch at step boundaries, finished rows leave.

``orchard serve`` answers many harness sessions at once. Run one request at a time, N concurrent
sessions cost N sequential ones; here they share each decode step. One scheduler thread owns the
model and loops:

1. **admit** waiting requests (first come, first served) into free rows of the batch: each request's
   prompts are prefilled on their own (right-padded to a bucketed length) and their keys and values
   copied into the batch's KV cache;
2. **decode** a chunk of ``chunk_steps`` steps for every active row in one compiled loop;
3. **deliver** each request its rows' new tokens, and free the rows that finished (a stop token,
   their ``max_tokens``, or a request that was cancelled).

Unlike :class:`~orchard.rollout.sampler.Sampler`, whose rows start together and share one write
slot (left padding), rows here start at different times, so each row of the cache ``[B, S, K, Dh]``
is left-aligned and has its own length: its next token goes to its own slot, at its own position,
and the mask lets it see only its own slots. The batch's capacity grows in buckets (rows in powers
of two up to ``max_rows``, slots with :func:`~orchard.rollout.sampler.bucket` from ``min_slots``), shrinks
when three quarters of its rows are idle, and is dropped when the batch empties, so the number of compiled
programs stays small and an idle server holds no cache. Short requests all share the ``min_slots``
capacity: each new capacity compiles the decode loop again (SmolLM2 on 2 CPU cores: ~3 s), while 128
slots instead of 16 add ~4 ms to a one-row step of ~30 ms.

Every row samples with its own request's parameters (temperature, top-k, top-p, seed, stop ids,
``max_tokens``), keyed by (seed, the row's index in its request, step) as the sampler keys them
(:func:`~orchard.rollout.sampler.sample_rows`): a request's tokens do not depend on what else
shares the batch, and are the ones the in-process engine samples for it. Weight updates wait for the rows in flight to finish (new
requests queue meanwhile), so no completion mixes two versions of the weights.

With the sampler's prefix cache (:mod:`orchard.rollout.prefix_cache`), a single-prompt request starts from
the longest entry its prompt extends and prefills only the rest; when its row ends, the row's keys and values
(its slots are its positions) become an entry. Not here (vLLM has them): paged KV blocks shared by reference,
chunked prefill of long prompts beside decoding rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard.rollout.sampler import Sampler, bucket, prefill_after_prefix, reusable, sample_rows
from orchard.rollout.types import MAX_TOP_LOGPROBS, SamplingParams, StreamDelta

log = logging.getLogger(__name__)

_END = object()  # delivered after a request's last delta


class BatchState(NamedTuple):
    """What the batch carries between programs; it stays on the device."""

    caches: list  # per layer: KVCache of [B, S, K, Dh]
    last_logits: jax.Array  # [B, V]: each row's distribution of its next token
    lengths: jax.Array  # [B]: filled slots of each row (its next token's position)


class RowParams(NamedTuple):
    """Each row's sampling parameters and progress (host arrays, sent with every chunk)."""

    active: np.ndarray  # [B] bool
    seeds: np.ndarray  # [B] int32
    subrows: np.ndarray  # [B] int32: the row's index within its request
    generated: np.ndarray  # [B] int32: tokens sampled so far
    max_tokens: np.ndarray  # [B] int32
    temperature: np.ndarray  # [B] float32
    top_k: np.ndarray  # [B] int32
    top_p: np.ndarray  # [B] float32
    stop_ids: np.ndarray  # [B, M] int32, padded with -1

    @classmethod
    def empty(cls, rows: int, stops: int) -> RowParams:
        zeros = functools.partial(np.zeros, rows)
        return cls(zeros(dtype=bool), zeros(dtype=np.int32), zeros(dtype=np.int32), zeros(dtype=np.int32),
                   np.ones(rows, np.int32), zeros(dtype=np.float32), zeros(dtype=np.int32),
                   np.ones(rows, np.float32), np.full((rows, stops), -1, np.int32))


class ChunkOut(NamedTuple):
    tokens: jax.Array  # [B, C]
    logprobs: jax.Array  # [B, C]
    counts: jax.Array  # [B]: tokens each row produced in this chunk
    finished: jax.Array  # [B]: the row ended in this chunk
    stopped: jax.Array  # [B]: ... on a stop token (else on max_tokens)
    top_ids: jax.Array  # [B, C, K]
    top_logprobs: jax.Array  # [B, C, K]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _prefill_rows(graphdef, state, tokens: jax.Array, lengths: jax.Array):
    """Prefill right-padded prompts ``[n, L]`` into a fresh cache of L slots; the last real token's logits."""
    model = nnx.merge(graphdef, state)
    rows, prompt_len = tokens.shape
    caches = model.init_cache(rows, prompt_len)
    positions = jnp.broadcast_to(jnp.arange(prompt_len), (rows, prompt_len))
    steps = jnp.arange(prompt_len)
    mask = jnp.broadcast_to(steps[None, :, None] >= steps[None, None, :], (rows, prompt_len, prompt_len))
    logits, caches = model.forward(tokens, positions, mask, caches, 0, causal=True, logits_at=lengths - 1)
    return caches, logits[:, 0]


@functools.partial(jax.jit, donate_argnames=("batch",))
def _insert(batch: BatchState, caches: list, last_logits: jax.Array, lengths: jax.Array,
            rows: jax.Array) -> BatchState:
    """Copy freshly prefilled rows into the batch at ``rows``."""
    width = caches[0].k.shape[1]
    merged = [type(old)(old.k.at[rows, :width].set(new.k.astype(old.k.dtype)),
                        old.v.at[rows, :width].set(new.v.astype(old.v.dtype)))
              for old, new in zip(batch.caches, caches, strict=True)]
    return BatchState(merged, batch.last_logits.at[rows].set(last_logits), batch.lengths.at[rows].set(lengths))


@functools.partial(jax.jit, static_argnames=("rows", "slots"))
def _relayout(batch: BatchState, keep: jax.Array, *, rows: int, slots: int) -> BatchState:
    """A batch of ``rows`` x ``slots`` whose row i is the old row ``keep[i]`` (-1: an empty row)."""
    valid = keep >= 0
    source = jnp.maximum(keep, 0)
    width = min(slots, batch.caches[0].k.shape[1])

    def move(old: jax.Array) -> jax.Array:
        taken = jnp.where(valid[:, None, None, None], old[source, :width], 0)
        return jnp.zeros((rows, slots, *old.shape[2:]), old.dtype).at[:, :width].set(taken)

    caches = [type(c)(move(c.k), move(c.v)) for c in batch.caches]
    return BatchState(caches, jnp.where(valid[:, None], batch.last_logits[source], 0.0),
                      jnp.where(valid, batch.lengths[source], 0))


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "top"), donate_argnames=("batch",))
def _decode_chunk(graphdef, state, batch: BatchState, params: RowParams, *, steps: int,
                  top: int) -> tuple[BatchState, ChunkOut]:
    """Up to ``steps`` decode steps for every active row, stopping early when every row is done."""
    model = nnx.merge(graphdef, state)
    rows = batch.lengths.shape[0]
    slots = jnp.arange(batch.caches[0].k.shape[1])
    out = ChunkOut(jnp.zeros((rows, steps), jnp.int32), jnp.zeros((rows, steps), jnp.float32),
                   jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), bool), jnp.zeros((rows,), bool),
                   jnp.zeros((rows, steps, top), jnp.int32), jnp.zeros((rows, steps, top), jnp.float32))

    def cond(carry) -> jax.Array:
        step, _, done, _, _ = carry
        return (step < steps) & ~jnp.all(done)

    def body(carry):
        step, batch, done, generated, out = carry
        token, logprob = sample_rows(batch.last_logits, params.seeds, params.subrows, generated, params.temperature,
                                     params.top_k, params.top_p)
        top_ids, top_values = out.top_ids, out.top_logprobs
        if top:  # static: only batches where a row asks for alternatives pay for them
            values, ids = jax.lax.top_k(jax.nn.log_softmax(batch.last_logits, axis=-1), top)
            top_ids, top_values = top_ids.at[:, step].set(ids), top_values.at[:, step].set(values)
        live = ~done
        generated = generated + live.astype(jnp.int32)
        stopped = live & jnp.any(token[:, None] == params.stop_ids, axis=-1)
        ended = live & (stopped | (generated >= params.max_tokens))
        out = ChunkOut(out.tokens.at[:, step].set(jnp.where(live, token, 0)),
                       out.logprobs.at[:, step].set(jnp.where(live, logprob, 0.0)),
                       out.counts + live.astype(jnp.int32), out.finished | ended, out.stopped | stopped,
                       top_ids, top_values)
        position = batch.lengths
        mask = ((slots[None, :] <= position[:, None]) & live[:, None])[:, None, :]  # [B, 1, S]
        logits, caches = model.forward(token[:, None], position[:, None], mask, batch.caches, position)
        batch = BatchState(caches, jnp.where(live[:, None], logits[:, -1], batch.last_logits),
                           position + live.astype(jnp.int32))
        return step + 1, batch, done | ended, generated, out

    _, batch, _, _, out = jax.lax.while_loop(cond, body, (jnp.int32(0), batch, ~params.active,
                                                          params.generated, out))
    return batch, out


@dataclass(eq=False)
class BatchRequest:
    """One request's prompts in the batch, and where its deltas go."""

    prompts: list[list[int]]
    sampling: SamplingParams
    deliver: Callable[[object], None]  # a StreamDelta, an exception, or _END
    rows: list[int] = field(default_factory=list)  # its batch rows, once admitted (-1: finished)
    weight_version: int = 0
    cancelled: bool = False
    generated: list[int] = field(default_factory=list)  # a single prompt's tokens so far, for the prefix cache

    def cancel(self) -> None:
        """Stop decoding this request; its rows are freed at the next step boundary."""
        self.cancelled = True


class ContinuousBatcher:
    """Serves concurrent requests on one model by sharing decode steps (see the module docstring)."""

    def __init__(self, sampler: Sampler, max_rows: int = 32, chunk_steps: int = 2, max_stop_ids: int = 16,
                 min_slots: int = 128) -> None:
        if max_rows < 1 or chunk_steps < 1 or min_slots < 1:
            raise ValueError("max_rows, chunk_steps and min_slots must be at least 1")
        self.sampler, self.max_rows, self.chunk_steps, self.max_stop_ids = sampler, max_rows, chunk_steps, max_stop_ids
        self.min_slots = min_slots
        self.weight_version = 0
        self.stats = {"chunks": 0, "steps": 0, "row_steps": 0, "admitted": 0, "relayouts": 0}
        self._cond = threading.Condition()
        self._waiting: deque[BatchRequest] = deque()
        self._active: list[BatchRequest] = []
        self._pending_update: tuple | None = None
        self._pending_update_error: Exception | None = None
        self._closed = False
        self._batch: BatchState | None = None
        self._params: RowParams | None = None
        self._owners: list[BatchRequest | None] = []  # per batch row
        self._thread = threading.Thread(target=self._run, name="orchard-batcher", daemon=True)
        self._thread.start()

    # -- the client side ---------------------------------------------------------------------------

    def submit(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
               deliver: Callable[[object], None]) -> BatchRequest:
        """Queue a request; ``deliver`` is called from the scheduler thread with each
        :class:`StreamDelta`, then with the end marker (or with the exception that ended it)."""
        prompts = [list(p) for p in prompts]
        self.sampler.check(prompts, sampling)
        if len(prompts) > self.max_rows:
            raise ValueError(f"a request may hold at most {self.max_rows} sequences (this one holds {len(prompts)})")
        if len(sampling.stop_token_ids) > self.max_stop_ids:
            raise ValueError(f"at most {self.max_stop_ids} stop token ids (got {len(sampling.stop_token_ids)})")
        request = BatchRequest(prompts, sampling, deliver)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._waiting.append(request)
            self._cond.notify_all()
        return request

    def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> Iterator[StreamDelta]:
        """Each row's new tokens as they are decoded; closing the iterator cancels the request."""
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        request = self.submit(prompts, sampling, inbox.put)
        try:
            while (item := inbox.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            request.cancel()

    async def astream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> AsyncIterator[StreamDelta]:
        """:meth:`stream` for the event loop: no thread waits on the request."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()

        def deliver(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is listening
                loop.call_soon_threadsafe(inbox.put_nowait, item)

        request = self.submit(prompts, sampling, deliver)
        try:
            while (item := await inbox.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            request.cancel()

    def update(self, params: nnx.State, version: int) -> None:
        """Serve ``params`` from the next admitted request on, once the rows in flight have finished."""
        done = threading.Event()
        with self._cond:
            self._pending_update = (params, version, done)
            self._cond.notify_all()
        done.wait()
        error = self._pending_update_error
        if error is not None:
            raise error

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    @property
    def active_rows(self) -> int:
        return sum(owner is not None for owner in self._owners)

    # -- the scheduler -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._active and (not self._waiting or self._pending_update):
                    if self._pending_update:
                        self._apply_update()
                        continue
                    self._cond.wait()
                if self._closed:
                    break
                if self._pending_update and not self._active:
                    self._apply_update()
                admitted = self._take_admissible()
            try:
                if admitted:
                    self._admit(admitted)
                self._drop_cancelled()
                if any(owner is not None for owner in self._owners):
                    self._decode()
                self._shrink()
            except Exception as exc:  # every waiting client must hear of it
                log.exception("continuous batching failed; failing the requests in flight")
                self._fail_all(exc)
        self._fail_all(RuntimeError("the batcher was closed"))

    def _apply_update(self) -> None:
        params, version, done = self._pending_update
        self._pending_update = None
        try:
            self.sampler.update(params)
            self.weight_version, self._pending_update_error = version, None
        except ValueError as exc:
            self._pending_update_error = exc
        done.set()

    def _take_admissible(self) -> list[BatchRequest]:
        """Waiting requests that fit in the free rows, in order (none while an update waits)."""
        taken: list[BatchRequest] = []
        free = self.max_rows - self.active_rows
        while self._waiting and not self._pending_update:
            request = self._waiting[0]
            if request.cancelled:
                self._waiting.popleft()
                request.deliver(_END)
                continue
            if len(request.prompts) > free:
                break
            free -= len(request.prompts)
            taken.append(self._waiting.popleft())
        self._active += taken
        return taken

    def _admit(self, requests: list[BatchRequest]) -> None:
        needed_rows = self.active_rows + sum(len(r.prompts) for r in requests)
        needed_slots = max([bucket(len(p) + r.sampling.max_tokens, self.min_slots) for r in requests for p in r.prompts]
                           + [self._batch.caches[0].k.shape[1] if self._batch is not None else 0])
        needed_slots = min(needed_slots, self.sampler.cfg.max_position_embeddings)
        self._ensure_capacity(needed_rows, needed_slots)
        for request in requests:
            free = [row for row, owner in enumerate(self._owners) if owner is None][: len(request.prompts)]
            width = min(bucket(max(len(p) for p in request.prompts)), self._batch.caches[0].k.shape[1])
            tokens = np.zeros((len(request.prompts), width), np.int32)
            lengths = np.array([len(p) for p in request.prompts], np.int32)
            for row, prompt in enumerate(request.prompts):
                tokens[row, : len(prompt)] = prompt
            entry, shared = (reusable(self.sampler.prefix_cache, request.prompts[0]) if self._caches(request)
                             else (None, 0))
            if entry is not None:  # the row's slots are its positions: no padding before the prompt
                caches, logits = prefill_after_prefix(self.sampler.graphdef, self.sampler.state, entry.caches,
                                                      jnp.asarray(tokens), jnp.zeros((1,), jnp.int32),
                                                      jnp.int32(lengths[0]), jnp.int32(shared), cache_len=width)
            else:
                caches, logits = _prefill_rows(self.sampler.graphdef, self.sampler.state, jnp.asarray(tokens),
                                               jnp.asarray(lengths))
            self._batch = _insert(self._batch, caches, logits, jnp.asarray(lengths), jnp.asarray(free, jnp.int32))
            sampling = request.sampling
            stops = np.full(self.max_stop_ids, -1, np.int32)
            stops[: len(sampling.stop_token_ids)] = sampling.stop_token_ids
            for subrow, row in enumerate(free):
                self._owners[row] = request
                self._set_row(row, True, sampling.seed % 2**31, subrow, 0, sampling.max_tokens, sampling.temperature,
                              sampling.top_k, sampling.top_p, stops)
            request.rows, request.weight_version = free, self.weight_version
            self.stats["admitted"] += 1

    def _caches(self, request: BatchRequest) -> bool:
        """Whether ``request`` reads and fills the sampler's prefix cache (a single prompt, a cache to use)."""
        return self.sampler.prefix_cache is not None and len(request.prompts) == 1

    def _set_row(self, row: int, *values) -> None:
        for array, value in zip(self._params, values, strict=True):
            array[row] = value

    def _ensure_capacity(self, rows: int, slots: int) -> None:
        have_rows = len(self._owners)
        want_rows = max(have_rows, min(1 << (rows - 1).bit_length(), self.max_rows))
        have_slots = 0 if self._batch is None else self._batch.caches[0].k.shape[1]
        want_slots = max(have_slots, slots)
        if (want_rows, want_slots) != (have_rows, have_slots):
            self._relayout(list(range(have_rows)) + [-1] * (want_rows - have_rows), want_slots)

    def _relayout(self, keep: list[int], slots: int) -> None:
        """Re-shape the batch: new row i holds old row ``keep[i]`` (-1: empty)."""
        if self._batch is None:
            cfg = self.sampler.cfg
            model = nnx.merge(self.sampler.graphdef, self.sampler.state)
            self._batch = BatchState(model.init_cache(1, slots), jnp.zeros((1, cfg.vocab_size), jnp.float32),
                                     jnp.zeros((1,), jnp.int32))
            keep = [k if k < 0 else 0 for k in keep]
        self._batch = _relayout(self._batch, jnp.asarray(keep, jnp.int32), rows=len(keep), slots=slots)
        old_params, old_owners = self._params, self._owners
        self._params = RowParams.empty(len(keep), self.max_stop_ids)
        self._owners = [None] * len(keep)
        for new, old in enumerate(keep):
            if old >= 0 and old < len(old_owners) and old_owners[old] is not None:
                self._owners[new] = owner = old_owners[old]
                owner.rows = [new if r == old else r for r in owner.rows]
                for array, old_array in zip(self._params, old_params, strict=True):
                    array[new] = old_array[old]
        self.stats["relayouts"] += 1

    def _shrink(self) -> None:
        """Drop the cache when the batch is empty; halve rows while three quarters of them are idle."""
        used = self.active_rows
        if used == 0:
            self._batch, self._params, self._owners = None, None, []
            return
        rows = len(self._owners)
        if rows >= 4 and used <= rows // 4:
            live = [row for row, owner in enumerate(self._owners) if owner is not None]
            target = max(1 << (used - 1).bit_length(), 1)
            self._relayout(live + [-1] * (target - len(live)), self._batch.caches[0].k.shape[1])

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._active if r.cancelled]:
            self._finish(request)

    def _finish(self, request: BatchRequest) -> None:
        for row in request.rows:
            if row >= 0 and self._owners[row] is request:
                self._owners[row] = None
                self._params.active[row] = False
        self._active.remove(request)
        request.deliver(_END)

    def _decode(self) -> None:
        top = MAX_TOP_LOGPROBS if any(o is not None and o.sampling.top_logprobs for o in self._owners) else 0
        self._batch, out = _decode_chunk(self.sampler.graphdef, self.sampler.state, self._batch,
                                         RowParams(*(np.array(a) for a in self._params)), steps=self.chunk_steps,
                                         top=top)
        tokens, logprobs, counts, finished, stopped, top_ids, top_values = jax.device_get(out)
        self.stats["chunks"] += 1
        self.stats["steps"] += int(counts.max(initial=0))
        self.stats["row_steps"] += int(counts.sum())
        for row, request in enumerate(list(self._owners)):
            if request is None:
                continue
            count = int(counts[row])
            self._params.generated[row] += count
            ended = bool(finished[row])
            if self._caches(request):
                request.generated += tokens[row, :count].tolist()
                if ended:  # every token's keys and values are in the row, at its position
                    self.sampler.prefix_cache.add(np.asarray(request.prompts[0] + request.generated, np.int32),
                                                  jax.tree.map(lambda leaf, r=row: leaf[r:r + 1], self._batch.caches))
            if count or ended:
                wanted = request.sampling.top_logprobs
                alternatives = [list(zip(ids[:wanted].tolist(), values[:wanted].tolist(), strict=True))
                                for ids, values in zip(top_ids[row, :count], top_values[row, :count], strict=True)]
                request.deliver(StreamDelta(request.rows.index(row), tokens[row, :count].tolist(),
                                            logprobs[row, :count].tolist(),
                                            ("stop" if stopped[row] else "length") if ended else None,
                                            alternatives=alternatives if wanted else None,
                                            weight_version=request.weight_version))
            if ended:
                self._owners[row] = None
                self._params.active[row] = False
                request.rows = [-1 if r == row else r for r in request.rows]
                if all(r < 0 for r in request.rows):
                    self._active.remove(request)
                    request.deliver(_END)

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            requests = self._active + list(self._waiting)
            self._active, self._waiting = [], deque()
        for request in requests:
            request.deliver(error)
        self._batch, self._params, self._owners = None, None, []
