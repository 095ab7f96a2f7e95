"""One HTTP client for OpenAI-compatible servers, with the project's one retry policy.

Every caller that talks to an OpenAI-compatible endpoint (``OpenAIEngine``, the chat policy that
drives a teacher or a hosted model, the LLM judges) goes through :class:`OpenAIClient`, so they
retry the same way:

* connection errors and the statuses in :data:`RETRY_STATUSES` (429 and the 5xx a restarting or
  overloaded server answers) are retried up to ``max_retries`` times;
* a ``Retry-After`` header (seconds, or an HTTP date) is obeyed, up to ``max_retry_after``;
* otherwise the wait is "full jitter" exponential backoff: uniform in
  ``[0, min(max_delay, base_delay * 2**attempt)]``, so many rollouts that failed together do not
  retry together;
* any other error status, or a reply that is not JSON, raises :class:`OpenAIError` at once, with
  the status and the start of the body.

The client has a sync face (:meth:`OpenAIClient.post`, used from worker threads) and an async one
(:meth:`OpenAIClient.apost`, :meth:`~OpenAIClient.aget` and, for server-sent events,
:meth:`~OpenAIClient.astream`, used on the event loop); each opens its httpx pool on first use.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class OpenAIError(RuntimeError):
    """An OpenAI-compatible server could not be reached or answered with an error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying a request again (see the module docstring)."""

    max_retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 60.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ValueError(f"invalid retry policy: {self}")

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry)."""
        if retry_after is not None and (asked := parse_retry_after(retry_after)) is not None:
            return min(asked, self.max_retry_after)
        return self.rng.uniform(0.0, min(self.max_delay, self.base_delay * 2**attempt))


def parse_retry_after(value: str, now: float | None = None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delta-seconds or an HTTP date; ``None`` if neither."""
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class OpenAIClient:
    """POST JSON to an OpenAI-compatible server with retries.

    ``base_url`` is the server's root or its ``/v1`` URL (both name the same server); paths are
    given from the root (``/v1/chat/completions``, ``/collective_rpc``).
    """

    def __init__(self, base_url: str, api_key: str = "EMPTY", *, timeout: float = 600.0,
                 retry: RetryPolicy | None = None, http_client: httpx.AsyncClient | None = None) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.timeout, self.retry = timeout, retry or RetryPolicy()
        self._sync: httpx.Client | None = None
        self._async, self._own_async = http_client, http_client is None

    def url(self, path: str) -> str:
        return self.root + "/" + path.lstrip("/")

    def post(self, path: str, body: dict[str, Any] | None) -> Any:
        """POST ``body`` and return the decoded reply, retrying as the policy says (blocking)."""
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
        attempt = 0
        while True:
            try:
                response = self._sync.post(self.url(path), json=body)
            except httpx.TransportError as exc:
                wait = self._retry_transport(path, exc, attempt)
            else:
                if (wait := self._retry_status(path, response, attempt)) is None:
                    return _decode(path, response)
            time.sleep(wait)
            attempt += 1

    async def apost(self, path: str, body: dict[str, Any] | None) -> Any:
        """POST ``body`` and return the decoded reply, retrying as the policy says (async)."""
        return await self._arequest("POST", path, body)

    async def aget(self, path: str) -> Any:
        """GET ``path`` (``/v1/models``) and return the decoded reply, retrying as the policy says."""
        return await self._arequest("GET", path, None)

    async def _arequest(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self.timeout)
        attempt = 0
        while True:
            try:
                response = await self._async.request(method, self.url(path), json=body, headers=self.headers)
            except httpx.TransportError as exc:
                wait = self._retry_transport(path, exc, attempt)
            else:
                if (wait := self._retry_status(path, response, attempt)) is None:
                    return _decode(path, response)
            await asyncio.sleep(wait)
            attempt += 1

    async def astream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST ``body`` with ``stream: true`` and yield each server-sent event's JSON as it arrives.

        Connecting is retried as :meth:`apost` is; once the first byte has come, nothing is (the
        caller has seen part of the answer). An error status raises :class:`OpenAIError`.
        """
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self.timeout)
        attempt, started = 0, False
        while True:
            try:
                async with self._async.stream("POST", self.url(path), json={**body, "stream": True},
                                              headers=self.headers) as response:
                    if (wait := self._retry_status(path, response, attempt)) is None:
                        if response.is_error:
                            await response.aread()
                            _decode(path, response)
                        async for line in response.aiter_lines():
                            if not line.startswith("data:"):
                                continue
                            data = line[len("data:"):].strip()
                            if data == "[DONE]":
                                return
                            started = True
                            yield json.loads(data)
                        return
            except httpx.TransportError as exc:
                if started:
                    raise OpenAIError(f"POST {self.url(path)}: the stream broke off: {exc!r}") from exc
                wait = self._retry_transport(path, exc, attempt)
            await asyncio.sleep(wait)
            attempt += 1

    def _retry_transport(self, path: str, exc: Exception, attempt: int) -> float:
        if attempt >= self.retry.max_retries:
            raise OpenAIError(f"POST {self.url(path)} failed after {attempt + 1} attempts: {exc!r}") from exc
        return self.retry.delay(attempt)

    def _retry_status(self, path: str, response: httpx.Response, attempt: int) -> float | None:
        """``None`` when the response is final (success or an error not worth retrying), else the wait."""
        if response.status_code not in RETRY_STATUSES:
            return None
        if attempt >= self.retry.max_retries:
            raise OpenAIError(f"POST {self.url(path)} answered {response.status_code} after {attempt + 1} "
                              f"attempts: {response.text[:500]}", response.status_code)
        return self.retry.delay(attempt, response.headers.get("retry-after"))

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        self.close()
        if self._async is not None and self._own_async:
            await self._async.aclose()
        self._async = None


def _decode(path: str, response: httpx.Response) -> Any:
    if response.is_error:
        raise OpenAIError(f"POST {path} answered {response.status_code}: {response.text[:500]}", response.status_code)
    if not response.content:
        return None  # vLLM's /reset_prefix_cache answers an empty 200
    try:
        return response.json()
    except json.JSONDecodeError as exc:
        raise OpenAIError(f"POST {path} answered {response.status_code} with a body that is not JSON: "
                          f"{response.text[:200]!r}", response.status_code) from exc
