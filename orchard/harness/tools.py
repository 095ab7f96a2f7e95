"""OpenAI tool calls as harnesses receive them: the checks every tool-calling harness applies.

A turn is rejected (a :class:`~orchard.harness.core.FormatError`, which the core counts) when a
call did not parse, there is no call, a tool is not defined, or the arguments break the tool's
schema (a missing required parameter, an unknown one, a wrong type, a value outside the enum).
"""

from __future__ import annotations

from typing import Any

from orchard.data.trajectory import Message, ToolCall
from orchard.harness.core import FormatError, Turn

_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                       "boolean": (bool,), "array": (list,), "object": (dict,)}


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    """Raise :class:`FormatError` unless ``arguments`` fit ``schema`` (a flat JSON-schema object:
    required keys, no unknown keys, types, enums, and integer items of arrays)."""
    properties = schema.get("properties", {})
    missing = [key for key in schema.get("required", []) if key not in arguments]
    if missing:
        raise FormatError(f"missing required parameter(s): {', '.join(missing)}")
    unknown = [key for key in arguments if key not in properties]
    if unknown:
        raise FormatError(f"unknown parameter(s): {', '.join(unknown)}; the parameters are: {', '.join(properties)}")
    for key, value in arguments.items():
        spec = properties[key]
        if not _typed(value, spec["type"]):
            raise FormatError(f"parameter `{key}` must be of type {spec['type']}, got {type(value).__name__}")
        if "enum" in spec and value not in spec["enum"]:
            raise FormatError(f"parameter `{key}` must be one of {', '.join(map(str, spec['enum']))}, got {value!r}")
        items = spec.get("items")
        if items is not None and not all(_typed(item, items["type"]) for item in value):
            raise FormatError(f"parameter `{key}` must be an array of {items['type']}s")


def _typed(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind != "boolean":  # JSON true is not a number
        return False
    return isinstance(value, _TYPES[kind])


def checked_calls(turn: Turn, tools: list[dict[str, Any]] | None, no_call: str) -> list[ToolCall]:
    """The turn's tool calls, each checked against its schema in ``tools`` (``None``: the tools are
    the episode's, checked where they run: only that calls parsed and exist); ``no_call`` is what
    the model is told when it called nothing."""
    if turn.errors:
        raise FormatError("ERROR: your tool call could not be parsed: " + "; ".join(turn.errors))
    calls = turn.message.tool_calls
    if not calls and "<tool_call>" in turn.message.content:  # a server that could not parse it left the text
        raise FormatError("ERROR: your tool call could not be parsed; write it as a JSON object with "
                          "\"name\" and \"arguments\" inside <tool_call></tool_call>.")
    if not calls:
        raise FormatError(no_call)
    if tools is None:
        return list(calls)
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    for call in calls:
        if call.name not in schemas:
            raise FormatError(f"ERROR: there is no tool named {call.name!r}. The tools are: "
                              f"{', '.join(schemas)}.")
        if not isinstance(call.arguments, dict):
            raise FormatError(f"ERROR: the arguments of {call.name} must be a JSON object, got {call.arguments!r}")
        try:
            check_arguments(schemas[call.name], call.arguments)
        except FormatError as exc:
            raise FormatError(f"ERROR: invalid arguments for {call.name}: {exc}") from None
    return list(calls)


def reject_calls(turn: Turn, error: FormatError) -> list[Message]:
    """The answer to a rejected turn: the error for each of its calls (every ``tool_call_id`` gets
    its response, as the OpenAI API requires), or as a user message when it called nothing."""
    calls = turn.message.tool_calls
    if not calls:
        return [Message(role="user", content=str(error))]
    note = f"{error}\nNone of the tool calls of your last message was run."
    return [Message(role="tool", content=note, tool_call_id=call.id) for call in calls]
