"""Fixtures of the harness tests: the real Qwen3 tokenizer and an async client of a real orchestrator."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from orchard.data.chat import Qwen3Format
from orchard.data.tokenizer import Tokenizer
from orchard.env import AsyncSandboxClient, LocalServer
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(qwen3_tokenizer_dir())


@pytest.fixture(scope="session")
def chat_format(tokenizer: Tokenizer) -> Qwen3Format:
    return Qwen3Format(tokenizer)


@pytest.fixture(scope="module")
async def aclient(orchestrator: LocalServer) -> AsyncIterator[AsyncSandboxClient]:
    async with orchestrator.async_client() as client:
        yield client
