"""The sampler's prefix cache: the keys and values of recent generations, found again by their tokens.

An agent's turn re-sends the whole conversation: its prompt is the last turn's prompt, the completion the
model sampled, and the tool's reply. Without a cache every turn prefills all of it again, so an episode of
five turns prefills its first turn five times. :class:`~orchard.rollout.sampler.Sampler` keeps, after each
single-prompt generation, the keys and values of its prompt and completion (every cache leaf ``[1, L,
...]``, indexed by position); a later prompt that starts with an entry's tokens takes those positions from
the entry and runs only the rest through the model. A GRPO group's samples share their prompt: the first
prefills it, the others reuse it.

Entries are whole sequences, found by the longest common prefix of their tokens (a linear scan: the cache
holds a few dozen), evicted least recently used under a byte budget, and all dropped when the weights change
(keys computed under old weights are not the new model's). Departures from vLLM's and SGLang's caches, which
share fixed-size blocks by reference in a hash table or radix tree: entries here are copied, not shared, so
two episodes with one system prompt hold it twice; and only single-prompt calls read or fill it (what the RL
loop and evaluation make, one turn at a time), not batches or prompts with images.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_PREFIX_CACHE_MB = 512  # orchard serve's, on by default as vLLM's prefix caching is


@dataclass(frozen=True)
class PrefixEntry:
    tokens: np.ndarray  # int32 [n]: the tokens whose keys and values the entry holds, by position
    caches: Any  # the model's cache pytree, every leaf [1, L >= n, ...] by position
    nbytes: int


@dataclass
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    prompt_tokens: int = 0  # of every lookup
    reused_tokens: int = 0  # of those, the ones taken from an entry instead of prefilled

    def to_dict(self) -> dict[str, float]:
        return {"lookups": self.lookups, "hits": self.hits, "hit_rate": self.hits / max(self.lookups, 1),
                "prompt_tokens": self.prompt_tokens, "reused_tokens": self.reused_tokens,
                "reused_share": self.reused_tokens / max(self.prompt_tokens, 1)}


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Entries of keys and values by their tokens, least recently used first out, within ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"a prefix cache needs a positive byte budget, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self.stats = PrefixStats()
        self._next_key = 0
        self._lock = threading.Lock()  # generations on several threads share it

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.entries.values())

    def longest(self, prompt: np.ndarray) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the most leading tokens with ``prompt``, and how many (0: none shares any).
        The entry becomes the most recently used."""
        best, best_key, shared = None, None, 0
        with self._lock:
            for key, entry in self.entries.items():
                if (n := common_prefix(entry.tokens, prompt)) > shared:
                    best, best_key, shared = entry, key, n
            if best_key is not None:
                self.entries.move_to_end(best_key)
        return best, shared

    def record(self, prompt_tokens: int, reused: int) -> None:
        """Count a lookup that prefilled ``prompt_tokens - reused`` of ``prompt_tokens``."""
        with self._lock:
            self.stats.lookups += 1
            self.stats.hits += reused > 0
            self.stats.prompt_tokens += prompt_tokens
            self.stats.reused_tokens += reused

    def add(self, tokens: np.ndarray, caches: Any) -> None:
        """Keep ``caches`` (by position) for ``tokens``, replacing entries it extends and evicting the least
        recently used ones past the budget; one larger than the whole budget is not kept."""
        import jax  # here, so that orchard serve's command line imports this module without JAX

        nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(caches))
        if nbytes > self.budget_bytes:
            return
        with self._lock:
            for key in [k for k, e in self.entries.items() if common_prefix(e.tokens, tokens) == len(e.tokens)]:
                del self.entries[key]  # the new entry holds all of it
            self.entries[self._next_key] = PrefixEntry(np.asarray(tokens, np.int32), caches, nbytes)
            self._next_key += 1
            while self.nbytes > self.budget_bytes:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry (the weights changed)."""
        with self._lock:
            self.entries.clear()
