"""A least-recently-used cache: a dict for lookups, a doubly linked list for recency order."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class _Node:
    __slots__ = ("key", "newer", "older", "value")

    def __init__(self, key: Hashable, value: Any) -> None:
        self.key, self.value = key, value
        self.newer: _Node | None = None
        self.older: _Node | None = None


class LRUCache:
    """At most ``capacity`` entries; adding one more evicts the least recently used.

    ``get`` and ``put`` make an entry the most recently used; ``peek`` and ``in`` do not.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._nodes: dict[Hashable, _Node] = {}
        self._newest: _Node | None = None
        self._oldest: _Node | None = None
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._nodes

    def _unlink(self, node: _Node) -> None:
        if node.newer is not None:
            node.newer.older = node.older
        else:
            self._newest = node.older
        if node.older is not None:
            node.older.newer = node.newer
        else:
            self._oldest = node.newer
        node.newer = node.older = None

    def _push_newest(self, node: _Node) -> None:
        node.older = self._newest
        node.newer = None
        if self._newest is not None:
            self._newest.newer = node
        self._newest = node
        if self._oldest is None:
            self._oldest = node

    def get(self, key: Hashable, default: Any = None) -> Any:
        node = self._nodes.get(key)
        if node is None:
            self.misses += 1
            return default
        self.hits += 1
        self._unlink(node)
        self._push_newest(node)
        return node.value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        node = self._nodes.get(key)
        return default if node is None else node.value

    def put(self, key: Hashable, value: Any) -> None:
        node = self._nodes.get(key)
        if node is not None:
            node.value = value
            self._unlink(node)
            self._push_newest(node)
            return
        if len(self._nodes) >= self.capacity:
            oldest = self._oldest
            self._unlink(oldest)
            del self._nodes[oldest.key]
            self.evictions += 1
        node = _Node(key, value)
        self._nodes[key] = node
        self._push_newest(node)

    def pop(self, key: Hashable) -> Any:
        node = self._nodes.pop(key)
        self._unlink(node)
        return node.value

    def keys(self) -> list[Hashable]:
        """Keys from the most to the least recently used."""
        out = []
        node = self._newest
        while node is not None:
            out.append(node.key)
            node = node.older
        return out

    def resize(self, capacity: int) -> None:
        """Change the capacity, evicting the least recently used entries that no longer fit."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        while len(self._nodes) > capacity:
            oldest = self._oldest
            self._unlink(oldest)
            del self._nodes[oldest.key]
            self.evictions += 1

    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0
