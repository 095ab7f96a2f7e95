"""Tokenizer and ChatML rendering against transformers (golden file), masks and parsing."""

from __future__ import annotations

import json
import os

import pytest

from orchard.data.chat import ChatMLFormat, Rendered, Source, parse_assistant, smollm2_format
from orchard.data.tokenizer import Tokenizer
from orchard.rollout.bench import smollm2_gguf

GOLDEN = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "chat", "smollm2.json")


@pytest.fixture(scope="module")
def golden() -> dict:
    with open(GOLDEN) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf())


def test_gguf_tokenizer_matches_transformers(tokenizer, golden):
    assert tokenizer.vocab_size == 49152 and tokenizer.eos_token == "<|im_end|>"
    for text, ids in golden["encode"].items():
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids) == text


def test_special_tokens_are_not_recognised_in_text(tokenizer):
    ids = tokenizer.encode("<|im_end|>")
    assert tokenizer.token_id("<|im_end|>") not in ids and len(ids) > 1


def test_chatml_rendering_matches_apply_chat_template(tokenizer, golden):
    chat = smollm2_format(tokenizer)
    for case in golden["chat"]:
        rendered = chat.render(case["messages"], add_generation_prompt=case["add_generation_prompt"])
        assert rendered.token_ids == case["ids"], case["messages"]
        assert len(rendered.sources) == len(rendered.token_ids)


def test_rendering_is_incremental(tokenizer, golden):
    chat = smollm2_format(tokenizer)
    messages = golden["chat"][2]["messages"]  # system, user, assistant, user
    growing = Rendered()
    for turn, message in enumerate(messages, start=1):
        before = list(growing.token_ids)
        chat.append(growing, message["role"], message["content"])
        assert growing.token_ids[: len(before)] == before  # earlier ids never change
        assert growing.token_ids == chat.render(messages[:turn]).token_ids


def test_loss_mask_covers_exactly_the_assistant_content_and_end_of_turn(tokenizer):
    chat = ChatMLFormat(tokenizer)
    rendered = chat.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"},
                            {"role": "tool", "content": "42"}])
    trained = [t for t, keep in zip(rendered.token_ids, rendered.loss_mask(), strict=True) if keep]
    assert trained == [*tokenizer.encode("Hello there"), tokenizer.token_id("<|im_end|>")]
    assert set(rendered.sources) == {Source.TEMPLATE, Source.USER, Source.ASSISTANT, Source.TOOL}
    tool_ids = [t for t, s in zip(rendered.token_ids, rendered.sources, strict=True) if s is Source.TOOL]
    assert tokenizer.decode(tool_ids) == "42<|im_end|>"


def test_parse_reasoning_content_and_tool_calls():
    parsed = parse_assistant('<think>\nCheck the file.\n</think>\n\nLet me look.\n<tool_call>\n'
                             '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    assert parsed.reasoning == "Check the file." and parsed.content == "Let me look."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("bash", {"command": "ls"})] and not parsed.errors


@pytest.mark.parametrize("text", [
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "x", "arguments": "[1]"}</tool_call>',
    '<tool_call>{"name": "x", "arguments": {}}',
])
def test_malformed_tool_calls_are_reported_not_raised(text):
    parsed = parse_assistant(text)
    assert parsed.tool_calls == [] and len(parsed.errors) == 1
