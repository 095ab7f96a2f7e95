"""Chat formats: conversations rendered incrementally into token ids, each with its source.

A :class:`Rendered` conversation only grows: appending a turn tokenises that turn alone, so the
ids of earlier turns never change, and every id carries a :class:`Source`. Loss masks come from the
sources: only what the assistant produced (its content and its end-of-turn token) is trained on.

Departure from HF ``apply_chat_template``, which renders one string and tokenises it whole: here a
turn's header (``assistant\\n``) and its content are tokenised separately, which is the boundary
the model sees when it generates after the header. The two agree except when content starts
with whitespace that BPE would merge across that boundary. Special tokens are inserted by id and
never recognised inside text, so content cannot forge a turn.

Generated text is parsed into reasoning (``<think>...</think>``), content and tool calls
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``). A malformed tool call is reported in
``errors``; parsing never raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from orchard.data.tokenizer import Tokenizer

Role = Literal["system", "user", "assistant", "tool"]


class Source(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    TEMPLATE = "template"  # structure the model is given: turn headers, separators


@dataclass
class Rendered:
    token_ids: list[int] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)

    def extend(self, ids: list[int], source: Source) -> None:
        self.token_ids.extend(ids)
        self.sources.extend([source] * len(ids))

    def loss_mask(self) -> list[bool]:
        return [source is Source.ASSISTANT for source in self.sources]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedAssistant:
    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_assistant(text: str) -> ParsedAssistant:
    """Split generated text into reasoning, content and tool calls; never raises."""
    reasoning = None
    if match := _THINK.match(text):
        reasoning, text = match.group(1).strip(), text[match.end():]
    calls, errors = [], []
    for match in _TOOL_CALL.finditer(text):
        body = match.group(1).strip()
        if not match.group(0).endswith("</tool_call>"):
            errors.append("unterminated <tool_call>")
            continue
        try:
            call = json.loads(body)
            name, arguments = call["name"], call.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be a string and arguments an object")
            calls.append(ToolCall(name, arguments))
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"malformed tool call {body[:200]!r}: {exc}")
    content = _TOOL_CALL.sub("", text).strip()
    return ParsedAssistant(content=content, reasoning=reasoning, tool_calls=calls, errors=errors)


class ChatMLFormat:
    """ChatML (``<|im_start|>role\\ncontent<|im_end|>\\n``), as SmolLM2 and Qwen use it.

    ``default_system`` is inserted when a conversation does not start with a system turn, as
    SmolLM2's template does.
    """

    def __init__(self, tokenizer: Tokenizer, default_system: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.default_system = default_system
        self.im_start = tokenizer.token_id("<|im_start|>")
        self.im_end = tokenizer.token_id("<|im_end|>")
        self.newline = tokenizer.encode("\n")

    def append(self, rendered: Rendered, role: Role, content: str) -> Rendered:
        """Add one turn to ``rendered`` (in place) and return it."""
        if not rendered.token_ids and role != "system" and self.default_system is not None:
            self.append(rendered, "system", self.default_system)
        source = Source(role)
        rendered.extend([self.im_start], Source.TEMPLATE)
        rendered.extend(self.tokenizer.encode(f"{role}\n"), Source.TEMPLATE)
        rendered.extend(self.tokenizer.encode(content), source)
        rendered.extend([self.im_end], source)  # the assistant learns to end its turn
        rendered.extend(self.newline, Source.TEMPLATE)
        return rendered

    def generation_prompt(self, rendered: Rendered) -> Rendered:
        """Open an assistant turn for the model to complete (in place)."""
        rendered.extend([self.im_start], Source.TEMPLATE)
        rendered.extend(self.tokenizer.encode("assistant\n"), Source.TEMPLATE)
        return rendered

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> Rendered:
        rendered = Rendered()
        for message in messages:
            self.append(rendered, message["role"], message["content"])
        return self.generation_prompt(rendered) if add_generation_prompt else rendered


SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_format(tokenizer: Tokenizer) -> ChatMLFormat:
    """SmolLM2-Instruct's template: ChatML with its default system prompt."""
    return ChatMLFormat(tokenizer, default_system=SMOLLM2_DEFAULT_SYSTEM)
