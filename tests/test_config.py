"""Typed stage configs read from ConfigDicts: every field checked on entry, named when wrong."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
from ml_collections import ConfigDict

from orchard.config import ConfigError, changed_fields, fingerprint, flatten, from_config, to_dict


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    name: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class Outer:
    steps: int
    sources: tuple[str, ...] = ("x",)
    inner: Inner = field(default_factory=Inner)
    path: str | None = None


def test_a_config_block_becomes_a_frozen_typed_config():
    block = ConfigDict({"steps": 3, "sources": ("p", "q"), "inner": {"rate": 1, "name": "b"}})
    config = from_config(Outer, block)
    assert config == Outer(3, ("p", "q"), Inner(1.0, "b"))
    assert isinstance(config.inner.rate, float) and from_config(Outer, {"steps": 1}).inner == Inner()
    with pytest.raises(AttributeError):
        config.steps = 4  # frozen: stages never write into their config
    assert to_dict(config) == {"steps": 3, "sources": ["p", "q"], "inner": {"rate": 1.0, "name": "b"}, "path": None}


@pytest.mark.parametrize(("block", "message"), [
    ({"steps": 1, "step": 2}, "outer: unknown field(s) step"),
    ({}, "steps: missing"),
    ({"steps": "3"}, "steps: expected an integer, got '3'"),
    ({"steps": True}, "steps: expected an integer"),
    ({"steps": 1, "sources": "p,q"}, "sources: expected a list, got 'p,q' (write a list, not a comma-separated"),
    ({"steps": 1, "inner": {"name": "c"}}, "inner.name: 'c' is not one of 'a', 'b'"),
    ({"steps": 1, "inner": {"rate": "fast"}}, "inner.rate: expected a number"),
    ({"steps": 1, "inner": 3}, "inner: expected a block of fields"),
    ({"steps": 1, "sources": ["p", 2]}, r"sources\[1\]: expected str"),
])
def test_a_field_that_does_not_fit_is_named(block, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)") if "[" not in message
                       else message):
        from_config(Outer, block, "outer" if "unknown" in message else "")


def test_fingerprints_and_changed_fields():
    a, b = Outer(3), Outer(3, inner=Inner(0.7))
    assert fingerprint(a) == fingerprint(Outer(3)) and fingerprint(a) != fingerprint(b)
    assert fingerprint({"x": 1, "y": [1, 2]}) == fingerprint({"y": (1, 2), "x": 1})  # key order and tuples: same
    assert flatten(a)["inner.rate"] == 0.5
    assert changed_fields(a, b) == ["inner.rate: 0.5 -> 0.7"]
    assert changed_fields({"a": 1}, {"b": 2}) == ["a: 1 -> (none)", "b: (none) -> 2"]
    with pytest.raises(TypeError, match="JSON values"):
        to_dict(object())
