"""Model servers for the rollout tests: real ``orchard serve`` processes on free loopback ports (SmolLM2's,
``smollm2_server``, and the recording proxy in front of it, ``proxy``, are the session's, in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flax import nnx

from orchard.data.tokenizer import Tokenizer
from orchard.models.config import ModelConfig
from orchard.models.transformer import Transformer
from orchard.models.weights import save_pretrained
from tests.conftest import ModelProcess, start_model_server
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir


def tiny_qwen3(seed: int) -> Transformer:
    """A random Qwen3 with the real Qwen3 vocabulary (so the real tokenizer and template apply)."""
    cfg = ModelConfig(model_type="qwen3", vocab_size=151680, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=False,
                      max_position_embeddings=1024, rope_theta=1e6, dtype="float32")
    return Transformer(cfg, rngs=nnx.Rngs(seed))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-qwen3") / "model")
    save_pretrained(tiny_qwen3(seed=0), path)
    Tokenizer.from_pretrained(qwen3_tokenizer_dir()).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qwen3_server(qwen3_dir, tmp_path_factory) -> Iterator[ModelProcess]:
    yield from start_model_server(qwen3_dir, str(tmp_path_factory.mktemp("serve") / "qwen3.log"))


@pytest.fixture
def replicas() -> Iterator[Any]:
    """``replicas(**options)`` starts a fake vLLM server (tests/rollout/test_vllm_fake.py); all are closed after."""
    from tests.rollout.test_vllm_fake import FakeVLLM

    started: list[FakeVLLM] = []

    def start(**kwargs) -> FakeVLLM:
        started.append(FakeVLLM(**kwargs))
        return started[-1]

    yield start
    for fake in started:
        fake.close()
