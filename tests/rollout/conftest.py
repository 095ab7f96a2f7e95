"""Model servers for the rollout tests: real ``orchard serve`` processes on free loopback ports (SmolLM2's,
``smollm2_server``, is the session's, in ``tests/conftest.py``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from flax import nnx

from orchard.data.tokenizer import Tokenizer
from orchard.env.local import free_port
from orchard.models.config import ModelConfig
from orchard.models.transformer import Transformer
from orchard.models.weights import save_pretrained
from tests.conftest import ModelProcess, cli_server, start_model_server
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


ADMIN = "admin-" + secrets.token_hex(4)


@dataclass
class Proxy:
    """A real ``orchard proxy`` process and its session routes."""

    root: str
    records: str

    def open(self, **fields) -> dict:
        body = {"task": "t", "harness": "h", "rollout_id": secrets.token_hex(3), **fields}
        reply = httpx.post(f"{self.root}/sessions", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
        assert reply.status_code == 200, reply.text
        return reply.json()

    def close(self, session: dict) -> dict:
        return httpx.post(f"{self.root}/sessions/{session['id']}/close",
                          headers={"Authorization": f"Bearer {ADMIN}"}).json()


@pytest.fixture(scope="session")
def proxy(smollm2_server, tmp_path_factory) -> Iterator[Proxy]:
    """``orchard proxy`` in front of the session's SmolLM2 server."""
    records = str(tmp_path_factory.mktemp("records"))
    port, log_path = free_port(), str(tmp_path_factory.mktemp("proxy") / "proxy.log")
    args = ["proxy", "--upstream", smollm2_server.url, "--records", records, "--admin-key", ADMIN, "--port", str(port)]
    for _ in cli_server(args, port, log_path, timeout=60):
        yield Proxy(f"http://127.0.0.1:{port}", records)
