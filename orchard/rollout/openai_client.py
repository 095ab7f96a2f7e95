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
* any other error status raises :class:`OpenAIError` at once, with the status and the server's
  message, read from any of the error bodies vLLM answers with (:func:`_error_detail`);
* a success whose body is empty or not JSON is a success with no content (``None``): vLLM's
  control routes (``/reset_prefix_cache``, ``/collective_rpc``, ``/sleep`` ...) answer so in some
  versions (``Response(status_code=200)``), and a caller that needs content finds none.

The client has a sync face (:meth:`OpenAIClient.post`, used from worker threads) and an async one
(:meth:`OpenAIClient.apost`, :meth:`~OpenAIClient.aget` and, for server-sent events,
:meth:`~OpenAIClient.astream`, used on the event loop); each opens its pool on first use: httpx for
the sync face, aiohttp for the async one (measured in the proxy benchmark: httpx's async client
cost the recording proxy about 1 ms of CPU a call, aiohttp a third of that). The aiohttp pool has no
connection cap: as many requests are in flight as the callers start (aiohttp's default would hold
them to 100).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
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


@dataclass(frozen=True)
class _Reply:
    """A whole HTTP answer, whichever library fetched it."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def is_error(self) -> bool:
        return self.status_code >= 400


class _TransportError(Exception):
    """The server could not be reached, or the connection broke (retried like a 5xx)."""


class _AiohttpTransport:
    """The async face's default: an aiohttp pool per event loop (a third of httpx's cost per call)."""

    def __init__(self, timeout: float) -> None:
        # As httpx's timeout: per connect and per read, not for the whole (possibly streamed) answer.
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self.session: aiohttp.ClientSession | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self.session is None or self.loop is not loop:  # a pool is bound to the loop that opened it
            if self.session is not None:
                self.session.detach()  # its loop is not this one: it cannot be closed from here
            # No connection cap (aiohttp's default is 100 at once): the callers bound how many requests are
            # in flight (a policy's concurrency, the proxy's sessions), and a cap here would queue them unseen.
            connector = aiohttp.TCPConnector(limit=0)
            self.session, self.loop = aiohttp.ClientSession(timeout=self.timeout, connector=connector), loop
        return self.session

    async def request(self, method: str, url: str, body: bytes | None, headers: dict[str, str]) -> _Reply:
        try:
            async with self._session().request(method, url, data=body, headers=headers) as response:
                return _Reply(response.status, response.headers, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _TransportError(repr(exc)) from exc

    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: dict[str, str]
                     ) -> AsyncIterator[tuple[_Reply, AsyncIterator[bytes]]]:
        try:
            async with self._session().post(url, data=body, headers=headers) as response:
                head = _Reply(response.status, response.headers, b"")
                if response.status >= 400:  # an error or a retry: its body says why
                    head = _Reply(response.status, response.headers, await response.read())
                yield head, _guard(response.content.iter_any())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _TransportError(repr(exc)) from exc

    async def aclose(self) -> None:
        if self.session is not None:
            if self.loop is asyncio.get_running_loop():
                await self.session.close()
            else:
                self.session.detach()  # opened on a loop that has ended
        self.session = None


class _HttpxTransport:
    """An httpx.AsyncClient the caller passed (an in-process ASGI app's, a shared pool)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def request(self, method: str, url: str, body: bytes | None, headers: dict[str, str]) -> _Reply:
        try:
            response = await self.client.request(method, url, content=body, headers=headers)
        except httpx.TransportError as exc:
            raise _TransportError(repr(exc)) from exc
        return _Reply(response.status_code, response.headers, response.content)

    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: dict[str, str]
                     ) -> AsyncIterator[tuple[_Reply, AsyncIterator[bytes]]]:
        try:
            async with self.client.stream("POST", url, content=body, headers=headers) as response:
                head = _Reply(response.status_code, response.headers, b"")
                if response.is_error:
                    head = _Reply(response.status_code, response.headers, await response.aread())
                yield head, response.aiter_bytes()
        except httpx.TransportError as exc:
            raise _TransportError(repr(exc)) from exc

    async def aclose(self) -> None:
        pass  # the caller's client: the caller closes it


async def _guard(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """aiohttp's errors while a body streams, as the transport's."""
    try:
        async for chunk in chunks:
            yield chunk
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _TransportError(repr(exc)) from exc


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a byte stream, however long (a streamed chunk may carry a whole prompt's ids)."""
    pending = bytearray()
    async for chunk in chunks:
        *lines, rest = chunk.split(b"\n")
        if lines:
            lines[0] = bytes(pending) + lines[0]
            pending = bytearray()
            for line in lines:
                yield line.rstrip(b"\r").decode()
        pending += rest
    if pending:
        yield pending.decode()


class OpenAIClient:
    """POST JSON to an OpenAI-compatible server with retries.

    ``base_url`` is the server's root or its ``/v1`` URL (both name the same server); paths are
    given from the root (``/v1/chat/completions``, ``/collective_rpc``). The async face uses an
    aiohttp pool of its own (one per event loop), or ``http_client`` when given (an httpx client,
    for example over an in-process ASGI app); the sync face uses httpx.
    """

    def __init__(self, base_url: str, api_key: str = "EMPTY", *, timeout: float = 600.0,
                 retry: RetryPolicy | None = None, http_client: httpx.AsyncClient | None = None) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self._json_headers = {**self.headers, "Content-Type": "application/json"}  # the async face sends bytes
        self.timeout, self.retry = timeout, retry or RetryPolicy()
        self._sync: httpx.Client | None = None
        self._async = _AiohttpTransport(timeout) if http_client is None else _HttpxTransport(http_client)

    def url(self, path: str) -> str:
        return self.root + "/" + path.lstrip("/")

    def post(self, path: str, body: dict[str, Any] | None, retry: RetryPolicy | None = None) -> Any:
        """POST ``body`` and return the decoded reply, retrying as the policy says (blocking); ``retry``
        overrides the client's policy for this call (``RetryPolicy(max_retries=0)``: a call that must not
        be repeated, such as one that waits on a collective)."""
        return self._request("POST", path, body, retry or self.retry)

    def get(self, path: str, retry: RetryPolicy | None = None) -> Any:
        """GET ``path`` and return the decoded reply, retrying as the policy says (blocking)."""
        return self._request("GET", path, None, retry or self.retry)

    def _request(self, method: str, path: str, body: dict[str, Any] | None, retry: RetryPolicy) -> Any:
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
        attempt = 0
        while True:
            try:
                response = self._sync.request(method, self.url(path), json=body)
            except httpx.TransportError as exc:
                wait = self._retry_transport(path, exc, attempt, retry)
            else:
                reply = _Reply(response.status_code, response.headers, response.content)
                if (wait := self._retry_status(path, reply, attempt, retry)) is None:
                    return _decode(method, self.url(path), reply)
            time.sleep(wait)
            attempt += 1

    async def apost(self, path: str, body: dict[str, Any] | None) -> Any:
        """POST ``body`` and return the decoded reply, retrying as the policy says (async)."""
        return await self._arequest("POST", path, body)

    async def aget(self, path: str) -> Any:
        """GET ``path`` (``/v1/models``) and return the decoded reply, retrying as the policy says."""
        return await self._arequest("GET", path, None)

    async def _arequest(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        attempt = 0
        while True:
            try:
                reply = await self._async.request(method, self.url(path), data, self._json_headers)
            except _TransportError as exc:
                wait = self._retry_transport(path, exc, attempt)
            else:
                if (wait := self._retry_status(path, reply, attempt)) is None:
                    return _decode(method, self.url(path), reply)
            await asyncio.sleep(wait)
            attempt += 1

    async def astream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST ``body`` with ``stream: true`` and yield each server-sent event's JSON as it arrives.

        Connecting is retried as :meth:`apost` is; once the first byte has come, nothing is (the
        caller has seen part of the answer). An error status raises :class:`OpenAIError`.
        """
        data = json.dumps({**body, "stream": True}).encode()
        attempt, started = 0, False
        while True:
            try:
                async with self._async.stream(self.url(path), data, self._json_headers) as (head, chunks):
                    if (wait := self._retry_status(path, head, attempt)) is None:
                        if head.is_error:
                            _decode("POST", self.url(path), head)
                        async for line in _lines(chunks):
                            if not line.startswith("data:"):
                                continue
                            event = line[len("data:"):].strip()
                            if event == "[DONE]":
                                return
                            started = True
                            yield json.loads(event)
                        return
            except _TransportError as exc:
                if started:
                    raise OpenAIError(f"POST {self.url(path)}: the stream broke off: {exc}") from exc
                wait = self._retry_transport(path, exc, attempt)
            await asyncio.sleep(wait)
            attempt += 1

    def _retry_transport(self, path: str, exc: Exception, attempt: int, retry: RetryPolicy | None = None) -> float:
        retry = retry or self.retry
        if attempt >= retry.max_retries:
            raise OpenAIError(f"POST {self.url(path)} failed after {attempt + 1} attempts: {exc}") from exc
        return retry.delay(attempt)

    def _retry_status(self, path: str, response: _Reply, attempt: int, retry: RetryPolicy | None = None
                      ) -> float | None:
        """``None`` when the response is final (success or an error not worth retrying), else the wait."""
        retry = retry or self.retry
        if response.status_code not in RETRY_STATUSES:
            return None
        if attempt >= retry.max_retries:
            raise OpenAIError(f"POST {self.url(path)} answered {response.status_code} after {attempt + 1} "
                              f"attempts: {_error_detail(response)}", response.status_code)
        return retry.delay(attempt, response.headers.get("retry-after"))

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        self.close()
        await self._async.aclose()


def _error_detail(response: _Reply) -> str:
    """What an error reply says, in any of vLLM's error bodies, else the start of the body.

    Recent vLLM answers ``{"error": {"message", "type", "param", "code"}}`` (0.34.0: ``ErrorResponse``
    in ``vllm/entrypoints/serve/engine/protocol.py``), older vLLM the flat ``{"object": "error",
    "message", "type", "param", "code"}`` (``vllm/entrypoints/openai/protocol.py``), and the RL routes
    ``/pause`` and ``/resume`` ``{"error": "<text>"}`` (``vllm/entrypoints/rl/online/api_router.py``).
    """
    try:
        body = json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        body = None
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, str):
        return error[:500]
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return f"{error.get('type') or 'error'}: {error['message'][:500]}"
    return response.text[:500]


def _decode(method: str, url: str, response: _Reply) -> Any:
    """A final reply's content: its JSON, ``None`` for a success that carries none, or :class:`OpenAIError`."""
    if response.is_error:
        raise OpenAIError(f"{method} {url} answered {response.status_code}: {_error_detail(response)}",
                          response.status_code)
    try:
        return json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return None  # an empty 200 or plain text: vLLM's control routes answer so
