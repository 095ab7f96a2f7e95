"""``OpenAIEngine``: a rollout engine over any OpenAI-compatible server, vLLM included.

Token ids go both ways, so nothing is re-tokenised: prompts are sent as token-id lists to
``/v1/completions`` (one request holds the whole batch), and the reply's sampled ids and their
logprobs come back through vLLM's ``return_token_ids`` extension and ``logprobs: 0`` (the sampled
token's logprob, no alternatives). ``orchard serve`` speaks the same dialect.

Requests go through :class:`~orchard.rollout.openai_client.OpenAIClient` (its retries: full
jitter, ``Retry-After``, 429 and 5xx). The module imports no JAX: an engine in a process that only
drives a server needs none.

Weight updates go through a pluggable :class:`WeightSync`. The default, :class:`ReloadFromDisk`,
has the trainer's :class:`~orchard.rollout.types.Weights` write HF safetensors over the directory
the server was started with, then asks the server to re-read it:

- ``POST /collective_rpc`` with ``{"method": "reload_weights"}``: vLLM's dev-mode route (start vLLM
  with ``VLLM_SERVER_DEV_MODE=1``), which runs ``reload_weights`` on every worker; with no
  arguments the workers load the weights again from the model path they were started with.
- ``POST /reset_prefix_cache``, so no cached prefix computed with the old weights is reused.

Trainers that share GPUs with vLLM can plug in an NCCL or CUDA-IPC sync instead.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Protocol

from orchard.rollout.openai_client import OpenAIClient, OpenAIError
from orchard.rollout.types import Completion, SamplingParams, Weights


class WeightSync(Protocol):
    def __call__(self, weights: Weights, engine: OpenAIEngine) -> None:
        """Make the server behind ``engine`` serve ``weights`` from its next request on."""
        ...


class ReloadFromDisk:
    """Write the weights over ``directory`` (the server's model directory) and ask it to reload.

    Files are written beside the directory and renamed into it, so a reader never sees a
    half-written tensor file.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, weights: Weights, engine: OpenAIEngine) -> None:
        parent = os.path.dirname(os.path.abspath(self.directory))
        with tempfile.TemporaryDirectory(dir=parent, prefix=".orchard-weights-") as staging:
            weights.save_pretrained(staging)
            for name in os.listdir(staging):
                if name == "config.json" and os.path.exists(os.path.join(self.directory, name)):
                    continue  # keep the served config (it may carry serving-only fields)
                os.replace(os.path.join(staging, name), os.path.join(self.directory, name))
        engine.post("/collective_rpc", {"method": "reload_weights"})
        engine.post("/reset_prefix_cache", None)


class OpenAIEngine:
    """A rollout engine over the server at ``base_url`` (its root or ``/v1``) serving ``model``."""

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", weight_sync: WeightSync | None = None,
                 timeout: float = 600.0, client: OpenAIClient | None = None) -> None:
        self.client = client or OpenAIClient(base_url, api_key, timeout=timeout)
        self.model = model
        self.weight_sync = weight_sync
        self.weight_version: int | None = None  # unknown until this engine updates the weights

    def post(self, path: str, body: dict | None) -> dict | None:
        """POST to the server's ``path`` (from its root), with the client's retries."""
        return self.client.post(path, body)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        body = {"model": self.model, "prompt": [list(p) for p in prompts], "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
                "logprobs": 0, "return_token_ids": True}
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        version = self.weight_version
        reply = self.post("/v1/completions", body)
        try:
            choices = sorted(reply["choices"], key=lambda c: c["index"])
            completions = [Completion(token_ids=list(c["token_ids"]), logprobs=list(c["logprobs"]["token_logprobs"]),
                                      finish_reason=c["finish_reason"], text=c["text"], weight_version=version)
                           for c in choices]
        except (KeyError, TypeError) as exc:
            raise OpenAIError(f"/v1/completions gave no token ids and logprobs ({exc!r}): ask a server that "
                              "speaks return_token_ids (vLLM, orchard serve)") from exc
        if len(completions) != len(prompts):
            raise OpenAIError(f"asked for {len(prompts)} completions, got {len(completions)}")
        return completions

    def update_weights(self, weights: Weights) -> None:
        if self.weight_sync is None:
            raise RuntimeError("this OpenAIEngine has no weight_sync: pass ReloadFromDisk(model_dir) or your own")
        self.weight_sync(weights, self)
        self.weight_version = weights.version

    def close(self) -> None:
        self.client.close()
