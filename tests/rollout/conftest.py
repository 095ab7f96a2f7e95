"""Model servers for the rollout tests: real ``orchard serve`` processes on free loopback ports."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from flax import nnx

from orchard.data.tokenizer import Tokenizer
from orchard.env.local import free_port
from orchard.models.config import ModelConfig
from orchard.models.shipped import smollm2_gguf
from orchard.models.transformer import Transformer
from orchard.models.weights import save_pretrained
from tests.conftest import wait_until
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir


@dataclass
class ModelProcess:
    url: str  # ends in /v1
    name: str
    model_path: str
    process: subprocess.Popen


def start_model_server(model_path: str, log_path: str) -> Iterator[ModelProcess]:
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchard.cli", "serve", "--model", model_path, "--port", str(port),
             "--dtype", "float32"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"orchard serve exited with {process.returncode}: "
                                 f"{pathlib.Path(log_path).read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout=120, interval=0.2, what="orchard serve")
        yield ModelProcess(f"http://127.0.0.1:{port}/v1", model_path, model_path, process)
    finally:
        process.terminate()
        process.wait(20)


def tiny_qwen3(seed: int) -> Transformer:
    """A random Qwen3 with the real Qwen3 vocabulary (so the real tokenizer and template apply)."""
    cfg = ModelConfig(model_type="qwen3", vocab_size=151680, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=False,
                      max_position_embeddings=1024, rope_theta=1e6, dtype="float32")
    return Transformer(cfg, rngs=nnx.Rngs(seed))


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory) -> Iterator[ModelProcess]:
    yield from start_model_server(smollm2_gguf(), str(tmp_path_factory.mktemp("serve") / "smollm2.log"))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-qwen3") / "model")
    save_pretrained(tiny_qwen3(seed=0), path)
    Tokenizer.from_pretrained(qwen3_tokenizer_dir()).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qwen3_server(qwen3_dir, tmp_path_factory) -> Iterator[ModelProcess]:
    yield from start_model_server(qwen3_dir, str(tmp_path_factory.mktemp("serve") / "qwen3.log"))
