"""The sampler's prefix cache: the same tokens and logprobs as without it, on multi-turn conversations, with a
copy head, across evictions and weight updates, in the sampler and in the continuous batcher (what ``orchard
serve`` decodes with); only what a prompt adds since an entry is prefilled; batches pass it by."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest
from flax import nnx

from orchard.models import ModelConfig, Transformer
from orchard.rollout.batching import ContinuousBatcher
from orchard.rollout.prefix_cache import PrefixCache, common_prefix
from orchard.rollout.sampler import MIN_REUSE, PREFIX_CHUNK, Sampler, collect
from orchard.rollout.types import SamplingParams

VOCAB = 300
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(5,))


def tiny(copy_head: int = 0, seed: int = 0) -> Transformer:
    extra = {"copy_head": copy_head} if copy_head else {}
    cfg = ModelConfig.tiny(VOCAB, num_layers=2, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
                           head_dim=8, max_position_embeddings=2048, dtype="float32", **extra)
    return Transformer(cfg, rngs=nnx.Rngs(seed))


def words(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(6, VOCAB, n).tolist()


def same(a, b) -> None:
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_a_conversation_samples_the_same_with_the_cache_and_prefills_only_what_each_turn_adds():
    model = tiny(copy_head=16)  # the copy head keeps a cache of its own (its keys, the tokens they follow)
    plain, cached = Sampler(model), Sampler(model, prefix_cache_bytes=64 << 20)
    rng = np.random.default_rng(0)
    prompt, reused_before = words(rng, 120), 0
    for turn in range(2):
        without, [with_cache] = plain.generate([prompt], GREEDY)[0], cached.generate([prompt], GREEDY)
        same(without, with_cache)
        stats = cached.prefix_cache.stats
        if turn:  # all but the tool's reply (and under a step's worth of tokens) came from the last turn's entry
            assert stats.reused_tokens - reused_before > len(prompt) - 40 - PREFIX_CHUNK
        reused_before = stats.reused_tokens
        prompt = prompt + list(without.token_ids) + words(rng, 40)  # the completion, then the tool's reply
    assert stats.lookups == 2 and stats.hits == 1
    assert len(cached.prefix_cache.entries) == 1  # the second turn's entry replaced the one it extends


def test_a_group_prefills_its_shared_prompt_once():
    model = tiny()
    plain, cached = Sampler(model), Sampler(model, prefix_cache_bytes=64 << 20)
    prompt = words(np.random.default_rng(1), 120)
    for seed in range(4):
        params = SamplingParams(max_tokens=24, temperature=1.0, seed=seed)
        same(plain.generate([prompt], params)[0], cached.generate([prompt], params)[0])
    stats = cached.prefix_cache.stats
    assert stats.hits == 3 and stats.reused_tokens == 3 * (120 - PREFIX_CHUNK)  # the last step's tokens run again
    assert len(cached.prefix_cache.entries) == 4  # four completions of one prompt: none extends another


def test_a_weight_update_drops_every_entry():
    old, new = tiny(seed=0), tiny(seed=1)
    cached = Sampler(old, prefix_cache_bytes=64 << 20)
    prompt = words(np.random.default_rng(2), 120)
    cached.generate([prompt], GREEDY)
    assert cached.prefix_cache.entries
    cached.update(nnx.split(new, nnx.Param)[1])
    assert not cached.prefix_cache.entries
    same(cached.generate([prompt], GREEDY)[0], Sampler(new).generate([prompt], GREEDY)[0])


def test_entries_past_the_budget_are_evicted_least_recently_used_first():
    model = tiny()
    rng = np.random.default_rng(3)
    prompts = [words(rng, 120) for _ in range(3)]
    probe = Sampler(model, prefix_cache_bytes=1 << 30)
    probe.generate([prompts[0]], GREEDY)
    entry_bytes = next(iter(probe.prefix_cache.entries.values())).nbytes
    cached = Sampler(model, prefix_cache_bytes=2 * entry_bytes)  # room for two entries of this shape
    for prompt in prompts:
        cached.generate([prompt], GREEDY)
    assert len(cached.prefix_cache.entries) == 2 and cached.prefix_cache.nbytes <= 2 * entry_bytes
    before = cached.prefix_cache.stats.hits
    same(cached.generate([prompts[0]], GREEDY)[0], Sampler(model).generate([prompts[0]], GREEDY)[0])
    assert cached.prefix_cache.stats.hits == before  # the first prompt's entry was the one evicted
    cached.generate([prompts[2]], GREEDY)
    assert cached.prefix_cache.stats.hits == before + 1


def test_batches_short_matches_and_closed_streams():
    model = tiny()
    cached = Sampler(model, prefix_cache_bytes=64 << 20)
    rng = np.random.default_rng(4)
    a, b = words(rng, 120), words(rng, 120)
    cached.generate([a, b], GREEDY)  # a batch: neither read nor filled
    assert cached.prefix_cache.stats.lookups == 0 and not cached.prefix_cache.entries
    cached.generate([a], GREEDY)
    short = a[:MIN_REUSE - 1] + words(rng, 120 - MIN_REUSE + 1)  # shares too little to be worth a second program
    same(cached.generate([short], GREEDY)[0], Sampler(model).generate([short], GREEDY)[0])
    assert cached.prefix_cache.stats.hits == 0
    stream = cached.stream([b], SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=()))
    first = next(stream)
    stream.close()  # a caller that stops reading (a stop string met) still leaves what was decoded
    kept = max(cached.prefix_cache.entries.values(), key=lambda e: common_prefix(e.tokens, np.array(b)))
    assert kept.tokens.tolist() == b + first.token_ids


def test_the_cache_finds_the_longest_match_and_refuses_a_bad_budget():
    cache = PrefixCache(1 << 20)
    leaf = jax.numpy.zeros((1, 8, 2))
    cache.add(np.array([1, 2, 3]), [leaf])
    cache.add(np.array([1, 2, 9, 9]), [leaf])
    entry, shared = cache.longest(np.array([1, 2, 9, 9, 4]))
    assert shared == 4 and entry.tokens.tolist() == [1, 2, 9, 9]
    cache.add(np.array([1, 2, 3, 4, 5]), [leaf])  # extends the first entry, which goes
    assert sorted(e.tokens.tolist() for e in cache.entries.values()) == [[1, 2, 3, 4, 5], [1, 2, 9, 9]]
    cache.add(np.arange(5), [jax.numpy.zeros((1, 1 << 20))])  # larger than the whole budget: not kept
    assert len(cache.entries) == 2
    with pytest.raises(ValueError, match="positive byte budget"):
        PrefixCache(0)


def test_the_continuous_batcher_reads_and_fills_the_cache_for_interleaved_conversations():
    model = tiny()
    rng = np.random.default_rng(5)
    conversations = [words(rng, 120), words(rng, 120)]
    plain = ContinuousBatcher(Sampler(model), max_rows=4, chunk_steps=4)
    cached_sampler = Sampler(model, prefix_cache_bytes=64 << 20)
    cached = ContinuousBatcher(cached_sampler, max_rows=4, chunk_steps=4)
    try:
        for _ in range(2):  # two turns of two conversations, decoded side by side
            replies = []
            for batcher in (plain, cached):
                with ThreadPoolExecutor(2) as pool:
                    replies.append(list(pool.map(
                        lambda prompt, b=batcher: collect(b.stream([prompt], GREEDY), 1)[0], conversations)))
            for without, with_cache in zip(*replies, strict=True):
                same(without, with_cache)
            conversations = [c + list(r.token_ids) + words(rng, 30) for c, r in zip(conversations, replies[0],
                                                                                   strict=True)]
        stats = cached_sampler.prefix_cache.stats
        assert stats.lookups == 4 and stats.hits == 2 and stats.reused_tokens >= 120 - PREFIX_CHUNK
    finally:
        plain.close()
        cached.close()
