"""OpenAIEngine and its versioned disk sync against fake vLLM replicas: loopback servers that answer the
routes the engine uses as vLLM 0.34's source does (see the files named in orchard/rollout/openai_engine.py),
or as older vLLM did (empty 200s, flat error bodies), and record every call. They also answer vLLM's
weight-transfer routes (see orchard/rollout/weight_transfer.py) over :class:`FakeNcclGroup`, a stand-in for
the NCCL group that the NCCL sync's tests (tests/rollout/test_weight_transfer.py) use."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from orchard.models.config import ModelConfig
from orchard.models.transformer import Transformer
from orchard.models.weights import ModelWeights, from_pretrained, save_pretrained
from orchard.rollout.openai_client import OpenAIError, RetryPolicy
from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
from orchard.rollout.types import SamplingParams

FAST = RetryPolicy(max_retries=2, base_delay=0.001, max_delay=0.01)
SYNC = ["/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache", "/resume"]
WEIGHT_TRANSFER_ROUTES = ("/get_world_size", "/init_weight_transfer_engine", "/start_weight_update",
                          "/update_weights", "/finish_weight_update")
INTERNAL_ERROR = (500, b"Internal Server Error")  # Starlette's answer to an exception no handler caught


def completions_reply(body: dict[str, Any], sample: Callable[[list[int], int], list[int]]) -> dict[str, Any]:
    """vLLM's ``/v1/completions`` answer to ``body`` with ``return_token_ids`` and ``logprobs: 0``: each prompt's
    ``max_tokens`` ids ``sample(prompt, max_tokens)``, each of logprob -0.5 (choices listed last first, as
    their ``index`` orders them)."""
    n = body["max_tokens"]
    return {"object": "text_completion", "choices": [
        {"index": i, "text": "x" * n, "finish_reason": "length", "token_ids": sample(prompt, n),
         "prompt_token_ids": prompt,
         "logprobs": {"tokens": ["x"] * n, "token_logprobs": [-0.5] * n, "top_logprobs": None,
                      "text_offset": list(range(n))}}
        for i, prompt in reversed(list(enumerate(body["prompt"])))]}


class FakeNcclGroup:
    """The NCCL group of a weight transfer, in one process: the trainer's end (a ``Communicator``: ``init``,
    ``broadcast``, ``close``) and the fake replicas' workers (``join``, ``receive``), each waiting on the
    others as NCCL does: the group forms once all ``world_size`` ranks have joined, and a broadcast is
    delivered once every replica in the group is receiving (the trainer's waits time out after ``timeout``
    seconds, the workers' after twice that, where NCCL would wait on). ``fail_at``: the broadcast (0-based)
    that fails, as a broken link does."""

    def __init__(self, timeout: float = 5.0, fail_at: int | None = None) -> None:
        self.timeout, self.fail_at = timeout, fail_at
        self.cond = threading.Condition()
        self.members: dict[int, Any] = {}  # rank -> "trainer" or the FakeVLLM whose worker holds it
        self.world_size: int | None = None
        self.trainer_inits: list[tuple[str, int, int, int]] = []
        self.sent: list[np.ndarray] = []  # every broadcast, in order
        self.closes = 0

    def _wait(self, ready: Callable[[], bool], what: str, worker: bool = False) -> None:
        if not self.cond.wait_for(ready, self.timeout * (2 if worker else 1)):
            raise TimeoutError(f"NCCL: timed out waiting for {what}")

    def _formed(self) -> bool:
        return self.world_size is not None and len(self.members) == self.world_size

    def init(self, master_address: str, master_port: int, rank: int, world_size: int) -> None:
        with self.cond:
            self.trainer_inits.append((master_address, master_port, rank, world_size))
            self.members[rank], self.world_size = "trainer", world_size
            self.cond.notify_all()
            self._wait(self._formed, "the group to form")

    def replicas(self) -> list[Any]:
        return list({id(m): m for m in self.members.values() if m != "trainer"}.values())

    def broadcast(self, array: Any) -> None:
        with self.cond:
            if self.fail_at == len(self.sent):
                raise RuntimeError("NCCL error: unhandled system error (remote process exited)")
            self._wait(lambda: all(r.receiving for r in self.replicas()), "every replica to receive")
            self.sent.append(np.asarray(array))
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closes += 1
            self.members, self.world_size = {}, None

    def join(self, replica: Any, init_info: dict[str, Any]) -> None:
        """A replica's workers join at ``rank_offset`` (vLLM's NCCLWeightTransferEngine.init_transfer_engine)."""
        with self.cond:
            for rank in range(init_info["rank_offset"], init_info["rank_offset"] + replica.world_size):
                self.members[rank] = replica
            self.world_size = init_info["world_size"]
            self.cond.notify_all()
            self._wait(self._formed, "the group to form", worker=True)

    def receive(self, replica: Any, count: int) -> list[np.ndarray]:
        """The next ``count`` broadcasts, as a replica's workers receive them (one by one, unpacked)."""
        with self.cond:
            start, replica.receiving = len(self.sent), True
            self.cond.notify_all()
            try:
                self._wait(lambda: len(self.sent) >= start + count, f"{count} tensors", worker=True)
                return self.sent[start:start + count]
            finally:
                replica.receiving = False
                self.cond.notify_all()


class FakeVLLM:
    """One replica. ``legacy`` answers as older vLLM: empty 200s from the control routes and the flat
    ``{"object": "error", ...}`` body; ``fail_reload`` makes ``reload_weights`` fail as a worker error does.
    With ``nccl`` (a server started with ``--weight-transfer-config '{"backend": "nccl"}'``), its
    ``world_size`` workers join that group; ``fail_update`` makes ``/update_weights`` fail in the engine."""

    def __init__(self, legacy: bool = False, fail_reload: bool = False, nccl: FakeNcclGroup | None = None,
                 world_size: int = 1, fail_update: bool = False) -> None:
        self.legacy, self.fail_reload = legacy, fail_reload
        self.nccl, self.world_size, self.fail_update = nccl, world_size, fail_update
        self.calls: list[tuple[str, Any]] = []  # (path with query, JSON body)
        self.paused, self.weights_path = False, None
        self.receiving, self.updating = False, False
        self.received: dict[str, np.ndarray] = {}  # the tensors the last NCCL update loaded, by name
        self.weight_version: str | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.answer(self, self.path, None)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.answer(self, self.path, json.loads(raw) if raw else None)

            def log_message(self, *_) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_port}/v1"

    def error(self, message: str, kind: str, code: int) -> tuple[int, dict]:
        if self.legacy:
            return code, {"object": "error", "message": message, "type": kind, "param": None, "code": code}
        return code, {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def route(self, path: str, body: Any) -> tuple[int, Any]:
        route, query = urlsplit(path).path, parse_qs(urlsplit(path).query)
        if route == "/pause":  # vllm/entrypoints/rl/online/api_router.py
            assert query.get("mode", ["abort"]) in (["abort"], ["wait"], ["keep"])
            self.paused = True
            return 200, {"status": "paused"}
        if route == "/resume":
            self.paused = False
            return 200, {"status": "resumed"}
        if route == "/is_paused":
            return 200, {"is_paused": self.paused}
        if route == "/collective_rpc":  # vllm/entrypoints/serve/dev/rpc/api_router.py
            assert body["method"] == "reload_weights" and set(body.get("kwargs", {})) <= {"weights_path"}
            path = body.get("kwargs", {}).get("weights_path")
            if self.fail_reload or not os.path.isfile(os.path.join(path, "model.safetensors")):
                return self.error(f"no checkpoint at {path}", "InternalServerError" if self.legacy else "BadRequestError",
                                  400)
            self.weights_path = path
            return 200, None if self.legacy else {"results": [None]}
        if route == "/reset_prefix_cache":  # vllm/entrypoints/serve/dev/cache/api_router.py
            return 200, None if self.legacy else {"success": True}
        if route in WEIGHT_TRANSFER_ROUTES:  # vllm/entrypoints/rl/online/api_router.py
            return self.weight_transfer(route, body)
        if route == "/v1/completions":  # generated ids say which version sampled them
            if self.paused:  # RetryableRequestError, as AsyncLLM refuses requests while paused
                return self.error("generation is paused", "ServiceUnavailableError", 503)
            version = int(os.path.basename(self.weights_path)[1:]) if self.weights_path else 0
            return 200, completions_reply(body, lambda prompt, n: [version] * n)
        return 404, {"detail": "Not Found"}

    def weight_transfer(self, route: str, body: Any) -> tuple[int, Any]:
        """vLLM's weight-transfer routes: a missing ``init_info``/``update_info`` is an ``HTTPException(400)``
        (rendered as vLLM's error body); an error in the engine is not caught by the routes, so Starlette
        answers a plain-text 500."""
        if route == "/get_world_size":
            return 200, {"world_size": self.world_size}
        if self.nccl is None:  # no --weight-transfer-config: the engine has no transfer engine to call
            return INTERNAL_ERROR
        if route == "/init_weight_transfer_engine":
            if not isinstance(body, dict) or body.get("init_info") is None:
                return self.error("Missing 'init_info' in request body", "Bad Request", 400)
            assert set(body["init_info"]) == {"master_address", "master_port", "rank_offset", "world_size"}
            try:
                self.nccl.join(self, body["init_info"])
            except TimeoutError:
                return INTERNAL_ERROR
            return 200, {"message": "Weight transfer initialized"}
        if route == "/start_weight_update":
            self.updating = True
            return 200, {"message": "Weight update started"}
        if route == "/update_weights":
            if not isinstance(body, dict) or body.get("update_info") is None:
                return self.error("Missing 'update_info' in request body", "Bad Request", 400)
            info = body["update_info"]
            if self.fail_update or not self.updating:
                return INTERNAL_ERROR
            try:
                tensors = self.nccl.receive(self, len(info["names"]))
            except TimeoutError:
                return INTERNAL_ERROR
            for name, dtype, shape, tensor in zip(info["names"], info["dtype_names"], info["shapes"], tensors,
                                                  strict=True):
                assert (list(tensor.shape), tensor.dtype.name) == (shape, dtype), name  # else NCCL would misread
                self.received[name] = tensor
            return 200, {"message": "Weights updated"}
        if route == "/finish_weight_update":
            self.updating, self.weight_version = False, (body or {}).get("weight_version")
            return 200, {"message": "Weight update finished"}
        raise AssertionError(route)

    def answer(self, handler: BaseHTTPRequestHandler, path: str, body: Any) -> None:
        self.calls.append((path, body))
        status, reply = self.route(path, body)
        data = b"" if reply is None else reply if isinstance(reply, bytes) else json.dumps(reply).encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(data)))
        if isinstance(reply, bytes):
            handler.send_header("Content-Type", "text/plain; charset=utf-8")
        elif data:
            handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        handler.wfile.write(data)

    def root_url(self) -> str:
        return self.url.removesuffix("/v1")

    def sync_calls(self) -> list[str]:
        return [path for path, _ in self.calls if not path.startswith("/v1/")]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def tiny(seed: int = 0) -> Transformer:
    cfg = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, qk_norm=True, tie_word_embeddings=False,
                      max_position_embeddings=64, dtype="float32")
    return Transformer(cfg, rngs=nnx.Rngs(seed))


@pytest.fixture
def served(tmp_path) -> str:
    """The directory the replicas were started with: a bfloat16 model (transformers 5 says ``dtype``)."""
    root = str(tmp_path / "policy")
    save_pretrained(tiny(), root)
    with open(os.path.join(root, "config.json")) as handle:
        config = json.load(handle)
    config.pop("torch_dtype")
    with open(os.path.join(root, "config.json"), "w") as handle:
        json.dump({**config, "dtype": "bfloat16", "served_by": "vllm"}, handle)
    for name in ("tokenizer.json", "generation_config.json"):
        with open(os.path.join(root, name), "w") as handle:
            json.dump({"name": name}, handle)
    return root


def assert_same_params(loaded: Transformer, model: Transformer) -> None:
    """Equal up to bfloat16's rounding."""
    pairs = zip(nnx.to_flat_state(nnx.state(loaded, nnx.Param)), nnx.to_flat_state(nnx.state(model, nnx.Param)),
                strict=True)
    for (path, saved), (_, original) in pairs:
        np.testing.assert_allclose(saved.get_value(), original.get_value(), rtol=1e-2, atol=1e-2, err_msg=str(path))


def versions(root: str) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.startswith(("v", ".")))


def test_a_sync_pauses_reloads_every_replica_from_the_new_version_and_collects_old_ones(replicas, served):
    new, old = replicas(), replicas(legacy=True)  # old vLLM: empty 200s from the control routes
    engine = OpenAIEngine([new.url, old.url], "policy", weight_sync=ReloadFromDisk(served, keep=2), retry=FAST)
    for version in (1, 2, 3):
        engine.update_weights(ModelWeights.of(tiny(seed=version), version))
    for fake in (new, old):
        assert fake.sync_calls() == SYNC * 3 and not fake.paused
        reloads = [body for path, body in fake.calls if path == "/collective_rpc"]
        assert reloads == [{"method": "reload_weights", "kwargs": {"weights_path": os.path.join(served, f"v{v}")}}
                           for v in (1, 2, 3)]
    assert versions(served) == ["v2", "v3"]
    for _ in range(2):  # the replicas take turns
        completions = engine.generate([[1, 2], [3]], SamplingParams(max_tokens=3))
        assert [c.token_ids for c in completions] == [[3, 3, 3]] * 2
        assert {c.weight_version for c in completions} == {3}
        assert completions[0].logprobs == [-0.5] * 3 and completions[0].finish_reason == "length"
    for fake in (new, old):
        assert [path for path, _ in fake.calls if path.startswith("/v1/")] == ["/v1/completions"]

    latest = os.path.join(served, "v3")
    with open(os.path.join(latest, "config.json")) as handle:
        assert json.load(handle)["served_by"] == "vllm"  # the served config, not the trainer's
    assert {"tokenizer.json", "generation_config.json"} <= set(os.listdir(latest))
    with safe_open(os.path.join(latest, "model.safetensors"), "np") as tensors:
        assert {tensors.get_slice(name).get_dtype() for name in tensors.keys()} == {"BF16"}  # noqa: SIM118
    assert_same_params(from_pretrained(latest, dtype="float32"), tiny(seed=3))


def test_the_served_version_is_never_collected(replicas, served):
    engine = OpenAIEngine(replicas().url, "policy", weight_sync=ReloadFromDisk(served, keep=1), retry=FAST)
    engine.update_weights(ModelWeights.of(tiny(), 5))
    engine.update_weights(ModelWeights.of(tiny(), 3))  # a restarted trainer, behind the newest version on disk
    assert versions(served) == ["v3", "v5"]
    engine.update_weights(ModelWeights.of(tiny(), 5))  # written again over the earlier run's v5
    assert versions(served) == ["v5"]


@pytest.mark.parametrize("legacy", [False, True])
def test_a_replica_that_fails_to_reload_is_named_and_every_replica_resumes(replicas, served, legacy):
    good, bad = replicas(), replicas(legacy=legacy, fail_reload=True)
    engine = OpenAIEngine([good.url, bad.url], "policy", weight_sync=ReloadFromDisk(served), retry=FAST)
    engine.weight_version = 0
    with pytest.raises(OpenAIError, match="no checkpoint at") as error:
        engine.update_weights(ModelWeights.of(tiny(), 4))
    root = bad.url.removesuffix("/v1")
    assert f"replica {root} failed /collective_rpc" in str(error.value) and error.value.status == 400
    assert ("InternalServerError" if legacy else "BadRequestError") in str(error.value)
    for fake in (good, bad):
        assert fake.sync_calls() == ["/pause?mode=wait", "/collective_rpc", "/resume"] and not fake.paused
    assert engine.weight_version is None  # the good replica serves v4 already: no version is certain
    assert engine.generate([[1]], SamplingParams(max_tokens=1))[0].token_ids == [4]


def test_a_failed_or_killed_write_leaves_no_version_and_touches_no_replica(replicas, served):
    fake = replicas()
    engine = OpenAIEngine(fake.url, "policy", weight_sync=ReloadFromDisk(served), retry=FAST)

    class Failing:
        version, params = 7, None

        def save_pretrained(self, directory: str, dtype: str | None = None) -> None:
            with open(os.path.join(directory, "model.safetensors"), "wb") as handle:
                handle.write(b"half a tensor")
            raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        engine.update_weights(Failing())
    assert versions(served) == [] and fake.calls == []

    killed = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal, sys
        from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk

        class Dying:
            version, params = 7, None

            def save_pretrained(self, directory, dtype=None):
                with open(os.path.join(directory, "model.safetensors"), "wb") as handle:
                    handle.write(b"half a tensor")
                os.kill(os.getpid(), signal.SIGKILL)

        OpenAIEngine(sys.argv[1], "policy", weight_sync=ReloadFromDisk(sys.argv[2])).update_weights(Dying())
    """), fake.url, served], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    [leftover] = versions(served)
    assert leftover.startswith(".staging-v7-") and fake.calls == []  # hidden, never v7
    engine.update_weights(ModelWeights.of(tiny(), 8))
    assert versions(served) == ["v8"]  # the next sync collects what the crash left


def test_save_pretrained_writes_shard_by_shard_in_the_dtype_asked(tmp_path):
    model = tiny()
    save_pretrained(model, str(tmp_path), max_shard_bytes=3_000, dtype="bfloat16")
    with open(tmp_path / "model.safetensors.index.json") as handle:
        index = json.load(handle)
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors")) == files
    with open(tmp_path / "config.json") as handle:
        assert json.load(handle)["torch_dtype"] == "bfloat16"
    total = 0
    for name in files:
        with safe_open(str(tmp_path / name), "np") as tensors:
            for key in tensors.keys():  # noqa: SIM118
                assert tensors.get_slice(key).get_dtype() == "BF16"
                total += tensors.get_tensor(key).nbytes
    assert index["metadata"]["total_size"] == total
    assert_same_params(from_pretrained(str(tmp_path), dtype="float32"), model)


def test_agenerate_sends_and_parses_as_generate_does_and_the_replicas_take_turns(replicas):
    first, second = replicas(), replicas()
    engine = OpenAIEngine([first.url, second.url], "policy", retry=FAST)
    engine.weight_version = 4
    prompts = [[1, 2], [3]]
    sampling = SamplingParams(max_tokens=3, temperature=0.7, top_p=0.9, top_k=5, seed=11, stop=("</x>",),
                              stop_token_ids=(9,))

    async def agenerate():
        try:
            return await engine.agenerate(prompts, sampling)
        finally:
            await engine.aclose()

    blocking = engine.generate(prompts, sampling)
    awaited = asyncio.run(agenerate())
    assert awaited == blocking
    assert [c.token_ids for c in awaited] == [[0, 0, 0]] * 2 and {c.weight_version for c in awaited} == {4}
    assert awaited[0].logprobs == [-0.5] * 3 and awaited[0].text == "xxx" and awaited[0].finish_reason == "length"
    [(_, sent)], [(_, asent)] = first.calls, second.calls  # one request each: the replicas took turns
    assert asent == sent == {"model": "policy", "prompt": prompts, "max_tokens": 3, "temperature": 0.7, "top_p": 0.9,
                             "seed": 11, "logprobs": 0, "return_token_ids": True, "top_k": 5, "stop": ["</x>"],
                             "stop_token_ids": [9]}


def test_a_reply_to_a_request_that_outlived_a_sync_is_of_no_certain_version(replicas, served):
    """A request refused during a sync's pause and retried after it is sampled by the new weights: the
    version the engine had when it sent the request would mislabel it, so the reply carries none."""
    engine = OpenAIEngine(replicas().url, "policy", weight_sync=ReloadFromDisk(served), retry=FAST)
    engine.update_weights(ModelWeights.of(tiny(seed=1), 1))
    post = engine.post

    def post_while_a_sync_runs(path, body):
        engine.update_weights(ModelWeights.of(tiny(seed=2), 2))
        return post(path, body)

    engine.post = post_while_a_sync_runs
    assert [c.weight_version for c in engine.generate([[1, 2]], SamplingParams(max_tokens=3))] == [None]
    engine.post = post
    assert [c.weight_version for c in engine.generate([[1, 2]], SamplingParams(max_tokens=3))] == [2]
