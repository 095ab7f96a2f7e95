"""``EnginePolicy`` holds as many generations in flight as its ``concurrency`` says, whatever the size of
asyncio's default thread pool (``min(32, cpus + 4)``): over ``OpenAIEngine``'s async face against a fake
vLLM that holds every request until all are in, and over a blocking engine in the policy's own threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import aiohttp.web
import pytest

from orchard.data.trajectory import Message
from orchard.harness import Conversation, EnginePolicy
from orchard.rollout.engine import has_native_async
from orchard.rollout.openai_client import RetryPolicy
from orchard.rollout.openai_engine import OpenAIEngine
from orchard.rollout.types import Completion, SamplingParams
from tests.rollout.test_vllm_fake import completions_reply

EPISODES = 200
HOLD_SECONDS = 30  # a bound on the wait for all requests, not a timing assertion: past it, all are answered


def sampled(prompt: list[int], n: int) -> list[int]:
    """The ids the fake samples for ``prompt``: a function of it, so each episode can check it got its own."""
    return [sum(prompt) % 1000 + k for k in range(n)]


class HeldVLLM:
    """vLLM's ``/v1/completions`` on loopback (aiohttp) that answers no request until ``hold`` are in flight
    (or ``HOLD_SECONDS`` passed), and records the most it saw at once."""

    def __init__(self, hold: int) -> None:
        self.hold, self.in_flight, self.most = hold, 0, 0
        self.full = asyncio.Event()
        self.prompts: list[list[int]] = []

    async def completions(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        self.prompts.extend(body["prompt"])
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight >= self.hold:
            self.full.set()
        try:
            try:
                await asyncio.wait_for(self.full.wait(), HOLD_SECONDS)
            except TimeoutError:
                self.full.set()  # fewer came at once than were asked for: answer them all, and let the test fail
            return aiohttp.web.json_response(completions_reply(body, sampled))
        finally:
            self.in_flight -= 1


@pytest.fixture
async def held() -> AsyncIterator[tuple[HeldVLLM, str]]:
    fake = HeldVLLM(EPISODES)
    app = aiohttp.web.Application()
    app.router.add_post("/v1/completions", fake.completions)
    runner = aiohttp.web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield fake, f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def conversation(i: int) -> Conversation:
    return Conversation(messages=[Message(role="system", content="You are terse."),
                                  Message(role="user", content=f"Task number {i}.")], seed=i)


async def test_two_hundred_episodes_have_their_generations_in_flight_at_once(held, chat_format):
    fake, url = held
    engine = OpenAIEngine(url, "policy", retry=RetryPolicy(max_retries=0))
    engine.weight_version = 7
    assert has_native_async(engine)
    policy = EnginePolicy(engine, chat_format, SamplingParams(max_tokens=3, temperature=1.0),
                          concurrency=EPISODES)
    conversations = [conversation(i) for i in range(EPISODES)]
    try:
        turns = await asyncio.gather(*[policy.act(c) for c in conversations])
    finally:
        await engine.aclose()
        policy.close()
    assert fake.most == EPISODES  # not asyncio's 6 (or 32) threads, nor aiohttp's 100 connections
    assert policy._pool is None  # no thread was needed
    for c, turn in zip(conversations, turns, strict=True):
        prompt = chat_format.render([m.to_chat() for m in c.messages], add_generation_prompt=True).token_ids
        assert turn.message.token_ids == sampled(prompt, 3) and turn.message.logprobs == [-0.5] * 3
        assert turn.message.weight_version == 7 and turn.prompt_tokens == len(prompt)
        assert turn.finish_reason == "length" and turn.message.content == "xxx"
    assert len({tuple(t.message.token_ids) for t in turns}) > 1 and len(fake.prompts) == EPISODES


class BarrierEngine:
    """A blocking engine whose every call waits until ``parties`` calls are in at once."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=HOLD_SECONDS)
        self.threads: set[str] = set()

    def generate(self, prompts, sampling: SamplingParams) -> list[Completion]:
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()  # raises BrokenBarrierError if fewer than ``parties`` ever run at once
        return [Completion(token_ids=[1, 2], logprobs=[-0.1, -0.2], finish_reason="stop", weight_version=3)
                for _ in prompts]

    def update_weights(self, weights) -> None:
        raise NotImplementedError


async def test_a_blocking_engine_runs_in_the_policys_own_threads_as_many_as_its_concurrency(chat_format):
    parties = 40  # more than asyncio's default pool has on any machine with under 32 cores
    engine = BarrierEngine(parties)
    policy = EnginePolicy(engine, chat_format, SamplingParams(max_tokens=3), name="blocking", concurrency=parties)
    assert not has_native_async(engine)
    turns = await asyncio.gather(*[policy.act(conversation(i)) for i in range(parties)])
    assert {t.message.weight_version for t in turns} == {3} and len(engine.threads) == parties
    assert all(name.startswith("policy-blocking") for name in engine.threads)
    pool = policy._pool
    policy.close()
    assert policy._pool is None and pool._shutdown
    await policy.aclose()  # closing twice is harmless
