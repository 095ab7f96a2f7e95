"""The subset of the OpenAI API that ``orchard serve`` speaks, as pydantic models.

Requests accept unknown fields (clients send many), and reject what would silently change the
answer: ``n`` beyond the limit, ``echo``, or forcing a particular tool. Two vLLM
extensions are understood, so :class:`~orchard.rollout.openai_engine.OpenAIEngine` works the same
against vLLM and against Orchard: ``return_token_ids`` (the prompt's and each choice's token ids)
and prompts given as token ids.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, ConfigDict, Field

MAX_IMAGE_BYTES = 20 * 2**20
_DATA_URI = re.compile(r"data:(image/[\w.+-]+)?(;[^,]*)?,(.*)", re.S)


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=10)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # vLLM extension; -1 and 0 mean off
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extension
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False  # vLLM extension

    def alternatives(self) -> int:
        """How many most-likely tokens to report per generated token."""
        return 0

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)  # alternatives per token, with logprobs: true
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM extension: {"enable_thinking": False}

    def alternatives(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else 0


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)  # alternatives per token; 0: the sampled token's only
    echo: Literal[False] = False

    def alternatives(self) -> int:
        return self.logprobs or 0


class APIError(Exception):
    """A request the server refuses: answered with :func:`error_body` and ``code``."""

    def __init__(self, message: str, code: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.kind = code, kind


def error_body(message: str, kind: str = "invalid_request_error", code: int = 400,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def has_image_parts(messages: Any) -> bool:
    """Whether any chat message has an ``image_url`` part (the others need no image work)."""
    return isinstance(messages, list) and any(
        isinstance(message, dict) and isinstance(message.get("content"), list)
        and any(isinstance(part, dict) and part.get("type") == "image_url" for part in message["content"])
        for message in messages)


def content_parts(content: str | list | None) -> tuple[str, list[str]]:
    """A message's text (its text parts joined) and the URLs of its ``image_url`` parts, in order."""
    if content is None or isinstance(content, str):
        return content or "", []
    if not isinstance(content, list):
        raise APIError("a message's content must be a string or a list of content parts")
    texts, urls = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise APIError("an image_url part needs image_url.url")
            urls.append(url)
        else:
            raise APIError(f"unsupported content part {kind!r}: text and image_url parts are")
    return "".join(texts), urls


def data_uri_bytes(url: str) -> bytes | None:
    """The bytes of a base64 ``data:image/...`` URI (``None`` for any other URL)."""
    match = _DATA_URI.fullmatch(url) if url.startswith("data:") else None
    if match is None:
        return None
    if not (match.group(2) or "").endswith(";base64"):
        raise APIError("a data URI image must be base64 (data:image/png;base64,...)")
    if len(match.group(3)) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise APIError(f"image larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        return base64.b64decode(match.group(3), validate=True)
    except (binascii.Error, ValueError):
        raise APIError("the data URI's base64 is malformed") from None


def image_url_bytes(url: str, local_roots: Sequence[str] = ()) -> bytes:
    """The bytes an OpenAI ``image_url`` names: a base64 ``data:`` URI, or a local file (a ``file://`` URL
    or an absolute path) inside one of ``local_roots`` (vLLM's ``--allowed-local-media-path``; none by
    default). Remote URLs are refused: nothing here reaches the network. :class:`APIError` otherwise."""
    data = data_uri_bytes(url)
    if data is not None:
        return data
    parsed = urlparse(url)
    if parsed.scheme not in ("file", ""):
        raise APIError(f"image URLs with scheme {parsed.scheme!r} are not fetched: send a data URI "
                       "(or a local file the server allows)")
    if not local_roots:
        raise APIError("local image files are refused: start the server with --allowed-local-media-path")
    path = os.path.realpath(unquote(parsed.path) if parsed.scheme == "file" else url)
    roots = [os.path.realpath(root) for root in local_roots]
    if not any(os.path.commonpath([path, root]) == root for root in roots):
        raise APIError("the image file is outside the allowed local media paths", 403, "permission_error")
    try:
        if os.path.getsize(path) > MAX_IMAGE_BYTES:
            raise APIError(f"image larger than {MAX_IMAGE_BYTES >> 20} MiB")
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise APIError(f"cannot read the image file: {exc.strerror}") from None
