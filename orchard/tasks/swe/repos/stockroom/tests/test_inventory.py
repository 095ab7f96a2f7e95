import pytest
from stockroom import InsufficientStock, Inventory, Item, UnknownItem, bulk_price


@pytest.fixture
def inventory():
    inv = Inventory()
    inv.add(Item("BOLT", "Hex bolt M6", unit_price=25, quantity=200, reorder_level=50))
    inv.add(Item("NUT", "Hex nut M6", unit_price=10, quantity=40, reorder_level=50))
    inv.add(Item("WASHER", "Flat washer", unit_price=5, quantity=0, reorder_level=20))
    return inv


def test_bulk_price_tiers():
    assert bulk_price(100, 9) == 900
    assert bulk_price(100, 10) == 950
    assert bulk_price(100, 50) == 4500
    assert bulk_price(100, 100) == 8500


def test_bulk_price_rounds_half_up():
    assert bulk_price(3, 10) == 29  # 28.5 cents
    assert bulk_price(0, 12) == 0


def test_bulk_price_rejects_negative():
    with pytest.raises(ValueError):
        bulk_price(10, -1)


def test_receive(inventory):
    assert inventory.receive("NUT", 15) == 55
    with pytest.raises(ValueError, match="positive"):
        inventory.receive("NUT", 0)


def test_ship_charges_bulk_price(inventory):
    assert inventory.ship("BOLT", 10) == 238  # 250 cents less 5 percent
    assert inventory.item("BOLT").quantity == 190


def test_ship_everything(inventory):
    inventory.ship("NUT", 40)
    assert inventory.item("NUT").quantity == 0


def test_cannot_oversell(inventory):
    with pytest.raises(InsufficientStock) as error:
        inventory.ship("NUT", 41)
    assert (error.value.wanted, error.value.available) == (41, 40)
    assert inventory.item("NUT").quantity == 40


def test_unknown_item(inventory):
    with pytest.raises(UnknownItem):
        inventory.ship("SCREW", 1)


def test_duplicates_and_negative_values_rejected(inventory):
    with pytest.raises(ValueError, match="duplicate"):
        inventory.add(Item("NUT", "again", 1))
    with pytest.raises(ValueError, match="negative"):
        inventory.add(Item("X", "x", -1))


def test_to_reorder_emptiest_first(inventory):
    assert inventory.to_reorder() == ["WASHER", "NUT"]
    inventory.receive("NUT", 10)
    assert inventory.to_reorder() == ["WASHER", "NUT"]
    inventory.receive("NUT", 1)
    assert inventory.to_reorder() == ["WASHER"]


def test_total_value(inventory):
    assert inventory.total_value() == 200 * 25 + 40 * 10


def test_search(inventory):
    assert inventory.search("hex") == ["BOLT", "NUT"]
    assert inventory.search("WASH") == ["WASHER"]
    assert inventory.search("zzz") == []
