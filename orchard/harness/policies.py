"""Policies: what writes the assistant turns of a run.

- :class:`EnginePolicy` drives a :class:`~orchard.rollout.engine.RolloutEngine` with token ids. It
  renders the conversation incrementally with a :class:`~orchard.data.chat.ChatFormat` (each turn
  is tokenised once and cached in the episode's :class:`~orchard.harness.core.Conversation`),
  samples, and keeps on the assistant message the sampled ids and their logprobs, the weight
  version that sampled them, and the length and digest of the prompt, so the next prompt is built
  from the ids the model produced, training never re-tokenises them, and every training row can
  be checked against the prompt its tokens were sampled under. It parses the text with the
  format's parser: ``<think>`` reasoning always, tool calls only when the harness offers tools.
  Up to its ``concurrency`` generations are in flight at once: awaited on the event loop when the
  engine has a native async face (``OpenAIEngine``), else in a pool of threads of its own.
- :class:`OpenAIChatPolicy` talks to any OpenAI-compatible ``/v1/chat/completions`` endpoint
  (vLLM, ``orchard serve``, hosted APIs) through :class:`~orchard.rollout.openai_client.OpenAIClient`.
  The server renders the chat and parses tool calls; sampled ids and logprobs are recorded when the
  server returns them (vLLM's ``return_token_ids`` extension, ``logprobs: true``), which hosted APIs
  do not.

Both are stateless across episodes, so one instance can serve many concurrent runs. Each turn's
sampling seed is :func:`~orchard.seeds.turn_seed` of the policy's seed, the episode's and
the turn number.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import dataclasses
import functools
import json
import threading
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from orchard.data.chat import ChatFormat, Rendered
from orchard.data.examples import ContextView
from orchard.data.images import ImageStore, recent_images
from orchard.data.trajectory import Message, ToolCall, token_digest
from orchard.harness.core import ContextLimitExceeded, Conversation, Turn
from orchard.rollout.engine import RolloutEngine, has_native_async
from orchard.rollout.openai_client import OpenAIClient, OpenAIError, RetryPolicy
from orchard.rollout.types import SamplingParams
from orchard.seeds import turn_seed


class PolicyError(RuntimeError):
    """The model behind a policy could not produce a turn (a server error, an unusable reply)."""


class EnginePolicy:
    """A policy over a rollout engine and a chat format (with its tokenizer).

    ``sampling`` is the per-turn sampling; its ``max_tokens`` is further capped by the room left
    under the run's token budget, the chat format's end-of-turn tokens are added to its stop ids,
    and its seed is combined with the episode's seed and the turn number.

    ``concurrency`` is how many generations may be in flight at once, and nothing else caps them.
    An engine with a native async face (:func:`~orchard.rollout.engine.has_native_async`:
    ``OpenAIEngine`` over vLLM) is awaited on the event loop, at most ``concurrency`` calls at a time
    (per event loop), so one process holds hundreds of episodes' requests with no thread each. Any
    other engine's blocking ``generate`` (and every call with images) runs in the policy's own pool of
    ``concurrency`` threads, made on first use and shut down by :meth:`close`, so the event loop keeps
    serving other episodes and asyncio's default executor (``min(32, cpus + 4)`` threads) never caps
    it. 1 suits the in-process ``JaxEngine`` without a batcher, which ``make_policy`` builds: each call
    decodes its own batch, so concurrent calls would not share decode steps (a ``JaxEngine`` with
    ``max_batch_rows`` does batch concurrent calls together, and takes more).

    ``view`` chooses what a turn's prompt shows of the conversation (default: all of it, rendered
    incrementally). A view that drops or rewrites earlier messages (keeping only the latest
    screenshot, say: :func:`~orchard.data.examples.latest_images`) renders each prompt whole; its
    turns are then not prefixes of one another, and only per-turn training rows built with the same
    view can train on them.

    Images: a prompt whose messages carry screenshots needs a chat format with image tokens
    (``qwen3_vl``) and the ``images`` store they were saved in; the engine gets their pixels beside
    the prompt ids (``engine.generate(prompts, sampling, images=...)``, which ``JaxEngine`` takes). A
    text-only policy on such a conversation shows none: ``view=latest_images(0)``.
    """

    def __init__(self, engine: RolloutEngine, chat_format: ChatFormat,
                 sampling: SamplingParams = SamplingParams(max_tokens=4096, temperature=1.0), *,
                 name: str = "engine", concurrency: int = 1, view: ContextView | None = None,
                 images: ImageStore | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.engine, self.format, self.name, self.view, self.images = engine, chat_format, name, view, images
        self.tokenizer = chat_format.tokenizer
        stops = tuple(dict.fromkeys([*sampling.stop_token_ids, *chat_format.end_of_turn_ids]))
        self.sampling = dataclasses.replace(sampling, stop_token_ids=stops)
        self.concurrency = concurrency
        self._native_async = has_native_async(engine)
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = \
            weakref.WeakKeyDictionary()  # an asyncio semaphore belongs to one loop
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        rendered = self._prompt(conversation)
        prompt, pixels = rendered.token_ids, self._pixels(rendered)
        max_new = self.sampling.max_tokens
        if max_context is not None:
            room = max_context - len(prompt)
            if room <= 0:
                raise ContextLimitExceeded(f"the prompt has {len(prompt)} tokens; the budget is {max_context}")
            max_new = min(max_new, room)
        turn_number = sum(m.role == "assistant" for m in conversation.messages)
        sampling = dataclasses.replace(self.sampling, max_tokens=max_new,
                                       seed=turn_seed(self.sampling.seed, conversation.seed, turn_number))
        completions = await self._generate(prompt, sampling, pixels)
        if len(completions) != 1:
            raise PolicyError(f"the engine returned {len(completions)} completions for one prompt")
        [completion] = completions
        ids = list(completion.token_ids)
        text = completion.text if completion.text is not None else self.tokenizer.decode(ids, skip_special_tokens=True)
        sampled = {"token_ids": ids, "logprobs": list(completion.logprobs), "prompt_tokens": len(prompt),
                   "prompt_digest": token_digest(prompt), "weight_version": completion.weight_version}
        message, errors = self._assistant_message(text, bool(conversation.tools), sampled)
        return Turn(message=message, prompt_tokens=len(prompt),
                    completion_tokens=len(ids), finish_reason=completion.finish_reason, errors=errors)

    async def _generate(self, prompt: list[int], sampling: SamplingParams, pixels: list) -> list:
        """The engine's completions of ``prompt``: awaited on the loop, or in the policy's threads."""
        if self._native_async and not pixels:
            loop = asyncio.get_running_loop()
            if (gate := self._gates.get(loop)) is None:
                gate = self._gates[loop] = asyncio.Semaphore(self.concurrency)
            async with gate:
                return await self.engine.agenerate([prompt], sampling)
        call = (functools.partial(self.engine.generate, [prompt], sampling, images=[pixels]) if pixels
                else functools.partial(self.engine.generate, [prompt], sampling))
        context = contextvars.copy_context()  # as asyncio.to_thread does
        return await asyncio.get_running_loop().run_in_executor(self._threads(), context.run, call)

    def _threads(self) -> ThreadPoolExecutor:
        """The policy's pool of ``concurrency`` threads for blocking ``generate`` calls (made on first use)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"policy-{self.name}")
            return self._pool

    def close(self) -> None:
        """Shut the policy's threads down (calls running finish; queued ones are cancelled). The policy
        stays usable: a later blocking call makes a new pool. The engine is the caller's to close."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        """:meth:`close`, under the name :class:`OpenAIChatPolicy` closes by."""
        self.close()

    def _pixels(self, rendered: Rendered) -> list:
        """The decoded images of a rendered prompt with where their placeholders start (a sampled turn
        may hold the image token as text: the engine must not take it for an image)."""
        if rendered.images and self.images is None:
            raise PolicyError("the prompt shows images but the policy has no image store to read them from")
        return [(self.images.pixels(image.image), image.start) for image in rendered.images]

    def _prompt(self, conversation: Conversation) -> Rendered:
        """The prompt ids: the conversation (or its ``view``) rendered, plus a generation prompt.

        Without a view the rendering is cached and extended by the messages added since (the cache
        stays a closed conversation; the generation prompt goes on a copy)."""
        messages = conversation.messages
        if self.view is not None:
            shown = [m.to_chat() for m in self.view(messages)]
            return self.format.render(shown, conversation.tools, add_generation_prompt=True)
        key = ("EnginePolicy", id(self))
        rendered, count = conversation.state.get(key, (None, 0))
        if rendered is None or count > len(messages):
            rendered, count = self.format.render([m.to_chat() for m in messages], conversation.tools), len(messages)
        for message in messages[count:]:
            self.format.append(rendered, message.to_chat())
        conversation.state[key] = (rendered, len(messages))
        return self.format.generation_prompt(rendered.copy())

    def _assistant_message(self, text: str, tools_offered: bool, sampled: dict[str, Any]) -> tuple[Message, list[str]]:
        """Reasoning, content and tool calls from generated text, and the parse errors met.

        Without tools, ``<tool_call>`` text stays in the content (the harness's syntax decides what it
        means). With tools, a malformed call keeps the raw text as content and no calls, as ``orchard
        serve`` and vLLM answer, so the harness sees and counts it.
        """
        parsed = self.format.parse(text)
        fields = {"role": "assistant", "reasoning": parsed.reasoning, **sampled}
        after_think = text.split("</think>", 1)[1] if parsed.reasoning is not None else text
        if not tools_offered or parsed.errors:
            return Message(content=after_think.strip(), **fields), parsed.errors if tools_offered else []
        calls = [call.model_copy(update={"id": f"call_{uuid.uuid4().hex[:24]}"}) for call in parsed.tool_calls]
        return Message(content=parsed.content, tool_calls=calls, **fields), []


class OpenAIChatPolicy:
    """A policy over an OpenAI-compatible chat-completions endpoint.

    ``base_url`` ends in ``/v1``. ``logprobs`` and ``return_token_ids`` ask for the sampled tokens'
    logprobs and ids (vLLM and ``orchard serve`` support both; hosted APIs reject the second).
    ``extra_body`` is merged into every request (``chat_template_kwargs``, ``top_k``, ...). Requests
    are retried as :class:`~orchard.rollout.openai_client.RetryPolicy` says (``max_retries``).
    Pass ``http_client`` to reuse a pool (its base URL is ignored; requests go to ``base_url``).

    The token budget is checked after each turn from the server's ``usage``; the server is not
    asked to stop early, because the prompt length is not known before it renders the chat.

    Images: with an ``images`` store, the screenshots of the last ``context_images`` user messages
    that carry any are sent as ``image_url`` parts (data URIs) after the message's text; earlier ones
    are left out of the request (the paper keeps k = 1), as are all without a store.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str = "EMPTY", max_tokens: int = 4096,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, logprobs: bool = False,
                 return_token_ids: bool = False, send_reasoning: bool = True,
                 extra_body: dict[str, Any] | None = None, timeout: float = 600.0, max_retries: int = 2,
                 http_client: httpx.AsyncClient | None = None, name: str | None = None,
                 images: ImageStore | None = None, context_images: int | None = 1) -> None:
        if max_tokens < 1 or temperature < 0 or not 0 < top_p <= 1 or max_retries < 0:
            raise ValueError("invalid sampling settings: need max_tokens >= 1, temperature >= 0, 0 < top_p <= 1 "
                             "and max_retries >= 0")
        self.client = OpenAIClient(base_url, api_key, timeout=timeout, retry=RetryPolicy(max_retries=max_retries),
                                   http_client=http_client)
        self.model, self.name = model, name or model
        self.settings = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
        self.seed, self.logprobs, self.return_token_ids = seed, logprobs, return_token_ids
        self.send_reasoning, self.extra_body = send_reasoning, dict(extra_body or {})
        self.images, self.context_images = images, context_images

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        shown = recent_images(conversation.messages, self.context_images) if self.images is not None else set()
        body: dict[str, Any] = {"model": self.model, **self.settings,
                                "messages": [self._wire(m, i in shown) for i, m in enumerate(conversation.messages)]}
        if conversation.tools:
            body["tools"] = conversation.tools
        if self.seed is not None:
            body["seed"] = turn_seed(self.seed, conversation.seed,
                                     sum(m.role == "assistant" for m in conversation.messages))
        if self.logprobs:
            body["logprobs"] = True
        if self.return_token_ids:
            body["return_token_ids"] = True
        body.update(self.extra_body)
        try:
            reply = await self.client.apost("/v1/chat/completions", body)
        except OpenAIError as exc:
            raise PolicyError(str(exc)) from exc
        try:
            return self._turn(reply)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PolicyError(f"unusable chat-completions reply ({exc!r}): {json.dumps(reply)[:500]}") from exc

    def _wire(self, message: Message, with_images: bool = False) -> dict[str, Any]:
        """The OpenAI request shape of a message (tool-call arguments as JSON strings; a user
        message's images as ``image_url`` parts when ``with_images``)."""
        wire: dict[str, Any] = {"role": message.role, "content": message.content}
        if with_images and message.role == "user" and self.images is not None:
            wire["content"] = [{"type": "text", "text": message.content}, *(
                {"type": "image_url", "image_url": {"url": f"data:{ref.media_type};base64,"
                                                           + base64.b64encode(self.images.read(ref)).decode()}}
                for ref in message.images)]
        if message.role == "assistant":
            if message.reasoning is not None and self.send_reasoning:
                wire["reasoning_content"] = message.reasoning
            if message.tool_calls:
                wire["tool_calls"] = [
                    {"id": call.id, "type": "function",
                     "function": {"name": call.name, "arguments": call.arguments if isinstance(call.arguments, str)
                                  else json.dumps(call.arguments, ensure_ascii=False)}}
                    for call in message.tool_calls]
        if message.role == "tool":
            wire["tool_call_id"] = message.tool_call_id
        return wire

    def _turn(self, reply: dict[str, Any]) -> Turn:
        choice = reply["choices"][0]
        wire = choice["message"]
        errors, calls = [], []
        for call in wire.get("tool_calls") or []:
            function = call["function"]
            arguments = function.get("arguments") or "{}"
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError as exc:
                    errors.append(f"the arguments of {function['name']} are not JSON: {exc.msg}")
            if not isinstance(arguments, dict | str):
                errors.append(f"the arguments of {function['name']} are not a JSON object")
                arguments = json.dumps(arguments)
            calls.append(ToolCall(id=call.get("id") or f"call_{uuid.uuid4().hex[:24]}", name=function["name"],
                                  arguments=arguments))
        token_ids = choice.get("token_ids")
        logprobs = None
        if isinstance(choice.get("logprobs"), dict) and choice["logprobs"].get("content") is not None:
            logprobs = [float(entry["logprob"]) for entry in choice["logprobs"]["content"]]
        if token_ids is None or (logprobs is not None and len(logprobs) != len(token_ids)):
            logprobs = None  # logprobs are only kept beside the ids they belong to
        message = Message(role="assistant", content=wire.get("content") or "",
                          reasoning=wire.get("reasoning_content") or wire.get("reasoning"), tool_calls=calls,
                          token_ids=list(token_ids) if token_ids is not None else None, logprobs=logprobs)
        usage = reply.get("usage") or {}
        return Turn(message=message, prompt_tokens=usage.get("prompt_tokens"),
                    completion_tokens=usage.get("completion_tokens"), finish_reason=choice.get("finish_reason"),
                    errors=errors)

    async def aclose(self) -> None:
        await self.client.aclose()
