"""Stock levels and prices. Money is integer cents throughout."""

from __future__ import annotations

from dataclasses import dataclass

# (minimum quantity, discount in percent), from the largest tier down.
BULK_TIERS = ((100, 15), (50, 10), (10, 5))


class UnknownItem(KeyError):
    pass


class InsufficientStock(Exception):
    def __init__(self, sku: str, wanted: int, available: int) -> None:
        super().__init__(f"{sku}: wanted {wanted}, only {available} in stock")
        self.sku, self.wanted, self.available = sku, wanted, available


@dataclass
class Item:
    sku: str
    name: str
    unit_price: int  # cents
    quantity: int = 0
    reorder_level: int = 0


def bulk_price(unit_price: int, quantity: int) -> int:
    """Price of ``quantity`` units after the bulk discount, rounded half up to a cent."""
    if quantity < 0:
        raise ValueError("quantity must not be negative")
    gross = unit_price * quantity
    for minimum, percent in BULK_TIERS:
        if quantity >= minimum:
            return (gross * (100 - percent) + 50) // 100
    return gross


class Inventory:
    def __init__(self) -> None:
        self._items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        if item.sku in self._items:
            raise ValueError(f"duplicate sku {item.sku!r}")
        if item.unit_price < 0 or item.quantity < 0:
            raise ValueError("price and quantity must not be negative")
        self._items[item.sku] = item

    def item(self, sku: str) -> Item:
        try:
            return self._items[sku]
        except KeyError:
            raise UnknownItem(sku) from None

    def receive(self, sku: str, quantity: int) -> int:
        """Add delivered stock; returns the new quantity."""
        if quantity <= 0:
            raise ValueError("a delivery must have a positive quantity")
        item = self.item(sku)
        item.quantity += quantity
        return item.quantity

    def ship(self, sku: str, quantity: int) -> int:
        """Remove shipped stock, never below zero; returns the price charged."""
        if quantity <= 0:
            raise ValueError("a shipment must have a positive quantity")
        item = self.item(sku)
        if quantity > item.quantity:
            raise InsufficientStock(sku, quantity, item.quantity)
        item.quantity -= quantity
        return bulk_price(item.unit_price, quantity)

    def to_reorder(self) -> list[str]:
        """SKUs at or below their reorder level, the emptiest first (ties by sku)."""
        low = [item for item in self._items.values() if item.quantity <= item.reorder_level]
        low.sort(key=lambda item: (item.quantity - item.reorder_level, item.sku))
        return [item.sku for item in low]

    def total_value(self) -> int:
        """The value of all stock at unit prices (no bulk discount)."""
        return sum(item.unit_price * item.quantity for item in self._items.values())

    def search(self, text: str) -> list[str]:
        """SKUs whose name contains ``text``, case-insensitively, sorted."""
        needle = text.lower()
        return sorted(item.sku for item in self._items.values() if needle in item.name.lower())
