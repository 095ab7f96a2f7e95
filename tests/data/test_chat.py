"""Tokenizers and chat formats against transformers (golden files), masks and parsing."""

from __future__ import annotations

import json
import os

import pytest

from orchard.data.chat import ChatMLFormat, Qwen3Format, Rendered, Source, parse_assistant, smollm2_format
from orchard.data.tokenizer import Tokenizer
from orchard.models.shipped import smollm2_gguf
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "chat")


def _load(name: str) -> dict:
    with open(os.path.join(FIXTURES, name)) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def golden() -> dict:
    return _load("smollm2.json")


@pytest.fixture(scope="module")
def qwen3_golden() -> dict:
    return _load("qwen3.json")


@pytest.fixture(scope="module")
def qwen3_tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(qwen3_tokenizer_dir())


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
        chat.append(growing, message)
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


def test_plain_chatml_refuses_tools(tokenizer):
    with pytest.raises(ValueError, match="Qwen3Format"):
        ChatMLFormat(tokenizer).render([{"role": "user", "content": "hi"}], tools=[{"type": "function"}])


def test_qwen3_rendering_matches_apply_chat_template(qwen3_tokenizer, qwen3_golden):
    assert qwen3_tokenizer.eos_token == "<|im_end|>"
    for case in qwen3_golden["chat"]:
        chat = Qwen3Format(qwen3_tokenizer, thinking=case.get("enable_thinking", True))
        rendered = chat.render(case["messages"], tools=case["tools"], add_generation_prompt=case["add_generation_prompt"])
        assert qwen3_tokenizer.decode(rendered.token_ids) == case["text"]
        assert rendered.token_ids == case["ids"], case["messages"]


def test_qwen3_rendering_is_incremental_across_grouped_tool_results(qwen3_tokenizer, qwen3_golden):
    case = next(c for c in qwen3_golden["chat"] if [m["role"] for m in c["messages"]][-2:] == ["tool", "tool"]
                and c["add_generation_prompt"])
    chat = Qwen3Format(qwen3_tokenizer)
    growing = chat.start(case["tools"])
    for message in case["messages"]:
        before = list(growing.token_ids)
        chat.append(growing, message)
        assert growing.token_ids[: len(before)] == before
    assert chat.generation_prompt(growing).token_ids == case["ids"]


def test_qwen3_loss_mask_is_exactly_what_the_assistant_generated(qwen3_tokenizer, qwen3_golden):
    case = next(c for c in qwen3_golden["chat"] if c["tools"] and c["messages"][-1]["role"] == "assistant")
    rendered = Qwen3Format(qwen3_tokenizer).render(case["messages"], tools=case["tools"])
    turns, current = [], []
    for token, keep in zip(rendered.token_ids, rendered.loss_mask(), strict=True):
        if keep:
            current.append(token)
        elif current:
            turns.append(qwen3_tokenizer.decode(current))
            current = []
    assert turns == [
        '<think>\nI should list the directory.\n</think>\n\n<tool_call>\n'
        '{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>',
        "<think>\nTwo files.\n</think>\n\nThere are two files.<|im_end|>",
    ]
    tool_text = qwen3_tokenizer.decode([t for t, s in zip(rendered.token_ids, rendered.sources, strict=True)
                                        if s is Source.TOOL])
    assert tool_text == "total 8\nREADME.md\nsetup.py<|im_end|>"
    parsed = parse_assistant(turns[0].removesuffix("<|im_end|>"))
    assert parsed.reasoning == "I should list the directory." and parsed.tool_calls[0].arguments == {"command": "ls -la"}


def test_qwen3_keeps_reasoning_of_earlier_turns(qwen3_tokenizer):
    """The documented departure: HF drops reasoning before the last user query; Orchard keeps the
    tokens the model produced."""
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "r"},
                {"role": "user", "content": "c"}]
    text = qwen3_tokenizer.decode(Qwen3Format(qwen3_tokenizer).render(messages).token_ids)
    assert "<|im_start|>assistant\n<think>\nr\n</think>\n\nb<|im_end|>" in text


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


def test_a_trained_bpe_encodes_any_text_and_keeps_specials_out_of_it(tmp_path):
    corpus = ["def add_3(x):\n    return x + 3\n", "grep -rn 'def add_3' --include=*.py ."] * 50
    tokenizer = Tokenizer.train(corpus, 300)
    assert 256 < tokenizer.vocab_size <= 300
    for text in ["def add_3(x):", "unseen ünïcödé ✓ text\t\n", "<|im_end|> is text here"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.token_id("<|im_end|>") not in tokenizer.encode("<|im_end|>")  # never forged from text
    assert len(tokenizer.encode("def add_3(x):")) < len("def add_3(x):")  # it learnt merges
    tokenizer.save_pretrained(str(tmp_path))
    loaded = Tokenizer.from_pretrained(str(tmp_path))
    assert loaded.encode(corpus[0]) == tokenizer.encode(corpus[0]) and loaded.eos_token == "<|im_end|>"


def test_a_bpe_that_splits_digits_writes_numbers_it_never_saw_as_it_writes_the_ones_it_did(tmp_path):
    corpus = ["return x + 3000 * 12 - 77\n", "sed -n '120,+15p' ops.py"] * 50
    merged, split = Tokenizer.train(corpus, 300), Tokenizer.train(corpus, 300, split_digits=True)
    assert len(merged.encode("3000")) < 4  # the other BPE merges digit runs
    digits = [split.encode(d) for d in "0123456789"]
    assert all(len(d) == 1 for d in digits)
    for number in ("3000", "2718", "120"):  # seen or not, a number is its digits
        assert split.encode(number) == [d for c in number for d in split.encode(c)]
        assert split.decode(split.encode(f"x = {number}")) == f"x = {number}"
    assert len(split.encode("return x")) < len("return x")  # words still merge
    split.save_pretrained(str(tmp_path))
    assert Tokenizer.from_pretrained(str(tmp_path)).encode("x + 2718") == split.encode("x + 2718")


def test_a_config_names_the_chat_format(qwen3_tokenizer):
    from orchard.data.chat import CHAT_FORMATS, ChatMLFormat, make_chat_format

    tokenizer = qwen3_tokenizer
    assert isinstance(make_chat_format("qwen3", tokenizer), Qwen3Format) and make_chat_format("qwen3", tokenizer).thinking
    assert not make_chat_format("qwen3_no_think", tokenizer).thinking
    assert type(make_chat_format("chatml", tokenizer)) is ChatMLFormat
    assert set(CHAT_FORMATS) == {"qwen3", "qwen3_no_think", "chatml", "smollm2"}
    with pytest.raises(ValueError, match="unknown chat format 'llama3': one of qwen3"):
        make_chat_format("llama3", tokenizer)
    ends = make_chat_format("qwen3", tokenizer).end_of_turn_ids
    assert tokenizer.token_id("<|im_end|>") in ends and tokenizer.token_id("<|endoftext|>") in ends


def test_qwen3_vl_puts_each_image_after_its_text_with_the_turn_source(qwen3_tokenizer):
    from orchard.data.chat import make_chat_format
    from orchard.data.images import ImageRef

    chat = make_chat_format("qwen3_vl", qwen3_tokenizer, image_tokens=lambda w, h: (w // 32) * (h // 32))
    tools = [{"type": "function", "function": {"name": "click", "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "user", "content": "Click the button.", "images": [{"width": 160, "height": 224}]},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "click", "arguments": {}}]},
        {"role": "tool", "content": "clicked", "images": [ImageRef(sha256="0" * 64, width=64, height=64)]},
    ]
    rendered = chat.render(messages, tools=tools, add_generation_prompt=True)
    start, pad, end = (qwen3_tokenizer.token_id(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    assert [image.count for image in rendered.images] == [35, 4]
    assert rendered.images[1].image.sha256 == "0" * 64
    for image, source, text in zip(rendered.images, (Source.USER, Source.TOOL), ("Click the button.", "clicked"),
                                   strict=True):
        span = slice(image.start - 1, image.start + image.count + 1)
        assert rendered.token_ids[span] == [start] + [pad] * image.count + [end]
        assert set(rendered.sources[span]) == {source}
        assert qwen3_tokenizer.decode(rendered.token_ids[:image.start - 1]).endswith(text)
    assert rendered.token_ids.count(pad) == 39 and not any(rendered.loss_mask()[i] for i in range(len(rendered.sources))
                                                          if rendered.token_ids[i] == pad)
    growing = chat.start(tools)
    for message in messages:
        chat.append(growing, message)
    assert chat.generation_prompt(growing).token_ids == rendered.token_ids and growing.images == rendered.images
    text_only = [{k: v for k, v in m.items() if k != "images"} for m in messages]
    assert chat.render(text_only, tools=tools).token_ids == Qwen3Format(qwen3_tokenizer).render(text_only, tools=tools).token_ids


def test_images_need_a_format_with_image_tokens(qwen3_tokenizer):
    from orchard.data.chat import make_chat_format

    with pytest.raises(ValueError, match="no image tokens"):
        Qwen3Format(qwen3_tokenizer).render([{"role": "user", "content": "hi", "images": [{"width": 1, "height": 1}]}])
    with pytest.raises(ValueError, match="image token count"):
        make_chat_format("qwen3_vl", qwen3_tokenizer)
