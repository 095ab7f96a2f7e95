"""Fixtures of the harness tests: the real Qwen3 tokenizer and its chat format."""

from __future__ import annotations

import pytest

from orchard.data.chat import Qwen3Format
from orchard.data.tokenizer import Tokenizer
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(qwen3_tokenizer_dir())


@pytest.fixture(scope="session")
def chat_format(tokenizer: Tokenizer) -> Qwen3Format:
    return Qwen3Format(tokenizer)
