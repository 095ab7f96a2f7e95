"""The subset of the OpenAI API that ``orchard serve`` speaks, as pydantic models.

Requests accept unknown fields (clients send many), and reject what would silently change the
answer: ``n`` beyond the limit, ``echo``, or forcing a particular tool. Two vLLM
extensions are understood, so :class:`~orchard.rollout.openai_engine.OpenAIEngine` works the same
against vLLM and against Orchard: ``return_token_ids`` (the prompt's and each choice's token ids)
and prompts given as token ids.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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
