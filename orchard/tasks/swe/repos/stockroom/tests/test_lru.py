import pytest
from stockroom import LRUCache


def test_get_and_put():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing") is None
    assert cache.get("missing", 0) == 0


def test_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)
    assert "b" not in cache
    assert cache.keys() == ["c", "a"]
    assert cache.evictions == 1


def test_put_existing_updates_and_refreshes():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.peek("a") == 10
    assert "b" not in cache
    assert len(cache) == 2


def test_peek_does_not_refresh():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1
    cache.put("c", 3)
    assert "a" not in cache


def test_pop():
    cache = LRUCache(3)
    for key in "abc":
        cache.put(key, key.upper())
    assert cache.pop("b") == "B"
    assert cache.keys() == ["c", "a"]
    with pytest.raises(KeyError):
        cache.pop("b")


def test_capacity_one():
    cache = LRUCache(1)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.keys() == ["b"]


def test_resize_evicts_oldest():
    cache = LRUCache(4)
    for key in "abcd":
        cache.put(key, 0)
    cache.resize(2)
    assert cache.keys() == ["d", "c"]
    assert cache.evictions == 2


def test_invalid_capacity():
    with pytest.raises(ValueError, match="capacity"):
        LRUCache(0)
    with pytest.raises(ValueError, match="capacity"):
        LRUCache(3).resize(0)


def test_stats():
    cache = LRUCache(2)
    assert cache.hit_rate() == 0.0
    cache.put("a", 1)
    cache.get("a")
    cache.get("a")
    cache.get("b")
    assert (cache.hits, cache.misses) == (2, 1)
    assert cache.hit_rate() == pytest.approx(2 / 3)
