"""An LRU cache and a small inventory."""

from stockroom.inventory import InsufficientStock, Inventory, Item, UnknownItem, bulk_price
from stockroom.lru import LRUCache

__all__ = ["InsufficientStock", "Inventory", "Item", "LRUCache", "UnknownItem", "bulk_price"]
