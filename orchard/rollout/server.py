"""``orchard serve``: an OpenAI-compatible server over :class:`~orchard.rollout.jax_engine.JaxEngine`.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions`` (tools with ``tool_choice`` auto or none,
reasoning split into ``reasoning_content`` as vLLM does, streaming, logprobs),
``POST /v1/completions`` (text or token-id prompts), ``GET /health``, and the weight-update routes
vLLM serves in dev mode (see :mod:`orchard.rollout.openai_engine` for vLLM's files), answered as
vLLM 0.34 answers them: ``POST /collective_rpc`` with ``{"method": "reload_weights"}`` re-reads the
weights, from ``{"kwargs": {"weights_path": dir}}`` when given (later reloads then read ``dir`` too),
else from where the last reload read (``{"results": [null]}``); ``POST /pause`` refuses new
generation requests with a 503 until ``POST /resume`` (requests in flight finish, whatever the
``mode``: vLLM's ``wait``), ``GET /is_paused``; and ``POST /reset_prefix_cache`` (``{"success": true}``,
having emptied the prefix cache: ``--prefix-cache-mb``, 512 by default, 0 for none; a turn of a conversation
then prefills only what it adds to an earlier one, :mod:`orchard.rollout.prefix_cache`).

Concurrent requests share decode steps: they join the engine's running batch at step boundaries
and leave it when they finish (:mod:`orchard.rollout.batching`, ``--max-batch-rows``, 32 by default).
With ``--max-batch-rows 0`` requests run one at a time on the engine (each may hold ``n`` sequences
in one batch), in a worker thread so the event loop keeps answering.
Chat messages may carry OpenAI ``image_url`` content parts for a vision-language model: base64
``data:`` URIs, or local files (``file://`` or an absolute path) under ``--allowed-local-media-path``
(none by default; remote URLs are never fetched). A message's images are rendered after its text,
whatever the order of its parts (the ``qwen3_vl`` format's rule), and a request with images decodes
in a batch of its own, one such request at a time (see :mod:`orchard.rollout.jax_engine`).
Errors use OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``. Every reply and
chunk carries ``weight_version``, the engine's version of its weights (bumped by each reload), and
with ``return_token_ids`` a stream's first chunk of each choice carries its ``prompt_token_ids``, as
vLLM's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from orchard.data.chat import ChatFormat, Rendered, parse_assistant
from orchard.data.images import decode_rgb
from orchard.data.tokenizer import Tokenizer
from orchard.models import from_pretrained
from orchard.models.vlm import VLMConfig
from orchard.models.weights import ModelWeights
from orchard.rollout.jax_engine import JaxEngine, model_chat_format
from orchard.rollout.openai_api import (
    APIError,
    ChatRequest,
    CompletionRequest,
    content_parts,
    error_body,
    has_image_parts,
    image_url_bytes,
)
from orchard.rollout.prefix_cache import DEFAULT_PREFIX_CACHE_MB
from orchard.rollout.sampler import PromptImages
from orchard.rollout.types import Alternatives, SamplingParams, StreamDelta

log = logging.getLogger(__name__)
DEFAULT_CHAT_MAX_TOKENS = 1024


class ModelServer:
    """The served model: engine, tokenizer, chat format and the directory its weights come from."""

    def __init__(self, path: str, name: str | None = None, max_batch_rows: int = 32, chunk_steps: int = 2,
                 chat_format: str | None = None, local_media: Sequence[str] = (),
                 prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB, **overrides) -> None:
        self.path, self.name, self.overrides = path, name or path, overrides
        self.local_media = tuple(local_media)  # directories image_url parts may name files in
        self.chat_format_name = chat_format  # None: chosen by the model family and tokenizer
        self.tokenizer = Tokenizer.from_pretrained(path)
        self.engine = JaxEngine(from_pretrained(path, **overrides), self.tokenizer, max_batch_rows, chunk_steps,
                                prefix_cache_mb << 20)
        self.lock = asyncio.Lock()
        self.weights_path = path  # where a reload reads the weights (vLLM's, too, moves with weights_path)
        self.paused = False  # POST /pause: new generation requests are refused until /resume
        self.created = int(time.time())
        ends = [self.tokenizer.eos_id, self.tokenizer.backend.token_to_id("<|endoftext|>")]
        self.end_ids = tuple(sorted({i for i in ends if i is not None}))

    @property
    def vision(self) -> VLMConfig | None:
        """The model's config when it is a vision-language model (else ``None``: it takes no images)."""
        config = self.engine.sampler.config
        return config if isinstance(config, VLMConfig) else None

    def chat_format(self, thinking: bool) -> ChatFormat:
        config = self.vision or self.engine.sampler.cfg
        if self.chat_format_name:
            return model_chat_format(self.chat_format_name, self.tokenizer, config)
        family = self.engine.sampler.cfg.model_type
        if self.vision is not None:
            return model_chat_format("qwen3_vl" if thinking else "qwen3_vl_no_think", self.tokenizer, config)
        if family.startswith("qwen"):
            return model_chat_format("qwen3" if thinking else "qwen3_no_think", self.tokenizer, config)
        if self.tokenizer.backend.token_to_id("<|im_start|>") is not None:
            return model_chat_format("smollm2", self.tokenizer, config)
        raise APIError(f"no chat format for a {family!r} model with this tokenizer; use /v1/completions")

    def chat_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages with list-of-parts content joined into text, and their ``image_url`` parts decoded
        into ``images`` (``{"width", "height", "pixels"}``, for the chat format and the engine)."""
        plain = []
        for message in messages:
            if not isinstance(message, dict) or "role" not in message:
                raise APIError("every message needs a role")
            text, urls = content_parts(message.get("content"))
            message = {**message, "content": text}
            if urls:
                if self.vision is None:
                    raise APIError(f"the model {self.name!r} takes no images (it is not a vision-language model)")
                message["images"] = [self._image(url) for url in urls]
            plain.append(message)
        return plain

    def _image(self, url: str) -> dict[str, Any]:
        try:
            pixels = decode_rgb(image_url_bytes(url, self.local_media))
        except ValueError as exc:
            raise APIError(f"image: {exc}") from None
        return {"width": pixels.shape[1], "height": pixels.shape[0], "pixels": pixels}

    @property
    def batching(self) -> bool:
        """Whether requests share the engine's decode batch (else they take turns)."""
        return getattr(self.engine, "batcher", None) is not None

    @property
    def weight_version(self) -> int | None:
        """The engine's version of its weights (``None`` for an engine that keeps none)."""
        return getattr(self.engine, "weight_version", None)

    def reload_weights(self, weights_path: str | None = None) -> None:
        """Serve the weights in ``weights_path`` (else where the last reload read), as the next version."""
        path = weights_path or self.weights_path
        version = self.engine.weight_version + 1
        self.engine.update_weights(ModelWeights.of(from_pretrained(path, **self.overrides), version))
        self.weights_path = path

    def check_open(self) -> None:
        if self.paused:
            raise APIError("generation is paused for a weight update; retry after POST /resume", 503,
                           "ServiceUnavailableError")

    def sampling(self, request: ChatRequest | CompletionRequest, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=request.temperature, top_p=request.top_p,
                top_k=max(request.top_k, 0), stop=request.stops(),
                stop_token_ids=tuple(request.stop_token_ids or ()) + self.end_ids,
                seed=request.seed if request.seed is not None else uuid.uuid4().int % 2**31,
                top_logprobs=request.alternatives())
        except ValueError as exc:
            raise APIError(str(exc)) from exc

    def check_model(self, model: str) -> None:
        if model != self.name:
            raise APIError(f"The model `{model}` does not exist.", 404, "NotFoundError")

    def token_logprobs(self, token_ids: list[int], logprobs: list[float],
                       alternatives: Alternatives | None) -> list[dict[str, Any]]:
        """Chat-completions logprobs: each generated token, and its most likely alternatives."""
        steps = alternatives if alternatives is not None else [[] for _ in token_ids]
        return [{**self._token(token_id, logprob), "top_logprobs": [self._token(i, value) for i, value in step]}
                for token_id, logprob, step in zip(token_ids, logprobs, steps, strict=True)]

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.tokenizer.decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


async def _in_thread(iterator: Iterator[StreamDelta]) -> AsyncIterator[StreamDelta]:
    """Drive a blocking iterator from the event loop, one item per worker-thread call."""
    done = object()
    try:
        while (item := await asyncio.to_thread(next, iterator, done)) is not done:
            yield item
    finally:
        with contextlib.suppress(ValueError):  # still running in its thread after a cancel: it ends after that step
            iterator.close()


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


_HOLD = re.compile(r"<(t(o(o(l(_(c(a(l(l)?)?)?)?)?)?)?)?)?$|</(t(h(i(n(k)?)?)?)?)?$")


def _visible(text: str) -> tuple[str, str]:
    """The reasoning and content of a partial assistant text that are safe to stream: nothing of a
    tag that may still be forming, nothing from a ``<tool_call>`` on (calls are sent whole), and
    no trailing whitespace yet (the final message is stripped)."""
    reasoning, rest = "", text
    stripped = text.lstrip()
    if stripped.startswith("<think>"):
        body = stripped[len("<think>"):]
        end = body.find("</think>")
        if end < 0:
            return _HOLD.sub("", body).strip("\n"), ""
        reasoning, rest = body[:end].strip("\n"), body[end + len("</think>"):]
    elif "<think>".startswith(stripped):
        return "", ""
    call = rest.find("<tool_call>")
    content = rest if call < 0 else rest[:call]
    return reasoning, (_HOLD.sub("", content) if call < 0 else content).strip()


def _message(text: str) -> tuple[dict[str, Any], str | None]:
    """An OpenAI assistant message from generated text, and the finish reason it implies."""
    parsed = parse_assistant(text)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.errors:  # show the model's raw text, so the harness can see and count the bad call
        message["content"] = text.split("</think>")[-1].strip()
        return message, None
    if parsed.tool_calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
            for call in parsed.tool_calls]
        return message, "tool_calls"
    return message, None


def _prompt_images(rendered: Rendered) -> PromptImages | None:
    """A rendered prompt's images with where their placeholders start, for the engine (``None``: none)."""
    return [[(image.image["pixels"], image.start) for image in rendered.images]] if rendered.images else None


def create_app(server: ModelServer) -> FastAPI:
    app = FastAPI(title="Orchard model server")

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.kind, exc.code), exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(error_body(problems or "invalid request"), 400)

    @app.get("/health")
    async def health() -> dict:
        if not server.batching:
            return {"status": "ok"}
        batcher = server.engine.batcher
        return {"status": "ok", "batch": {**batcher.stats, "active_rows": batcher.active_rows,
                                          "max_rows": batcher.max_rows}}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": server.name, "object": "model", "created": server.created,
                                            "owned_by": "orchard", "root": server.path}]}

    @app.post("/collective_rpc")
    async def collective_rpc(body: dict[str, Any]) -> dict:
        if body.get("method") != "reload_weights":
            raise APIError(f"unsupported method {body.get('method')!r}; only 'reload_weights'")
        kwargs = body.get("kwargs") or {}
        if not isinstance(kwargs, dict) or set(kwargs) - {"weights_path"}:
            raise APIError(f"reload_weights takes only weights_path here, not {kwargs!r}")
        async with server.lock:
            started = time.perf_counter()
            try:
                await asyncio.to_thread(server.reload_weights, kwargs.get("weights_path"))
            except (OSError, ValueError, KeyError) as exc:
                raise APIError(f"reload failed: {exc}", 500, "server_error") from exc
        log.info("reloaded weights from %s in %.2f s", server.weights_path, time.perf_counter() - started)
        return {"results": [None]}

    @app.post("/pause")
    async def pause() -> dict:
        server.paused = True
        return {"status": "paused"}

    @app.post("/resume")
    async def resume() -> dict:
        server.paused = False
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict:
        return {"is_paused": server.paused}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        if (cache := server.engine.sampler.prefix_cache) is not None:
            cache.clear()
        return {"success": True}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest):
        server.check_open()
        server.check_model(request.model)
        thinking = (request.chat_template_kwargs or {}).get("enable_thinking", True)
        tools = request.tools if request.tool_choice != "none" else None
        if isinstance(request.tool_choice, dict):
            raise APIError("tool_choice may be 'auto' or 'none'; forcing a function is not supported")
        messages = (await asyncio.to_thread(server.chat_messages, request.messages)  # decodes images off the loop
                    if has_image_parts(request.messages) else server.chat_messages(request.messages))
        try:
            rendered = server.chat_format(thinking).render(messages, tools=tools, add_generation_prompt=True)
        except (ValueError, TypeError, KeyError) as exc:
            raise APIError(f"cannot render these messages: {exc}") from exc
        prompt, images = rendered.token_ids, _prompt_images(rendered)
        max_tokens = request.max_completion_tokens or request.max_tokens or DEFAULT_CHAT_MAX_TOKENS
        sampling = server.sampling(request, max_tokens)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": ident, "created": created, "model": server.name, "weight_version": server.weight_version}
        if request.stream:
            prompts = [prompt] * request.n
            return _stream_response(server, prompts, sampling,
                                    _chat_stream(server, request, prompts, sampling, head, images))
        completions = await _generate(server, [prompt] * request.n, sampling, images and images * request.n)
        head["weight_version"] = _sampled_version(completions, head["weight_version"])
        choices = []
        for index, completion in enumerate(completions):
            message, reason = _message(completion.text)
            choice = {"index": index, "message": message, "finish_reason": reason or completion.finish_reason,
                      "logprobs": None}
            if request.logprobs:
                choice["logprobs"] = {"content": server.token_logprobs(completion.token_ids, completion.logprobs,
                                                                       completion.alternatives)}
            if request.return_token_ids:
                choice["token_ids"] = completion.token_ids
            choices.append(choice)
        body = {**head, "object": "chat.completion", "choices": choices, "usage": _usage(prompt, completions)}
        if request.return_token_ids:
            body["prompt_token_ids"] = prompt
        return body

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        server.check_open()
        server.check_model(request.model)
        prompts = _prompt_ids(server.tokenizer, request.prompt)
        sampling = server.sampling(request, request.max_tokens)
        rows = [p for p in prompts for _ in range(request.n)]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": server.name,
                "weight_version": server.weight_version}
        if request.stream:
            return _stream_response(server, rows, sampling, _completion_stream(server, request, rows, sampling, head))
        results = await _generate(server, rows, sampling)
        head["weight_version"] = _sampled_version(results, head["weight_version"])
        choices = []
        for index, (prompt, completion) in enumerate(zip(rows, results, strict=True)):
            choice = {"index": index, "text": completion.text, "finish_reason": completion.finish_reason,
                      "logprobs": _completion_logprobs(server, completion.token_ids, completion.logprobs,
                                                       completion.alternatives)
                      if request.logprobs is not None else None}
            if request.return_token_ids:
                choice["prompt_token_ids"], choice["token_ids"] = prompt, completion.token_ids
            choices.append(choice)
        usage = {"prompt_tokens": sum(len(p) for p in prompts), "completion_tokens": sum(len(c.token_ids) for c in results)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {**head, "object": "text_completion", "choices": choices, "usage": usage}

    return app


def _prompt_ids(tokenizer: Tokenizer, prompt: str | list) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    ids = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]
    if not ids:
        raise APIError("no prompt")
    return ids


async def _generate(server: ModelServer, prompts: list[list[int]], sampling: SamplingParams,
                    images: PromptImages | None = None):
    _check(server, prompts, sampling)
    if server.batching and not images:
        return await server.engine.agenerate(prompts, sampling)
    async with server.lock:  # also keeps a reload from landing mid-request: the batcher's guard is not here
        return await asyncio.to_thread(server.engine.generate, prompts, sampling, images)


def _sampled_version(completions, default: int | None) -> int | None:
    """The version of the weights that sampled the completions (a reload may land while a request waits)."""
    return next((c.weight_version for c in completions if c.weight_version is not None), default)


def _usage(prompt: list[int], completions) -> dict[str, int]:
    generated = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": len(prompt), "completion_tokens": generated, "total_tokens": len(prompt) + generated}


def _completion_logprobs(server: ModelServer, token_ids: list[int], logprobs: list[float],
                         alternatives: Alternatives | None) -> dict[str, Any]:
    decode = server.tokenizer.decode
    tokens = [decode([t]) for t in token_ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    top = None if alternatives is None else [{decode([i]): value for i, value in step} for step in alternatives]
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets}


def _stream_response(server: ModelServer, prompts: list[list[int]], sampling: SamplingParams,
                     chunks: AsyncIterator[str]) -> StreamingResponse:
    _check(server, prompts, sampling)  # refuse before the 200 and the first chunk go out
    return StreamingResponse(chunks, media_type="text/event-stream")


def _check(server: ModelServer, prompts: list[list[int]], sampling: SamplingParams) -> None:
    try:
        server.engine.sampler.check(prompts, sampling)
        if server.batching and len(prompts) > server.engine.batcher.max_rows:
            raise ValueError(f"n ({len(prompts)}) exceeds the server's batch of {server.engine.batcher.max_rows} rows")
    except ValueError as exc:  # prompt too long for the context, and the like
        raise APIError(str(exc)) from exc


async def _streamed(server: ModelServer, prompts: list[list[int]], sampling: SamplingParams,
                    images: PromptImages | None = None):
    if server.batching and not images:
        async for delta in server.engine.astream(prompts, sampling):
            yield delta
        return
    async with server.lock:
        async for delta in _in_thread(server.engine.stream(prompts, sampling, chunk_tokens=1, images=images)):
            yield delta


async def _chat_stream(server: ModelServer, request: ChatRequest, prompts: list[list[int]],
                       sampling: SamplingParams, head: dict, images: PromptImages | None = None
                       ) -> AsyncIterator[str]:
    chunk = {**head, "object": "chat.completion.chunk"}
    texts = [""] * len(prompts)
    sent = [("", "")] * len(prompts)
    generated = 0
    for index in range(len(prompts)):
        first = {**chunk, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                       "finish_reason": None, "logprobs": None}]}
        if request.return_token_ids:
            first["prompt_token_ids"] = prompts[index]
        yield _sse(first)
    async for delta in _streamed(server, prompts, sampling, images and images * len(prompts)):
        generated += len(delta.token_ids)
        row = delta.row
        texts[row] += delta.text
        reasoning, content = _visible(texts[row])
        out: dict[str, Any] = {}
        if reasoning[len(sent[row][0]):]:
            out["reasoning_content"] = reasoning[len(sent[row][0]):]
        if content[len(sent[row][1]):]:
            out["content"] = content[len(sent[row][1]):]
        sent[row] = (max(reasoning, sent[row][0], key=len), max(content, sent[row][1], key=len))
        reason = None
        if delta.finish_reason is not None:
            message, reason = _message(texts[row])
            if message.get("tool_calls"):
                out["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            elif message["content"] and not message["content"].startswith(sent[row][1].strip()):
                out["content"] = message["content"]  # a malformed call: the raw text, as non-streamed
            reason = reason or delta.finish_reason
        if not out and reason is None and not request.logprobs and not request.return_token_ids:
            continue  # nothing to send (with token ids or logprobs, every token goes out)
        choice = {"index": row, "delta": out, "finish_reason": reason, "logprobs": None}
        if request.logprobs:
            choice["logprobs"] = {"content": server.token_logprobs(delta.token_ids, delta.logprobs, delta.alternatives)}
        if request.return_token_ids:
            choice["token_ids"] = delta.token_ids
        yield _sse({**chunk, "choices": [choice]})
    if request.include_usage:
        yield _sse({**chunk, "choices": [], "usage": {"prompt_tokens": len(prompts[0]), "completion_tokens": generated,
                                                       "total_tokens": len(prompts[0]) + generated}})
    yield _sse("[DONE]")


async def _completion_stream(server: ModelServer, request: CompletionRequest, prompts: list[list[int]],
                             sampling: SamplingParams, head: dict) -> AsyncIterator[str]:
    chunk = {**head, "object": "text_completion"}
    generated, started = 0, set()
    async for delta in _streamed(server, prompts, sampling):
        generated += len(delta.token_ids)
        choice = {"index": delta.row, "text": delta.text, "finish_reason": delta.finish_reason,
                  "logprobs": _completion_logprobs(server, delta.token_ids, delta.logprobs, delta.alternatives)
                  if request.logprobs is not None else None}
        if request.return_token_ids:
            choice["token_ids"] = delta.token_ids
            if delta.row not in started:  # the row's prompt, with its first chunk (as vLLM sends it)
                choice["prompt_token_ids"] = prompts[delta.row]
                started.add(delta.row)
        yield _sse({**chunk, "choices": [choice]})
    if request.include_usage:
        prompt_tokens = sum(len(p) for p in prompts)
        yield _sse({**chunk, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                                                       "total_tokens": prompt_tokens + generated}})
    yield _sse("[DONE]")
