"""OpenAIEngine against a real ``orchard serve`` process: token ids in and out, and weight reloads."""

from __future__ import annotations

import os
import re

import httpx
import numpy as np
import openai
import pytest

from orchard.data.chat import Qwen3Format
from orchard.data.tokenizer import Tokenizer
from orchard.models.weights import ModelWeights
from orchard.rollout.engine import RolloutEngine
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
from orchard.rollout.types import SamplingParams
from tests.rollout.conftest import tiny_qwen3

PROMPTS = [[9707, 11, 1879, 0], [785, 6722, 315, 9625, 374, 12095, 13, 576]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def _same(remote, local) -> None:
    assert [c.token_ids for c in remote] == [c.token_ids for c in local]
    for r, c in zip(remote, local, strict=True):
        np.testing.assert_allclose(r.logprobs, c.logprobs, atol=1e-4)
        assert r.finish_reason == c.finish_reason


def test_token_ids_round_trip_and_match_the_in_process_engine(qwen3_server):
    engine: RolloutEngine = OpenAIEngine(qwen3_server.url, qwen3_server.name)
    sampling = SamplingParams(max_tokens=8, temperature=1.0, top_k=50, seed=3)
    _same(engine.generate(PROMPTS, GREEDY), JaxEngine(tiny_qwen3(seed=0)).generate(PROMPTS, GREEDY))
    _same(engine.generate(PROMPTS, sampling), JaxEngine(tiny_qwen3(seed=0)).generate(PROMPTS, sampling))


def test_weight_updates_are_versioned_directories_the_server_reloads_from(qwen3_server, qwen3_dir):
    engine = OpenAIEngine(qwen3_server.url, qwen3_server.name, weight_sync=ReloadFromDisk(qwen3_dir))
    before = engine.generate(PROMPTS, GREEDY)
    stamp = os.stat(os.path.join(qwen3_dir, "model.safetensors")).st_mtime_ns
    trained = tiny_qwen3(seed=1)
    engine.update_weights(ModelWeights.of(trained, version=1))
    after = engine.generate(PROMPTS, GREEDY)
    assert {c.weight_version for c in after} == {1}
    _same(after, JaxEngine(trained).generate(PROMPTS, GREEDY))
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert os.stat(os.path.join(qwen3_dir, "model.safetensors")).st_mtime_ns == stamp  # the served files stay
    version = os.path.join(qwen3_dir, "v1")
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(os.listdir(version))
    assert httpx.get(qwen3_server.url.removesuffix("/v1") + "/is_paused").json() == {"is_paused": False}
    for step in (2, 3):  # back to the module's weights; only the newest two versions stay
        engine.update_weights(ModelWeights.of(tiny_qwen3(seed=0), version=step))
    assert sorted(n for n in os.listdir(qwen3_dir) if re.fullmatch(r"v\d+|\..*", n)) == ["v2", "v3"]
    _same(engine.generate(PROMPTS, GREEDY), before)
    assert {c.weight_version for c in engine.generate(PROMPTS, GREEDY)} == {3}


def test_update_without_a_weight_sync_is_a_clear_error(qwen3_server):
    with pytest.raises(RuntimeError, match="weight_sync"):
        OpenAIEngine(qwen3_server.url, qwen3_server.name).update_weights(ModelWeights.of(tiny_qwen3(seed=0)))


def test_qwen3_chat_prompt_carries_the_tools_and_the_thinking_switch(qwen3_server, qwen3_dir):
    client = openai.OpenAI(base_url=qwen3_server.url, api_key="unused", max_retries=0)
    tokenizer = Tokenizer.from_pretrained(qwen3_dir)
    messages = [{"role": "user", "content": "List the files."}]
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    for thinking in (True, False):
        reply = client.chat.completions.create(
            model=qwen3_server.name, messages=messages, tools=tools, max_tokens=4, temperature=0,
            extra_body={"return_token_ids": True, "chat_template_kwargs": {"enable_thinking": thinking}})
        expected = Qwen3Format(tokenizer, thinking=thinking).render(messages, tools=tools, add_generation_prompt=True)
        assert reply.model_extra["prompt_token_ids"] == expected.token_ids
    none = client.chat.completions.create(model=qwen3_server.name, messages=messages, tools=tools, tool_choice="none",
                                          max_tokens=4, temperature=0, extra_body={"return_token_ids": True})
    assert "<tools>" not in tokenizer.decode(none.model_extra["prompt_token_ids"])
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model=qwen3_server.name, messages=messages, tools=tools,
                                       tool_choice={"type": "function", "function": {"name": "bash"}})
