"""``orchard serve`` driven by real clients: the ``openai`` SDK and litellm, against a real process.

Its tokens against transformers' greedy ones are checked on the shipped SmolLM2; everything else (chat
rendering and streaming, stop strings, errors, batching, ``n`` choices, top logprobs, litellm) on the session's
random one-layer policy over SmolLM2's tokenizer and chat template, sampled with a seed where text is wanted (its
greedy text is one token repeated). The random policy's programs compile in a fraction of the time: each prompt width, batch
shape and top-logprobs count is a program of its own, 7 to 19 s to compile for SmolLM2's 30 layers on 2 cores."""

from __future__ import annotations

import concurrent.futures
import json
import os

import httpx
import litellm
import numpy as np
import openai
import pytest

from orchard.data.chat import smollm2_format
from orchard.data.tokenizer import Tokenizer
from orchard.models.shipped import smollm2_gguf

GOLDEN = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models", "smollm2", "expected.npz")
MESSAGES = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(smollm2_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm2_server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def random_client(policy_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=policy_server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf())


def test_models_lists_the_served_model(random_client, policy_server):
    assert [m.id for m in random_client.models.list().data] == [policy_server.name]


def test_completions_from_token_ids_match_hf_generate(client, smollm2_server, tokenizer):
    expected = np.load(GOLDEN)
    prompt = expected["tokens"][0, :9].tolist()
    reply = client.completions.create(model=smollm2_server.name, prompt=prompt, max_tokens=16, temperature=0,
                                      logprobs=0, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert choice.model_extra["token_ids"] == expected["greedy_9"].tolist()  # HF transformers' greedy tokens
    assert choice.text == tokenizer.decode(expected["greedy_9"].tolist())
    assert len(choice.logprobs.token_logprobs) == 16 and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 16


def test_concurrent_requests_share_decode_steps_and_get_what_each_gets_alone(random_client, policy_server):
    tokens = np.load(GOLDEN)["tokens"][0].tolist()
    prompts = [tokens[:n] for n in (3, 6, 9, 12, 5, 8)]

    def complete(prompt: list[int]) -> list[int]:
        reply = random_client.completions.create(model=policy_server.name, prompt=prompt, max_tokens=10,
                                                 temperature=0, extra_body={"return_token_ids": True})
        return reply.choices[0].model_extra["token_ids"]

    alone = [complete(p) for p in prompts]
    health = policy_server.url.removesuffix("/v1") + "/health"
    before = httpx.get(health).json()["batch"]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(complete, prompts))
    after = httpx.get(health).json()["batch"]
    assert together == alone
    assert after["row_steps"] - before["row_steps"] > after["steps"] - before["steps"]  # rows shared steps
    assert after["active_rows"] == 0


def test_chat_renders_with_the_chat_format_and_streams_the_same_text(random_client, policy_server, tokenizer):
    """Sampled with a seed: the random policy's greedy text is one token repeated."""
    reply = random_client.chat.completions.create(model=policy_server.name, messages=MESSAGES, max_tokens=20,
                                                  temperature=1, seed=1, logprobs=True,
                                                  extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    rendered = smollm2_format(tokenizer).render(MESSAGES, add_generation_prompt=True).token_ids
    assert reply.model_extra["prompt_token_ids"] == rendered
    token_ids = choice.model_extra["token_ids"]
    assert len(choice.logprobs.content) == len(token_ids) == reply.usage.completion_tokens
    assert choice.message.content == tokenizer.decode(token_ids, skip_special_tokens=True).strip()
    assert choice.message.content and choice.message.role == "assistant"

    stream = random_client.chat.completions.create(model=policy_server.name, messages=MESSAGES, max_tokens=20,
                                                   temperature=1, seed=1, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [choice.finish_reason]
    assert chunks[-1].usage.completion_tokens == len(token_ids)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3  # token by token, not at once


def test_top_logprobs_are_the_most_likely_tokens(random_client, policy_server):
    reply = random_client.chat.completions.create(model=policy_server.name, messages=MESSAGES, max_tokens=6,
                                                  temperature=0, logprobs=True, top_logprobs=3)
    for entry in reply.choices[0].logprobs.content:
        values = [alternative.logprob for alternative in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].token == entry.token and values[0] == pytest.approx(entry.logprob, abs=1e-5)
    text = random_client.completions.create(model=policy_server.name, prompt="1, 2, 3,", max_tokens=4,
                                            temperature=0, logprobs=2).choices[0].logprobs
    assert all(len(top) == 2 and max(top.values()) == pytest.approx(lp, abs=1e-5)
               for top, lp in zip(text.top_logprobs, text.token_logprobs, strict=True))  # greedy: the best is taken


def test_completion_stream_with_a_stop_string(random_client, policy_server):
    kwargs = {"model": policy_server.name, "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 24, "temperature": 1,
              "seed": 1}
    full = random_client.completions.create(**kwargs).choices[0].text
    stop = full[4:7]
    streamed = list(random_client.completions.create(stream=True, stop=[stop], **kwargs))
    assert "".join(c.choices[0].text for c in streamed) == full[: full.index(stop)]
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_litellm_talks_to_the_server(random_client, policy_server):
    """litellm is the layer mini-swe-agent calls models through."""
    expected = random_client.chat.completions.create(model=policy_server.name, messages=MESSAGES, max_tokens=12,
                                                     temperature=0).choices[0].message.content
    reply = litellm.completion(model=f"openai/{policy_server.name}", api_base=policy_server.url,
                               api_key="unused", messages=MESSAGES, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected
    streamed = litellm.completion(model=f"openai/{policy_server.name}", api_base=policy_server.url,
                                  api_key="unused", messages=MESSAGES, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed).strip() == expected


def test_bad_requests_get_openai_errors(random_client, policy_server):
    client, name = random_client, policy_server.name
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=name, prompt="hi", max_tokens=100_000)
    with pytest.raises(openai.BadRequestError, match="n"):
        client.chat.completions.create(model=name, messages=MESSAGES, n=100)
    with pytest.raises(openai.BadRequestError, match="Qwen3Format"):  # SmolLM2's ChatML has no tool syntax
        client.chat.completions.create(model=name, messages=MESSAGES, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}])
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.completions.create(model=name, prompt=[10**9], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="takes no images"):
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}])
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=name, messages=MESSAGES, logprobs=True, top_logprobs=30)
    raw = httpx.post(f"{policy_server.url}/chat/completions", content=b"{not json", timeout=10,
                     headers={"content-type": "application/json"})
    assert raw.status_code == 400 and "message" in raw.json()["error"]
    assert policy_server.process.poll() is None  # and the server is still up
    assert client.models.list().data


def test_n_choices_sample_independently(random_client, policy_server):
    reply = random_client.chat.completions.create(model=policy_server.name, messages=MESSAGES, max_tokens=8,
                                                  temperature=1.5, n=3, seed=7)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) > 1
    again = random_client.chat.completions.create(model=policy_server.name, messages=MESSAGES, max_tokens=8,
                                                  temperature=1.5, n=3, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in reply.choices]
    assert json.loads(reply.model_dump_json())["usage"]["completion_tokens"] > 0


SCRIPTED_CALL = ('<think>\nThe user wants the files.\n</think>\n\nLet me look.\n<tool_call>\n'
                 '{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>')


@pytest.fixture
def scripted(qwen3_dir, monkeypatch):
    """An in-process server whose sampler emits a chosen text token by token.

    A random tiny model never writes a tool call, so this is how the parsing and streaming of
    reasoning and tool calls is tested; everything after the sampler (detokenising, stop handling,
    parsing, the OpenAI wire format) is the real code.
    """
    from orchard.rollout.server import ModelServer, create_app
    from orchard.rollout.types import StreamDelta

    server = ModelServer(qwen3_dir, name="scripted", max_batch_rows=0, dtype="float32")
    script = {"text": SCRIPTED_CALL}

    def stream(prompts, params, chunk_tokens=1, images=None):  # the sampler's signature
        ids = [*server.tokenizer.encode(script["text"]), server.tokenizer.eos_id]
        for step, token in enumerate(ids):
            last = step == len(ids) - 1
            for row in range(len(prompts)):
                yield StreamDelta(row, [token], [-0.5], "stop" if last else None)

    monkeypatch.setattr(server.engine.sampler, "stream", stream)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)), base_url="http://scripted")
    return openai.AsyncOpenAI(base_url="http://scripted/v1", api_key="unused", http_client=http), script


async def test_tool_calls_and_reasoning_are_parsed(scripted):
    client, _ = scripted
    reply = await client.chat.completions.create(model="scripted", messages=MESSAGES, max_tokens=64)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me look." and message.model_extra["reasoning_content"] == "The user wants the files."
    [call] = message.tool_calls
    assert call.type == "function" and call.function.name == "bash" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"command": "ls -la"}


async def test_streamed_tool_calls_never_leak_tags_into_content(scripted):
    client, _ = scripted
    chunks = [c async for c in await client.chat.completions.create(model="scripted", messages=MESSAGES,
                                                                     max_tokens=64, stream=True)]
    deltas = [c.choices[0].delta for c in chunks]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert reasoning == "The user wants the files." and content.strip() == "Let me look."
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(0, "bash", {"command": "ls -la"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert sum(1 for d in deltas if d.model_extra.get("reasoning_content")) > 1  # reasoning streams too


async def test_a_malformed_tool_call_comes_back_as_text(scripted):
    client, script = scripted
    script["text"] = 'Running it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"</tool_call>'
    reply = await client.chat.completions.create(model="scripted", messages=MESSAGES, max_tokens=64)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == script["text"]  # the harness sees (and can count) the bad call
