"""``orchard serve`` of a vision-language model: OpenAI ``image_url`` parts (data URIs and local files)
reach the model, and the same request in process gives the same tokens; bad images get clear errors."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from flax import nnx
from PIL import Image

from orchard.data.tokenizer import Tokenizer
from orchard.models.pixels import ImageProcessing
from orchard.models.vlm import VisionLanguageModel, VLMConfig
from orchard.models.weights import from_pretrained, save_pretrained
from orchard.rollout.jax_engine import JaxEngine, model_chat_format
from orchard.rollout.types import SamplingParams
from tests.conftest import ADMIN, ModelProcess, Proxy, start_model_server, start_proxy
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir

QUESTION = "What is on the page?"


def png(seed: int, size=(48, 40)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def ask(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    """A random tiny Qwen3-VL over the real Qwen3 vocabulary, with the Qwen3 tokenizer."""
    tokenizer = Tokenizer.from_pretrained(qwen3_tokenizer_dir())
    ids = [tokenizer.token_id(t) for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")]
    cfg = VLMConfig.tiny(151680, *ids, text={"hidden_size": 32, "intermediate_size": 64, "num_layers": 1},
                         ).replace(processing=ImageProcessing(min_pixels=32 * 32, max_pixels=128 * 128))
    path = str(tmp_path_factory.mktemp("tiny-qwen3-vl") / "model")
    save_pretrained(VisionLanguageModel(cfg, rngs=nnx.Rngs(0)), path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("media"))


@pytest.fixture(scope="module")
def vlm_server(vlm_dir, media_dir, tmp_path_factory) -> Iterator[ModelProcess]:
    yield from start_model_server(vlm_dir, str(tmp_path_factory.mktemp("serve") / "vlm.log"),
                                  ["--allowed-local-media-path", media_dir])


@pytest.fixture(scope="module")
def client(vlm_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=vlm_server.url, api_key="unused", max_retries=0)


def chat(client, server, messages, **extra):
    return client.chat.completions.create(model=server.name, messages=messages, max_tokens=6, temperature=0,
                                          extra_body={"return_token_ids": True}, **extra)


def test_an_image_reaches_the_model_as_in_process(client, vlm_server, vlm_dir):
    data = png(1)
    reply = chat(client, vlm_server, ask(data_uri(data)), logprobs=True)
    served_prompt, served = reply.model_extra["prompt_token_ids"], reply.choices[0].model_extra["token_ids"]

    model = from_pretrained(vlm_dir, dtype="float32")
    tokenizer = Tokenizer.from_pretrained(vlm_dir)
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    rendered = model_chat_format("qwen3_vl", tokenizer, model).render(
        [{"role": "user", "content": QUESTION, "images": [{"width": 48, "height": 40}]}], add_generation_prompt=True)
    [image] = rendered.images
    assert served_prompt == rendered.token_ids and image.count > 0
    [expected] = JaxEngine(model, tokenizer).generate([rendered.token_ids], SamplingParams(max_tokens=6, temperature=0),
                                                      images=[[(pixels, image.start)]])
    assert served == expected.token_ids

    other = chat(client, vlm_server, ask(data_uri(png(2))), logprobs=True)  # another image, another distribution
    first = [c.choices[0].logprobs.content[0].logprob for c in (reply, other)]
    assert other.model_extra["prompt_token_ids"] == served_prompt and first[0] != pytest.approx(first[1], abs=1e-6)


def test_a_streamed_reply_and_a_local_file_give_the_same_tokens(client, vlm_server, media_dir):
    data = png(3)
    path = os.path.join(media_dir, "page.png")
    with open(path, "wb") as handle:
        handle.write(data)
    expected = chat(client, vlm_server, ask(data_uri(data))).choices[0].model_extra["token_ids"]
    assert chat(client, vlm_server, ask(f"file://{path}")).choices[0].model_extra["token_ids"] == expected
    stream = chat(client, vlm_server, ask(path), stream=True)
    assert [t for chunk in stream for c in chunk.choices for t in c.model_extra.get("token_ids") or []] == expected


def test_bad_images_get_clear_errors_and_the_server_stays_up(client, vlm_server, media_dir, tmp_path):
    outside = tmp_path / "secret.png"
    outside.write_bytes(png(4))
    os.symlink(outside, os.path.join(media_dir, "link.png"))
    cases = {
        "malformed": ("data:image/png;base64,@@@", openai.BadRequestError),
        "not a readable image": (data_uri(b"plain text, not a picture"), openai.BadRequestError),
        "not fetched": ("https://example.com/cat.png", openai.BadRequestError),
        "outside the allowed": (str(outside), openai.PermissionDeniedError),
        "outside the allowed ": (os.path.join(media_dir, "link.png"), openai.PermissionDeniedError),  # a symlink out
        "outside the allowed  ": (os.path.join(media_dir, "..", outside.parent.name, "secret.png"),
                                  openai.PermissionDeniedError),
        "cannot read": (os.path.join(media_dir, "missing.png"), openai.BadRequestError),
    }
    for message, (url, error) in cases.items():
        with pytest.raises(error, match=message.strip()):
            chat(client, vlm_server, ask(url))
    with pytest.raises(openai.BadRequestError, match="unsupported content part"):
        chat(client, vlm_server, [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])
    assert vlm_server.process.poll() is None
    assert chat(client, vlm_server, ask(data_uri(png(5)))).choices[0].model_extra["token_ids"]


@pytest.fixture(scope="module")
def vlm_proxy(vlm_server, tmp_path_factory) -> Iterator[Proxy]:
    yield from start_proxy(vlm_server.url, tmp_path_factory)


def test_the_proxy_records_images_by_hash_and_serves_them(vlm_proxy):
    data = png(6)
    session = vlm_proxy.open()
    harness = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    for stream in (False, True):  # the same screenshot twice: stored once
        reply = harness.chat.completions.create(model="any", messages=ask(data_uri(data)), max_tokens=4,
                                                stream=stream)
        if stream:
            assert list(reply)
    vlm_proxy.close(session)

    with open(os.path.join(vlm_proxy.records, f"{session['id']}.jsonl")) as handle:
        raw = handle.read()
    assert base64.b64encode(data).decode()[:64] not in raw  # no pixels in the records
    calls = [json.loads(line) for line in raw.splitlines() if json.loads(line)["type"] == "call"]
    sha = hashlib.sha256(data).hexdigest()
    for call in calls:
        assert call["status"] == "ok" and call["usable_for_rl"]
        for body in (call["request"], call["upstream_request"]):
            part = body["messages"][0]["content"][0]
            assert part["image_url"]["url"] == f"sha256:{sha}" and (part["image"]["width"], part["image"]["height"]) == (48, 40)
    stored = [name for _, _, names in os.walk(os.path.join(vlm_proxy.records, "images")) for name in names]
    assert stored == [f"{sha}.png"]

    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert httpx.get(f"{vlm_proxy.root}/images/{sha}", headers=admin).content == data
    assert httpx.get(f"{vlm_proxy.root}/images/{sha}").status_code == 401
    assert httpx.get(f"{vlm_proxy.root}/images/{'0' * 64}", headers=admin).status_code == 404
    assert httpx.get(f"{vlm_proxy.root}/images/..%2F..%2Fetc%2Fpasswd", headers=admin).status_code == 404
