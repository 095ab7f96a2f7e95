"""Continuous batching against the one-request-at-a-time sampler, on real fixture models (HF-checked
in ``test_sampler.py``): the same tokens and logprobs whatever shares the batch, rows that join and
leave between steps, cancellation, weight updates that wait, and clear refusals."""

from __future__ import annotations

import os
import threading
from dataclasses import replace

import jax
import numpy as np
import pytest
from flax import nnx

from orchard.models import from_pretrained
from orchard.rollout.batching import ContinuousBatcher, _decode_chunk
from orchard.rollout.sampler import Sampler, collect
from orchard.rollout.types import SamplingParams

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return from_pretrained(os.path.join(FIXTURES, "qwen3"), dtype="float32")


@pytest.fixture
def batcher(model):
    batcher = ContinuousBatcher(Sampler(model), max_rows=8, chunk_steps=2)
    yield batcher
    batcher.close()


def prompts(model, lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, model.cfg.vocab_size, size=n).tolist() for n in lengths]


def run_concurrently(batcher: ContinuousBatcher, requests: list[tuple[list[list[int]], SamplingParams]]):
    results: list = [None] * len(requests)

    def one(index: int) -> None:
        rows, sampling = requests[index]
        results[index] = collect(batcher.stream(rows, sampling), len(rows))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_concurrent_requests_get_what_each_would_get_alone(model, batcher):
    alone = Sampler(model)
    requests = prompts(model, (3, 17, 40, 5, 9, 26))
    expected = [alone.generate([p], GREEDY)[0] for p in requests]
    got = run_concurrently(batcher, [([p], GREEDY) for p in requests])
    for want, (have,) in zip(expected, got, strict=True):
        assert have.token_ids == want.token_ids and have.finish_reason == "length"
        np.testing.assert_allclose(have.logprobs, want.logprobs, atol=1e-5)
    assert batcher.stats["row_steps"] > batcher.stats["steps"]  # rows shared decode steps
    assert batcher.active_rows == 0


def test_a_request_joins_a_running_batch_and_leaves_it_first(model, batcher):
    long_prompt, short_prompt = prompts(model, (8, 5))
    long_stream = batcher.stream([long_prompt], SamplingParams(max_tokens=50, temperature=0.0))
    first = next(long_stream)  # the long request is decoding
    short = collect(batcher.stream([short_prompt], SamplingParams(max_tokens=4, temperature=0.0)), 1)[0]
    assert batcher.active_rows == 1  # the short one left; the long one still runs
    rest = list(long_stream)
    assert len(first.token_ids) + sum(len(d.token_ids) for d in rest) == 50
    assert short.token_ids == Sampler(model).generate([short_prompt], SamplingParams(max_tokens=4, temperature=0.0))[0].token_ids
    assert batcher.stats["row_steps"] > batcher.stats["steps"]


def test_sampled_tokens_do_not_depend_on_what_shares_the_batch(model, batcher):
    hot = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    mine = prompts(model, (6,))[0]
    alone = collect(batcher.stream([mine, mine], hot), 2)
    crowded = run_concurrently(batcher, [([mine, mine], hot)] + [([p], hot) for p in prompts(model, (4, 11, 20), 1)])
    assert [c.token_ids for c in crowded[0]] == [c.token_ids for c in alone]
    assert alone[0].token_ids != alone[1].token_ids  # the request's two rows sample independently
    other_seed = collect(batcher.stream([mine], SamplingParams(max_tokens=10, temperature=1.0, seed=8)), 1)[0]
    assert other_seed.token_ids != alone[0].token_ids


def test_short_requests_share_one_capacity_so_the_decode_loop_compiles_once(model, batcher):
    """Every request that fits ``min_slots`` (here the fixture's whole context of 64) decodes in a batch of the
    same shape, so a server answering short requests of many lengths compiles its decode loop once, not once
    per length bucket."""
    before = _decode_chunk._cache_size()
    for length, max_tokens in ((3, 10), (20, 20), (9, 30), (30, 30)):
        collect(batcher.stream(prompts(model, (length,)), replace(GREEDY, max_tokens=max_tokens)), 1)
    assert _decode_chunk._cache_size() - before <= 1


def test_stop_tokens_alternatives_and_each_rows_own_budget(model, batcher):
    mine, other = prompts(model, (7, 9))
    greedy = Sampler(model).generate([mine], SamplingParams(max_tokens=6, temperature=0.0))[0].token_ids
    stop_at = SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(greedy[2],), top_logprobs=3)
    stopped, plain = run_concurrently(batcher, [([mine], stop_at), ([other], SamplingParams(max_tokens=5, temperature=0))])
    assert stopped[0].token_ids == greedy[: greedy.index(greedy[2]) + 1] and stopped[0].finish_reason == "stop"
    assert all(len(step) == 3 and step[0][0] == token for step, token in zip(stopped[0].alternatives,
                                                                             stopped[0].token_ids, strict=True))
    assert len(plain[0].token_ids) == 5 and plain[0].alternatives is None and plain[0].finish_reason == "length"


def test_closing_a_stream_frees_its_rows(model, batcher):
    stream = batcher.stream(prompts(model, (5, 5, 5)), SamplingParams(max_tokens=50, temperature=0.0))
    next(stream)
    assert batcher.active_rows == 3
    stream.close()
    after = collect(batcher.stream(prompts(model, (4,)), GREEDY), 1)[0]  # the batch goes on serving
    assert len(after.token_ids) == GREEDY.max_tokens and batcher.active_rows == 0


def test_a_weight_update_waits_for_the_rows_in_flight(model, batcher):
    mine = prompts(model, (6,))[0]
    before = collect(batcher.stream([mine], GREEDY), 1)[0]
    stream = batcher.stream([mine], SamplingParams(max_tokens=40, temperature=0.0))
    first = next(stream)
    changed = jax.tree.map(lambda x: x * 1.5 if x.dtype.kind == "f" else x, nnx.state(model))  # new arrays
    updater = threading.Thread(target=batcher.update, args=(changed, 1))
    updater.start()
    in_flight = [first, *stream]  # finishes on the old weights
    updater.join(timeout=60)
    assert not updater.is_alive() and batcher.weight_version == 1
    assert {d.weight_version for d in in_flight} == {0}
    old_tokens = [t for d in in_flight for t in d.token_ids]
    assert old_tokens[:GREEDY.max_tokens] == before.token_ids  # no step of it used the new weights
    after = collect(batcher.stream([mine], GREEDY), 1)[0]
    assert after.weight_version == 1 and after.token_ids != before.token_ids


def test_bad_requests_are_clear_errors(model, batcher):
    with pytest.raises(ValueError, match="at most 8 sequences"):
        batcher.submit(prompts(model, (3,) * 9), GREEDY, lambda _: None)
    with pytest.raises(ValueError, match="stop token ids"):
        batcher.submit(prompts(model, (3,)), SamplingParams(max_tokens=4, stop_token_ids=tuple(range(17))), lambda _: None)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        batcher.submit(prompts(model, (3,)), SamplingParams(max_tokens=model.cfg.max_position_embeddings),
                       lambda _: None)
    with pytest.raises(ValueError, match="at least one token"):
        batcher.submit([[]], GREEDY, lambda _: None)
    with pytest.raises(ValueError, match="min_slots must be at least 1"):
        ContinuousBatcher(Sampler(model), min_slots=0)
