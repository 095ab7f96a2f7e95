"""The recording proxy: an OpenAI-compatible server in front of any upstream, recording every call.

A harness Orchard does not control (a CLI, a Rust binary, someone else's Python loop) becomes a
source of on-policy data by pointing its OpenAI base URL at a session of this proxy:

1. **Sessions.** The trainer opens one per rollout: ``POST /sessions`` (admin key) with the task,
   the harness, the rollout id, a deadline in seconds and the sampling, and gets the session's
   own base URL (``/s/{session}/v1``) and key. A call is attributed by its path, else by its
   bearer key, else by an ``X-Orchard-Session`` header; an unknown session is a 404 and a closed
   one a 409, so a misconfigured harness fails loudly. ``POST /sessions/{id}/close`` ends it.
2. **The trainer sets sampling.** The session's temperature, top-p, seed and max tokens (and the
   upstream's model name) replace what the harness sends. The reply goes back in the plain
   OpenAI shape the client asked for: the token ids and logprobs the proxy asked the upstream
   for are stripped unless the client asked for them too.
3. **Token ids and logprobs are recorded, never re-derived**: the proxy asks the upstream for
   ``return_token_ids`` (vLLM's extension, which ``orchard serve`` speaks) and logprobs, streamed
   or not. A call whose ids or logprobs did not come back is recorded as text with
   ``usable_for_rl: false``.
4. **Streaming passes through** chunk by chunk as the upstream sends it; the record is assembled
   when the stream ends, and a client that disconnects leaves a record with status
   ``client_disconnected``.
5. **Records** are append-only, crash-safe JSONL, one file per session (:mod:`orchard.data.jsonl`):
   a ``session`` line, then one ``call`` line per call (the request as the client sent it and as
   it went upstream, the response, prompt and completion token ids, logprobs, finish reasons,
   latency, time to first token, the upstream's ``weight_version``, a status), and a ``closed``
   or ``timed_out`` line. :func:`~orchard.rollout.proxy_records.read_session` reads one back, and
   ``GET /sessions/{id}/records`` serves it to a trainer on another machine (also for a session
   of an earlier run of the proxy over the same records directory). A proxy started over a
   records directory reopens the sessions an earlier run left open (killed or restarted
   mid-rollout): the same URL and key go on working, with the same deadline.
6. **Images are recorded by hash.** A chat message's ``image_url`` parts given as base64 ``data:``
   URIs go upstream as sent, but the records keep each image once, in ``<records>/images`` (an
   :class:`~orchard.data.images.ImageStore`), and the part as ``{"type": "image_url", "image_url":
   {"url": "sha256:<hex>"}, "image": <ImageRef>}``; ``GET /images/{sha256}`` serves the bytes to a
   trainer on another machine. Other image URLs (files, remote) are recorded as they are.
7. **The deadline** (the paper's wall clock for Claw) is enforced: a call after it, or one that
   runs past it, gets a 504, and the session is marked ``timed_out``: its rollout is excluded
   from training.

``GET /metrics`` is Prometheus; the session routes need the admin key when one is set. The
proxy binds to loopback by default (``orchard proxy``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from orchard.data.images import ImageStore
from orchard.data.jsonl import JsonlWriter
from orchard.rollout.openai_api import APIError, data_uri_bytes, error_body, has_image_parts
from orchard.rollout.openai_client import OpenAIClient, OpenAIError
from orchard.rollout.proxy_records import Status, read_session

log = logging.getLogger(__name__)

SESSION_HEADER = "x-orchard-session"
SESSION_ID = re.compile(r"[0-9a-f]{16}")  # secrets.token_hex(8): also the records' file name
IMAGE_HASH = re.compile(r"[0-9a-f]{64}")


class SessionSampling(BaseModel):
    """What the trainer sets for every call of a session (``None``: the harness's value stands)."""

    temperature: float | None = Field(None, ge=0, le=10)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    max_tokens: int | None = Field(None, ge=1)


class SessionRequest(BaseModel):
    task: str
    harness: str
    rollout_id: str = ""
    deadline_s: float | None = Field(None, gt=0, description="seconds from now; None: no deadline")
    sampling: SessionSampling = Field(default_factory=SessionSampling)


@dataclass
class Session:
    id: str
    key: str
    request: SessionRequest
    path: str  # its records
    writer: JsonlWriter
    deadline: float | None  # time.monotonic() at which it times out
    status: Status = "open"
    calls: int = 0
    key_digest: str = ""  # the records keep only this of the key; a restored session's key is ""

    def info(self, root: str = "") -> dict[str, Any]:
        return {"id": self.id, "base_url": f"{root}/s/{self.id}/v1", "api_key": self.key, "records": self.path,
                "status": self.status, "calls": self.calls, **self.request.model_dump()}


@dataclass(frozen=True)
class ProxyConfig:
    upstream: str  # the upstream's root or /v1 URL
    records_dir: str
    upstream_key: str = "EMPTY"
    admin_key: str | None = None  # required on the session routes when set
    model: str | None = None  # the upstream's model name; None: the first of its /v1/models


@dataclass
class _Call:
    """What one call has gathered so far (a stream fills it chunk by chunk)."""

    kind: Literal["chat", "completion"]
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    prompt_token_ids: dict[int, list[int]] = field(default_factory=dict)
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)
    finish_reason: dict[int, str | None] = field(default_factory=dict)
    weight_version: int | None = None
    ids_missing: bool = False

    def add_choice(self, choice: dict[str, Any], top: dict[str, Any], streamed: bool) -> None:
        index = choice.get("index", 0)
        if self.first_token is None:
            self.first_token = time.perf_counter()
        prompt = choice.get("prompt_token_ids", top.get("prompt_token_ids"))
        if prompt is not None and index not in self.prompt_token_ids:
            self.prompt_token_ids[index] = list(prompt)
        if "token_ids" in choice and choice["token_ids"] is not None:
            self.token_ids.setdefault(index, []).extend(choice["token_ids"])
        elif (choice.get("delta") or {}).get("content") or choice.get("text") or choice.get("message"):
            self.ids_missing = True
        self.logprobs.setdefault(index, []).extend(_logprobs(choice))
        part = (choice.get("delta") if streamed else choice.get("message")) or {}
        text = (choice.get("text") if self.kind == "completion" else part.get("content")) or ""
        self.text[index] = self.text.get(index, "") + text
        if choice.get("finish_reason") is not None or index not in self.finish_reason:
            self.finish_reason[index] = choice.get("finish_reason")
        if top.get("weight_version") is not None:
            self.weight_version = top["weight_version"]

    def record(self, session: Session, number: int, path: str, request: dict, upstream: dict,
               response: dict | None, status: str, error: str | None = None) -> dict[str, Any]:
        choices = sorted(set(self.token_ids) | set(self.text) | set(self.finish_reason))
        completions = [{"index": i, "token_ids": self.token_ids.get(i), "logprobs": self.logprobs.get(i) or None,
                        "text": self.text.get(i, ""), "finish_reason": self.finish_reason.get(i)} for i in choices]
        usable = (status == "ok" and not self.ids_missing and bool(completions)
                  and all(c["token_ids"] is not None and c["logprobs"] is not None
                          and len(c["logprobs"]) == len(c["token_ids"]) for c in completions)
                  and all(i in self.prompt_token_ids for i in choices))
        now = time.perf_counter()
        return {"type": "call", "session": session.id, "call": number, "path": path, "time": time.time(),
                "request": request, "upstream_request": upstream, "response": response,
                "prompt_token_ids": [self.prompt_token_ids.get(i) for i in choices], "completions": completions,
                "latency_s": now - self.started,
                "ttft_s": None if self.first_token is None else self.first_token - self.started,
                "weight_version": self.weight_version, "status": status, "error": error, "usable_for_rl": usable}


def _logprobs(choice: dict[str, Any]) -> list[float]:
    logprobs = choice.get("logprobs")
    if not logprobs:
        return []
    if "content" in logprobs:  # chat
        return [entry["logprob"] for entry in logprobs["content"] or []]
    return list(logprobs.get("token_logprobs") or [])  # completions


def _digest(key: str) -> str:
    """What the records keep of a session's key (enough to recognise it after a restart)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _event(body: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _images_by_hash(body: dict[str, Any], store: ImageStore) -> dict[str, Any]:
    """``body`` as the records keep it: each base64 image part stored in ``store`` and named by its hash
    (see the module docstring); an image that does not decode is recorded as a note of its size."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body
    recorded = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            recorded.append(message)
            continue
        parts = []
        for part in content:
            image = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
            url = image.get("url") if isinstance(image, dict) else image
            try:
                data = data_uri_bytes(url) if isinstance(url, str) else None
                if data is not None:
                    ref = store.put(data)
                    part = {"type": "image_url", "image_url": {"url": f"sha256:{ref.sha256}"},
                            "image": ref.model_dump()}
            except (APIError, ValueError) as exc:
                part = {"type": "image_url", "image_url": {"url": f"unrecorded: {exc} ({len(url)} characters)"}}
            parts.append(part)
        recorded.append({**message, "content": parts})
    return {**body, "messages": recorded}


def _strip(body: dict[str, Any], wants_ids: bool, wants_logprobs: bool) -> dict[str, Any]:
    """``body`` less what the proxy asked for and the client did not."""
    out = dict(body)
    if not wants_ids:
        out.pop("prompt_token_ids", None)
    choices = []
    for choice in out.get("choices") or []:
        choice = dict(choice)
        if not wants_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not wants_logprobs and "logprobs" in choice:
            choice["logprobs"] = None
        choices.append(choice)
    if "choices" in out:
        out["choices"] = choices
    return out


class RecordingProxy:
    """The sessions, the upstream client and the records (see the module docstring)."""

    def __init__(self, config: ProxyConfig, client: OpenAIClient | None = None) -> None:
        self.config = config
        self.client = client or OpenAIClient(config.upstream, config.upstream_key)
        self.sessions: dict[str, Session] = {}
        self.by_key: dict[str, Session] = {}
        self.ended_before: dict[str, Status] = {}  # sessions an earlier run over these records ended
        self.model = config.model
        os.makedirs(config.records_dir, exist_ok=True)
        self.images = ImageStore(os.path.join(config.records_dir, "images"))
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.calls = Counter("orchard_proxy_calls", "proxied calls by status", ["status"], registry=self.registry)
        self.latency = Histogram("orchard_proxy_call_seconds", "call latency, upstream included",
                                 registry=self.registry)
        self.open_sessions = Gauge("orchard_proxy_open_sessions", "sessions open", registry=self.registry)
        self.restore()

    # -------------------------------------------------------------- sessions

    def open(self, request: SessionRequest) -> Session:
        ident, now = secrets.token_hex(8), time.time()
        path = os.path.join(self.config.records_dir, f"{ident}.jsonl")
        deadline = time.monotonic() + request.deadline_s if request.deadline_s else None
        session = Session(ident, f"sk-orchard-{secrets.token_urlsafe(18)}", request, path, JsonlWriter(path), deadline)
        key_digest = _digest(session.key)
        session.writer.write_record({"type": "session", "id": ident, "time": now, **request.model_dump(),
                                     "key_sha256": key_digest,
                                     "deadline_at": now + request.deadline_s if request.deadline_s else None})
        self._add(session, key_digest)
        return session

    def _add(self, session: Session, key_digest: str) -> None:
        session.key_digest = key_digest
        self.sessions[session.id], self.by_key[key_digest] = session, session
        self.open_sessions.inc()

    def restore(self) -> int:
        """Reopen the sessions an earlier run of the proxy over this records directory left open (it
        was killed or restarted mid-rollout): their harnesses go on with the same URL and key, the
        calls are appended to the same file, and the deadline stands. Returns how many."""
        restored = 0
        for name in sorted(os.listdir(self.config.records_dir)):
            ident = name.removesuffix(".jsonl")
            if not name.endswith(".jsonl") or not SESSION_ID.fullmatch(ident) or ident in self.sessions:
                continue
            path = os.path.join(self.config.records_dir, name)
            try:
                record = read_session(path)
            except ValueError as exc:  # a broken line mid-file: leave it to whoever reads it
                log.warning("not restoring session %s: %s", ident, exc)
                continue
            if record.status != "open":
                self.ended_before[ident] = record.status
                continue
            if not record.session.get("key_sha256"):
                continue
            request = SessionRequest.model_validate({k: record.session[k] for k in SessionRequest.model_fields
                                                     if k in record.session})
            deadline_at = record.session.get("deadline_at")
            deadline = None if deadline_at is None else time.monotonic() + (deadline_at - time.time())
            session = Session(ident, "", request, path, JsonlWriter(path), deadline, calls=len(record.calls))
            session.writer.write_record({"type": "restored", "time": time.time(), "calls": session.calls})
            self._add(session, record.session["key_sha256"])
            restored += 1
        if restored:
            log.info("restored %d open sessions from %s", restored, self.config.records_dir)
        return restored

    def close(self, session: Session, status: Status = "closed") -> None:
        if session.status != "open":
            return
        session.status = status
        session.writer.write_record({"type": status, "time": time.time(), "calls": session.calls})
        session.writer.close()
        self.by_key.pop(session.key_digest, None)
        self.open_sessions.dec()

    def find(self, request: Request, session_id: str | None) -> Session:
        """The session a call belongs to: by path, else bearer key, else header; 404/409/504 otherwise."""
        if session_id is None:
            key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            by_key = self.by_key.get(_digest(key)) if key else None
            session_id = by_key.id if by_key else request.headers.get(SESSION_HEADER)
        if not session_id:
            raise APIError("no session: call /s/{session}/v1, or use the session's key or the X-Orchard-Session "
                             "header", 404)
        session = self.sessions.get(session_id)
        status = session.status if session else self.ended_before.get(session_id)
        if status is None:
            raise APIError(f"unknown session {session_id!r}", 404)
        if status == "timed_out":
            raise APIError(f"session {session_id} ran past its deadline", 504, "timeout")
        if status != "open" or session is None:
            raise APIError(f"session {session_id} is {status}", 409)
        if session.deadline is not None and time.monotonic() >= session.deadline:
            self.close(session, "timed_out")
            raise APIError(f"session {session_id} ran past its deadline", 504, "timeout")
        return session

    async def upstream_model(self) -> str:
        if self.model is None:
            try:
                self.model = (await self.client.aget("/v1/models"))["data"][0]["id"]
            except (OpenAIError, KeyError, IndexError, TypeError) as exc:
                raise APIError(f"the upstream names no model ({exc}); start the proxy with --model", 502,
                                 "upstream_error") from None
        return self.model

    # ----------------------------------------------------------------- calls

    async def forward(self, session: Session, path: str, body: dict[str, Any]):
        """Forward one call; a JSON body, or a stream of server-sent events."""
        kind: Literal["chat", "completion"] = "chat" if path.endswith("chat/completions") else "completion"
        wants_ids = bool(body.get("return_token_ids"))
        wants_logprobs = bool(body.get("logprobs")) if kind == "chat" else body.get("logprobs") is not None
        upstream = {**body, "model": await self.upstream_model(), "return_token_ids": True}
        upstream.update({k: v for k, v in session.request.sampling.model_dump().items() if v is not None})
        upstream["logprobs"] = True if kind == "chat" else max(int(body.get("logprobs") or 0), 0)
        session.calls += 1
        number, call = session.calls, _Call(kind)
        remaining = None if session.deadline is None else session.deadline - time.monotonic()
        recorded = (await asyncio.to_thread(_images_by_hash, body, self.images)  # hashing and writing off the loop
                    if has_image_parts(body.get("messages")) else body)
        kept = (recorded, {**upstream, **({"messages": recorded["messages"]} if "messages" in recorded else {})})
        if body.get("stream"):
            return StreamingResponse(self._stream(session, number, path, upstream, kept, call, wants_ids,
                                                  wants_logprobs, remaining), media_type="text/event-stream")
        try:
            async with asyncio.timeout(remaining):
                reply = await self.client.apost(path, {**upstream, "stream": False})
        except TimeoutError:
            self._write(session, call.record(session, number, path, *kept, None, "deadline"))
            self.close(session, "timed_out")
            raise APIError(f"session {session.id} ran past its deadline", 504, "timeout") from None
        except OpenAIError as exc:
            self._write(session, call.record(session, number, path, *kept, None, "upstream_error", str(exc)))
            raise APIError(f"upstream: {exc}", exc.status or 502, "upstream_error") from None
        for choice in reply.get("choices") or []:
            call.add_choice(choice, reply, streamed=False)
        self._write(session, call.record(session, number, path, *kept, reply, "ok"))
        return _strip(reply, wants_ids, wants_logprobs)

    async def _stream(self, session: Session, number: int, path: str, upstream: dict, kept: tuple[dict, dict],
                      call: _Call, wants_ids: bool, wants_logprobs: bool,
                      remaining: float | None) -> AsyncIterator[bytes]:
        """Pass the upstream's stream through; ``kept`` is the request and upstream request as recorded."""
        status, error = "ok", None
        try:
            async with asyncio.timeout(remaining):
                async for chunk in self.client.astream(path, upstream):
                    for choice in chunk.get("choices") or []:
                        call.add_choice(choice, chunk, streamed=True)
                    yield _event(_strip(chunk, wants_ids, wants_logprobs))
            yield b"data: [DONE]\n\n"
        except TimeoutError:
            status = "deadline"
            self.close(session, "timed_out")
            yield _event(error_body("the session ran past its deadline", "timeout", 504))
        except OpenAIError as exc:
            status, error = "upstream_error", str(exc)
            yield _event(error_body(f"upstream: {exc}", "upstream_error", exc.status or 502))
        except (asyncio.CancelledError, GeneratorExit):
            status = "client_disconnected"
            raise
        finally:
            self._write(session, call.record(session, number, path, *kept, None, status, error))

    def _write(self, session: Session, record: dict[str, Any]) -> None:
        self.calls.labels(record["status"]).inc()
        self.latency.observe(record["latency_s"])
        if not session.writer.closed:  # a session closed while its call ran keeps the call out of the file
            session.writer.write_record(record)
        else:
            log.warning("session %s closed before its call %d ended; the call is not recorded", session.id,
                        record["call"])


def create_proxy_app(proxy: RecordingProxy) -> FastAPI:
    app = FastAPI(title="Orchard recording proxy")

    @app.exception_handler(APIError)
    async def _proxy_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.kind, exc.code), exc.code)

    def admin(request: Request) -> None:
        key = proxy.config.admin_key
        if key and request.headers.get("authorization", "") != f"Bearer {key}":
            raise APIError("the session routes need the proxy's admin key", 401, "authentication_error")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "sessions": len(proxy.sessions)}

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(proxy.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/sessions")
    async def open_session(body: SessionRequest, request: Request) -> dict:
        admin(request)
        return proxy.open(body).info(str(request.base_url).rstrip("/"))

    @app.get("/sessions/{session_id}")
    async def session_info(session_id: str, request: Request) -> dict:
        admin(request)
        if session_id not in proxy.sessions:
            raise APIError(f"unknown session {session_id!r}", 404)
        return proxy.sessions[session_id].info(str(request.base_url).rstrip("/"))

    @app.get("/sessions/{session_id}/records")
    async def session_records(session_id: str, request: Request) -> Response:
        admin(request)
        path = os.path.join(proxy.config.records_dir, f"{session_id}.jsonl")
        if not SESSION_ID.fullmatch(session_id) or not os.path.exists(path):
            raise APIError(f"unknown session {session_id!r}", 404)
        record = await asyncio.to_thread(read_session, path)
        return Response(json.dumps(record.to_json()).encode(), media_type="application/json")

    @app.get("/images/{sha256}")
    async def image(sha256: str, request: Request) -> Response:
        admin(request)
        path = proxy.images.find(sha256) if IMAGE_HASH.fullmatch(sha256) else None
        if path is None:
            raise APIError(f"no recorded image {sha256!r}", 404)
        return FileResponse(path)

    @app.post("/sessions/{session_id}/close")
    async def close_session(session_id: str, request: Request) -> dict:
        admin(request)
        session = proxy.sessions.get(session_id)
        if session is None:
            raise APIError(f"unknown session {session_id!r}", 404)
        proxy.close(session)
        return session.info(str(request.base_url).rstrip("/"))

    async def models(request: Request, session_id: str | None = None) -> dict:
        proxy.find(request, session_id)
        return {"object": "list", "data": [{"id": await proxy.upstream_model(), "object": "model",
                                            "owned_by": "orchard-proxy"}]}

    async def call(request: Request, path: str, session_id: str | None = None):
        session = proxy.find(request, session_id)
        try:
            body = await request.json()
        except ValueError:
            raise APIError("the request body is not JSON", 400) from None
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object", 400)
        reply = await proxy.forward(session, path, body)
        if isinstance(reply, dict):  # serialised here: FastAPI's encoder would walk every token id
            return Response(json.dumps(reply).encode(), media_type="application/json")
        return reply

    @app.get("/v1/models")
    async def models_by_key(request: Request) -> dict:
        return await models(request)

    @app.get("/s/{session_id}/v1/models")
    async def models_by_path(session_id: str, request: Request) -> dict:
        return await models(request, session_id)

    for route in ("/v1/chat/completions", "/v1/completions"):  # each by the caller's key or header, and by path
        app.add_api_route(route, _by_key(call, route), methods=["POST"])
        app.add_api_route(f"/s/{{session_id}}{route}", _by_path(call, route), methods=["POST"])

    return app


def _by_key(call, route: str):
    async def endpoint(request: Request):
        return await call(request, route)
    return endpoint


def _by_path(call, route: str):
    async def endpoint(session_id: str, request: Request):
        return await call(request, route, session_id)
    return endpoint
