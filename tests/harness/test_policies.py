"""``OpenAIChatPolicy`` against ``orchard serve``'s real chat-completions app.

The app is Orchard's own server code (rendering, tool-call parsing, logprobs, token ids, errors);
only its engine is scripted, since a random tiny model never writes a tool call. It is reached
in-process through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import AsyncIterator

import httpx
import pytest

from orchard.data.chat import Qwen3Format
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Message, ToolCall
from orchard.harness import (
    CodeActHarness,
    Conversation,
    FormatError,
    FunctionTask,
    OpenAIChatPolicy,
    PolicyError,
    run_episode,
)
from orchard.rollout.server import ModelServer, create_app
from tests.harness.scripted import REPO, ScriptedEngine, call, make_repo


class ScriptedModelServer(ModelServer):
    """``orchard serve``'s model server with a scripted engine in place of a JAX model."""

    def __init__(self, engine: ScriptedEngine, tokenizer: Tokenizer) -> None:
        self.path = self.name = "scripted"
        self.overrides = {}
        self.tokenizer, self.engine = tokenizer, engine
        self.lock = asyncio.Lock()
        self.created, self.paused = 0, False
        self.end_ids = (tokenizer.token_id("<|im_end|>"), tokenizer.eos_id)
        engine.sampler = types.SimpleNamespace(check=lambda prompts, sampling: None)

    def chat_format(self, thinking: bool) -> Qwen3Format:
        return Qwen3Format(self.tokenizer, thinking=thinking)


@pytest.fixture
async def served(tokenizer) -> AsyncIterator[tuple[ScriptedEngine, httpx.AsyncClient]]:
    engine = ScriptedEngine(tokenizer, [], text=True)
    app = create_app(ScriptedModelServer(engine, tokenizer))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        yield engine, http


async def test_a_codeact_run_over_chat_completions_records_ids_and_logprobs(aclient, served, tokenizer):
    engine, http = served
    engine.replies = [
        "<think>\nWhere is add?\n</think>\n\n" + call("str_replace_editor", command="view", path=f"{REPO}/calc.py"),
        call("str_replace_editor", command="str_replace", path=f"{REPO}/calc.py", old_str="a - b", new_str="a + b"),
        "Done.\n" + call("finish", message="fixed"),
    ]
    policy = OpenAIChatPolicy("http://scripted/v1", "scripted", logprobs=True, return_token_ids=True, seed=5,
                              http_client=http)
    trajectory = await run_episode(aclient, CodeActHarness(), policy, FunctionTask("add", "Fix add.", make_repo))

    assert trajectory.outcome.status == "completed" and trajectory.policy == "scripted"
    assert "+    return a + b" in trajectory.metadata["submission"]
    assistants = trajectory.messages[2::2]
    assert assistants[0].reasoning == "Where is add?" and assistants[2].content == "Done."
    for message in assistants:
        [tool_call] = message.tool_calls
        assert tool_call.id.startswith("call_") and isinstance(tool_call.arguments, dict)
        assert message.token_ids[-1] == tokenizer.token_id("<|im_end|>")
        assert message.logprobs == [-0.05 - 0.01 * (i % 7) for i in range(len(message.token_ids))]
    assert trajectory.messages[3].tool_call_id == assistants[0].tool_calls[0].id
    assert trajectory.metadata["prompt_tokens"] == sum(len(p) for p in engine.prompts)
    # The server rendered our messages: the tool call as JSON and the observation as a tool response.
    second = tokenizer.decode(engine.prompts[1])
    assert '{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/workspace/repo/calc.py"}}' \
        in second
    assert "<tool_response>\nHere's the result of running `cat -n` on /workspace/repo/calc.py:" in second
    assert len({s.seed for s in engine.samplings}) == 3


async def test_a_call_the_server_could_not_parse_is_a_format_error(served):
    engine, http = served
    engine.replies = ['Let me run it.\n<tool_call>\n{"name": "execute_bash", "arguments": {"command": </tool_call>']
    policy = OpenAIChatPolicy("http://scripted/v1", "scripted", http_client=http)
    harness = CodeActHarness()
    conversation = Conversation([Message(role="system", content="s"), Message(role="user", content="u")],
                                tools=harness.tools)
    turn = await policy.act(conversation)
    assert not turn.message.tool_calls and turn.message.token_ids is None and turn.prompt_tokens > 0
    with pytest.raises(FormatError, match="could not be parsed"):
        harness.parse(turn)


async def test_server_errors_raise_policy_errors(served):
    _, http = served
    policy = OpenAIChatPolicy("http://scripted/v1", "no-such-model", http_client=http)
    with pytest.raises(PolicyError, match="answered 404"):
        await policy.act(Conversation([Message(role="user", content="hi")]))


def test_messages_go_out_in_the_openai_shape():
    policy = OpenAIChatPolicy("http://unused/v1", "m", send_reasoning=False)
    assistant = Message(role="assistant", content="", reasoning="hmm",
                        tool_calls=[ToolCall(id="c1", name="finish", arguments={"message": "ok"})])
    assert policy._wire(assistant) == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "finish", "arguments": json.dumps({"message": "ok"})}}]}
    assert policy._wire(Message(role="tool", content="out", tool_call_id="c1")) == \
        {"role": "tool", "content": "out", "tool_call_id": "c1"}
    with pytest.raises(ValueError, match="invalid sampling settings"):
        OpenAIChatPolicy("http://unused/v1", "m", top_p=0)
