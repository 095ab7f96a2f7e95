"""Chat formats: conversations rendered incrementally into token ids, each with its source.

A :class:`Rendered` conversation only grows: appending a turn tokenises that turn alone, so the
ids of earlier turns never change, and every id carries a :class:`Source`. Loss masks come from the
sources: only what the assistant produced (its reasoning, content, tool calls and end-of-turn
token) is trained on.

Messages use the OpenAI shape: ``{"role", "content"}``, plus ``tool_calls`` and
``reasoning_content`` on assistant turns. Tools are OpenAI tool schemas. An assistant message with
``token_ids`` (what the policy sampled) is rendered from those ids, never from its text.

Departures from HF ``apply_chat_template``, which renders one string and tokenises it whole:

- A turn's header (``assistant\\n``) and its body are tokenised separately, which is the boundary
  the model sees when it generates after the header. The two agree except when a body starts with
  whitespace that BPE would merge across that boundary.
- Special tokens are inserted by id and never recognised inside text, so content cannot forge a
  turn.
- Qwen3: reasoning is kept on every assistant turn that has it. HF's template drops the reasoning
  of turns before the last user query and gives a final assistant turn without reasoning an empty
  ``<think>`` block; both would rewrite tokens the model already produced or saw, which training
  on sampled tokens cannot allow. Conversations without those two cases render identically.

Images (``Qwen3VLFormat``): a user or tool message's ``images`` (anything with ``width`` and ``height``
in pixels: :class:`~orchard.data.images.ImageRef`, or a dict) are rendered after its text (where
:class:`~orchard.data.trajectory.Message` keeps them, and where ``OpenAIChatPolicy`` sends them) as
``<|vision_start|>``, one ``<|image_pad|>`` per language-model token of the image at its processed
size, and ``<|vision_end|>``, all with the message's source; :attr:`Rendered.images` records where each
image's placeholders are, for the model to put the image's features there.

Generated text is parsed into reasoning (``<think>...</think>``), content and tool calls
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``). A malformed tool call is reported in
``errors``; parsing never raises.

:class:`ChatFormat` is the contract the policy, the SFT data step and the RL rows use; configs name
a format (``chat.format``) and :func:`make_chat_format` builds it: ``qwen3`` (and ``qwen3_no_think``),
``chatml``, ``smollm2``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import ToolCall

Message = dict[str, Any]


class Source(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    TEMPLATE = "template"  # structure the model is given: turn headers, separators


@dataclass(frozen=True)
class RenderedImage:
    """An image in a rendered conversation: its ``count`` placeholder ids start at ``start``."""

    start: int
    count: int
    image: Any  # what the message carried: an ImageRef, or a dict with width and height


@dataclass
class Rendered:
    token_ids: list[int] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    open_tool_turn: bool = False  # Qwen3 groups consecutive tool results into one turn
    spans: list[tuple[str, int, int]] = field(default_factory=list)  # (role, first id, end) per appended message
    # Per assistant turn rendered from sampled ids, in order: where its prompt ends (its first sampled id).
    prompt_ends: list[int] = field(default_factory=list)
    images: list[RenderedImage] = field(default_factory=list)

    def extend(self, ids: list[int], source: Source) -> None:
        self.token_ids.extend(ids)
        self.sources.extend([source] * len(ids))

    def copy(self) -> Rendered:
        return Rendered(list(self.token_ids), list(self.sources), self.open_tool_turn, list(self.spans),
                        list(self.prompt_ends), list(self.images))

    def loss_mask(self) -> list[bool]:
        return [source is Source.ASSISTANT for source in self.sources]


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
            calls.append(ToolCall(name=name, arguments=arguments))
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"malformed tool call {body[:200]!r}: {exc}")
    content = _TOOL_CALL.sub("", text).strip()
    return ParsedAssistant(content=content, reasoning=reasoning, tool_calls=calls, errors=errors)


class ChatFormat(Protocol):
    """Conversations to token ids, incrementally, each id with its :class:`Source`; and back."""

    tokenizer: Tokenizer

    @property
    def end_of_turn_ids(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn: generation stops at them."""
        ...

    def render(self, messages: list[Message], tools: list[dict] | None = None,
               add_generation_prompt: bool = False) -> Rendered:
        """A whole conversation (with an open assistant turn if ``add_generation_prompt``)."""
        ...

    def start(self, tools: list[dict] | None = None, system: Message | None = None) -> Rendered:
        """A new conversation that offers ``tools``; ``system`` is merged into the tools' system turn."""
        ...

    def append(self, rendered: Rendered, message: Message) -> Rendered:
        """Add one turn to ``rendered`` (in place) and return it."""
        ...

    def generation_prompt(self, rendered: Rendered) -> Rendered:
        """Open an assistant turn for the model to complete (in place)."""
        ...

    def parse(self, text: str) -> ParsedAssistant:
        """Reasoning, content and tool calls of generated text; never raises."""
        ...


def _text(message: Message) -> str:
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise TypeError(f"{message['role']} content must be a string, not {type(content).__name__}")
    return content


class ChatMLFormat:
    """ChatML (``<|im_start|>role\\ncontent<|im_end|>\\n``), as SmolLM2 uses it.

    ``default_system`` is inserted when a conversation does not start with a system turn, as
    SmolLM2's template does. Plain ChatML has no tool syntax: use :class:`Qwen3Format` for tools.
    """

    def __init__(self, tokenizer: Tokenizer, default_system: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.default_system = default_system
        self.im_start = tokenizer.token_id("<|im_start|>")
        self.im_end = tokenizer.token_id("<|im_end|>")
        self.newline = tokenizer.encode("\n")

    @property
    def end_of_turn_ids(self) -> tuple[int, ...]:
        ends = {self.im_end, self.tokenizer.eos_id, self.tokenizer.backend.token_to_id("<|endoftext|>")}
        return tuple(sorted(i for i in ends if i is not None))

    def parse(self, text: str) -> ParsedAssistant:
        return parse_assistant(text)

    def render(self, messages: list[Message], tools: list[dict] | None = None,
               add_generation_prompt: bool = False) -> Rendered:
        consumed = bool(tools and messages and messages[0]["role"] == "system")
        rendered = self.start(tools, system=messages[0] if consumed else None)
        for message in messages[consumed:]:
            self.append(rendered, message)
        return self.generation_prompt(rendered) if add_generation_prompt else self.close(rendered)

    def start(self, tools: list[dict] | None = None, system: Message | None = None) -> Rendered:
        """A new conversation that offers ``tools``; ``system`` is merged into the tools' system turn."""
        if tools:
            raise ValueError(f"{type(self).__name__} has no tool syntax; use Qwen3Format")
        return Rendered()

    def append(self, rendered: Rendered, message: Message) -> Rendered:
        """Add one turn to ``rendered`` (in place) and return it."""
        if not rendered.token_ids and message["role"] != "system" and self.default_system is not None:
            self.append(rendered, {"role": "system", "content": self.default_system})
        self.close(rendered)
        start = len(rendered.token_ids)
        if message["role"] == "assistant" and message.get("token_ids") is not None:
            self._sampled_turn(rendered, message["token_ids"])
        else:
            self._turn(rendered, message["role"], self._body(message), Source(message["role"]), message=message)
        rendered.spans.append((message["role"], start, len(rendered.token_ids)))
        return rendered

    def _sampled_turn(self, rendered: Rendered, token_ids: list[int]) -> None:
        """An assistant turn from the ids the policy sampled after the generation prompt, used as
        they are (never re-tokenised). A turn cut off before its end token is closed with one that is
        not trained on, so the model does not learn to stop there."""
        self.generation_prompt(rendered)
        rendered.prompt_ends.append(len(rendered.token_ids))
        rendered.extend(list(token_ids), Source.ASSISTANT)
        if not token_ids or token_ids[-1] != self.im_end:
            rendered.extend([self.im_end], Source.TEMPLATE)
        rendered.extend(self.newline, Source.TEMPLATE)

    def generation_prompt(self, rendered: Rendered) -> Rendered:
        """Open an assistant turn for the model to complete (in place)."""
        self.close(rendered)
        rendered.extend([self.im_start], Source.TEMPLATE)
        rendered.extend(self.tokenizer.encode("assistant\n"), Source.TEMPLATE)
        return rendered

    def close(self, rendered: Rendered) -> Rendered:
        """End a turn left open for more of the same kind (a no-op in plain ChatML)."""
        return rendered

    def _body(self, message: Message) -> list[tuple[str, Source]]:
        if message.get("tool_calls"):
            raise ValueError(f"{type(self).__name__} has no tool syntax; use Qwen3Format")
        return [(_text(message), Source(message["role"]))]

    def _images(self, rendered: Rendered, message: Message, source: Source) -> None:
        """A message's images, after its text (a format without image tokens refuses them)."""
        if message.get("images"):
            raise ValueError(f"{type(self).__name__} has no image tokens; use Qwen3VLFormat")

    def _turn(self, rendered: Rendered, role: str, body: list[tuple[str, Source]], source: Source,
              end: bool = True, message: Message | None = None) -> None:
        rendered.extend([self.im_start], Source.TEMPLATE)
        rendered.extend(self.tokenizer.encode(f"{role}\n" if end else role), Source.TEMPLATE)
        self._extend_pieces(rendered, body)
        if message is not None:
            self._images(rendered, message, source)
        if end:
            self._end(rendered, source)

    def _end(self, rendered: Rendered, source: Source) -> None:
        rendered.extend([self.im_end], source)  # the assistant learns to end its turn
        rendered.extend(self.newline, Source.TEMPLATE)

    def _extend_pieces(self, rendered: Rendered, pieces: list[tuple[str, Source]]) -> None:
        """Tokenise the pieces as one text (as HF does); each token takes the source of the piece
        its first character is in."""
        ids, sources = self.tokenizer.encode_with_sources(pieces)
        rendered.token_ids.extend(ids)
        rendered.sources.extend(sources)


SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_format(tokenizer: Tokenizer) -> ChatMLFormat:
    """SmolLM2-Instruct's template: ChatML with its default system prompt."""
    return ChatMLFormat(tokenizer, default_system=SMOLLM2_DEFAULT_SYSTEM)


_QWEN3_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                       "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_QWEN3_TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                       "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                       '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class Qwen3Format(ChatMLFormat):
    """Qwen3's template: ChatML plus tools in the system turn, reasoning in ``<think>``, tool calls
    in ``<tool_call>`` and consecutive tool results grouped into one ``user`` turn of
    ``<tool_response>`` blocks.

    With ``thinking=False`` the generation prompt carries an empty ``<think>`` block, as
    ``enable_thinking=False`` does in HF. See the module docstring for how reasoning on earlier
    turns differs from HF.
    """

    def __init__(self, tokenizer: Tokenizer, thinking: bool = True) -> None:
        super().__init__(tokenizer)
        self.thinking = thinking

    def start(self, tools: list[dict] | None = None, system: Message | None = None) -> Rendered:
        rendered = Rendered()
        if tools:
            pieces = [(_text(system) + "\n\n", Source.SYSTEM)] if system is not None else []
            schemas = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
            pieces.append((_QWEN3_TOOLS_HEADER + schemas + _QWEN3_TOOLS_FOOTER, Source.SYSTEM))
            self._turn(rendered, "system", pieces, Source.SYSTEM)
        return rendered

    def append(self, rendered: Rendered, message: Message) -> Rendered:
        if message["role"] != "tool":
            return super().append(rendered, message)
        start = len(rendered.token_ids)
        if not rendered.open_tool_turn:
            self._turn(rendered, "user", [], Source.TOOL, end=False)
            rendered.open_tool_turn = True
        pieces = [("\n<tool_response>\n", Source.TEMPLATE), (_text(message), Source.TOOL)]
        if message.get("images"):  # split the text only where an image sits, so text tokenises as HF's does
            self._extend_pieces(rendered, pieces)
            self._images(rendered, message, Source.TOOL)
            pieces = []
        self._extend_pieces(rendered, [*pieces, ("\n</tool_response>", Source.TEMPLATE)])
        rendered.spans.append(("tool", start, len(rendered.token_ids)))
        return rendered

    def close(self, rendered: Rendered) -> Rendered:
        if rendered.open_tool_turn:
            self._end(rendered, Source.TOOL)
            rendered.open_tool_turn = False
        return rendered

    def generation_prompt(self, rendered: Rendered) -> Rendered:
        super().generation_prompt(rendered)
        if not self.thinking:
            self._extend_pieces(rendered, [("<think>\n\n</think>\n\n", Source.TEMPLATE)])
        return rendered

    def _body(self, message: Message) -> list[tuple[str, Source]]:
        if message["role"] != "assistant":
            return [(_text(message), Source(message["role"]))]
        content, reasoning = _text(message), message.get("reasoning_content")
        if reasoning is None and "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
        text = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}" if reasoning else content
        for index, call in enumerate(message.get("tool_calls") or []):
            call = call.get("function", call)
            arguments = call["arguments"]
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            separator = "\n" if index or content else ""
            text += f'{separator}<tool_call>\n{{"name": "{call["name"]}", "arguments": {arguments}}}\n</tool_call>'
        return [(text, Source.ASSISTANT)]


ImageTokens = Callable[[int, int], int]  # (width, height) in pixels -> placeholder tokens


class Qwen3VLFormat(Qwen3Format):
    """Qwen3-VL's template: :class:`Qwen3Format` with images (see the module docstring).
    ``image_tokens(width, height)`` counts an image's placeholders: the model's, at its processed size
    (:func:`orchard.models.pixels.image_tokens`)."""

    def __init__(self, tokenizer: Tokenizer, image_tokens: ImageTokens, thinking: bool = True) -> None:
        super().__init__(tokenizer, thinking)
        self.image_tokens = image_tokens
        self.vision_start = tokenizer.token_id("<|vision_start|>")
        self.image_pad = tokenizer.token_id("<|image_pad|>")
        self.vision_end = tokenizer.token_id("<|vision_end|>")

    def _images(self, rendered: Rendered, message: Message, source: Source) -> None:
        for image in message.get("images") or ():
            width, height = (image["width"], image["height"]) if isinstance(image, dict) else (image.width, image.height)
            count = self.image_tokens(int(width), int(height))
            rendered.extend([self.vision_start], source)
            rendered.images.append(RenderedImage(len(rendered.token_ids), count, image))
            rendered.extend([self.image_pad] * count, source)
            rendered.extend([self.vision_end], source)


CHAT_FORMATS: dict[str, Callable[[Tokenizer], ChatMLFormat]] = {
    "qwen3": Qwen3Format,
    "qwen3_no_think": lambda tokenizer: Qwen3Format(tokenizer, thinking=False),
    "chatml": ChatMLFormat,
    "smollm2": smollm2_format,
}


VL_FORMATS = ("qwen3_vl", "qwen3_vl_no_think")


def make_chat_format(name: str, tokenizer: Tokenizer, image_tokens: ImageTokens | None = None) -> ChatFormat:
    """The chat format a config names (:data:`CHAT_FORMATS`, or :data:`VL_FORMATS` with the model's
    ``image_tokens`` counter) over ``tokenizer``."""
    if name in VL_FORMATS:
        if image_tokens is None:
            raise ValueError(f"chat format {name!r} needs the model's image token count (image_tokens)")
        return Qwen3VLFormat(tokenizer, image_tokens, thinking=name == "qwen3_vl")
    try:
        make = CHAT_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown chat format {name!r}: one of {', '.join((*CHAT_FORMATS, *VL_FORMATS))}") from None
    return make(tokenizer)
