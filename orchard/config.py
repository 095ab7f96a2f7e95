"""Typed stage configs from ``ml_collections`` configs, and what is written about them.

Config files (``configs/<name>.py``) stay big_vision style: a ``get_config(arg)`` building a
``ConfigDict`` that the command line can override. Each stage of a recipe takes a typed, frozen
dataclass of its own, built from its block of that config by :func:`from_config`, which checks it
on entry: an unknown field, a missing one, a value of the wrong type, a string where a list
belongs ("a,b" is not a list), or a value outside a ``Literal`` is a :class:`ConfigError` naming
the field. Stages never write into their config.

:func:`to_dict` turns a config (a dataclass, a ``ConfigDict``, or plain values) into JSON values,
and :func:`fingerprint` hashes that, so a workdir can record what made it
(:mod:`orchard.workdir`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A config block does not fit the stage config it is read into; the message names the field."""


def from_config(cls: type[T], block: Any, where: str = "") -> T:
    """``cls`` (a dataclass) from a mapping or ``ConfigDict`` (see the module docstring)."""
    if isinstance(block, cls):
        return block
    values = _mapping(block, where or cls.__name__)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown field(s) {', '.join(unknown)}; "
                          f"{cls.__name__} has {', '.join(fields)}")
    kwargs = {}
    for name, field in fields.items():
        path = f"{where}.{name}" if where else name
        if name not in values:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{path}: missing (no default)")
            continue
        kwargs[name] = _convert(hints[name], values[name], path)
    return cls(**kwargs)


def _mapping(block: Any, where: str) -> dict[str, Any]:
    if hasattr(block, "to_dict") and callable(block.to_dict):  # ConfigDict, FrozenConfigDict
        block = block.to_dict()
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where}: expected a block of fields, got {type(block).__name__}")
    return dict(block)


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} fits none of {hint}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(hint):
        return from_config(hint, value, path)
    if origin in (list, tuple) or hint in (list, tuple):
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {value!r}" +
                              (" (write a list, not a comma-separated string)" if isinstance(value, str) else ""))
        item = args[0] if args else Any
        items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin or hint) is tuple else items
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return dict(_mapping(value, path))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise ConfigError(f"{path}: expected {hint.__name__}, got {value!r}")
        return value
    return value


def to_dict(value: Any) -> Any:
    """JSON values of a config: dataclasses and ``ConfigDict``\\ s become dicts, tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return to_dict(value.to_dict())
    if isinstance(value, Mapping):
        return {str(k): to_dict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_dict(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"a config holds JSON values, not {type(value).__name__}: {value!r}")


def fingerprint(value: Any) -> str:
    """A short hash of a config's JSON values (equal configs, equal hashes)."""
    canonical = json.dumps(to_dict(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    value = to_dict(value)
    if not isinstance(value, dict) or not value:
        return {prefix: value} if prefix else {}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(flatten(item, f"{prefix}.{key}" if prefix else key))
    return out


def changed_fields(old: Any, new: Any) -> list[str]:
    """``"field: old -> new"`` for every field that differs between two configs."""
    before, after = flatten(old), flatten(new)

    def shown(values: dict[str, Any], key: str) -> str:
        return repr(values[key]) if key in values else "(none)"

    return [f"{key}: {shown(before, key)} -> {shown(after, key)}" for key in sorted(set(before) | set(after))
            if key not in before or key not in after or before[key] != after[key]]


def missing_fields(cls: type, block: Any, where: str = "") -> list[str]:
    """The fields of ``cls`` (a dataclass, its nested dataclass fields included) that ``block`` leaves to the
    dataclass defaults: what a run would take from the code rather than from its config file."""
    values = _mapping(block, where or cls.__name__)
    hints = get_type_hints(cls)
    missing = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        path = f"{where}.{field.name}" if where else field.name
        if field.name not in values:
            missing.append(path)
            continue
        nested = [t for t in (hints[field.name], *get_args(hints[field.name])) if dataclasses.is_dataclass(t)]
        if nested and isinstance(values[field.name], Mapping):
            missing += missing_fields(nested[0], values[field.name], path)
    return missing
