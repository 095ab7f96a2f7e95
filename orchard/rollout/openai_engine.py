"""``OpenAIEngine``: a rollout engine over OpenAI-compatible servers, vLLM included.

Token ids go both ways, so nothing is re-tokenised: prompts are sent as token-id lists to
``/v1/completions`` (one request holds the whole batch), and the reply's sampled ids and their
logprobs come back through vLLM's ``return_token_ids`` extension (each choice's ``token_ids``) and
``logprobs: 0`` (``logprobs.token_logprobs``: the sampled token's logprob, no alternatives).
``orchard serve`` speaks the same dialect.

An engine may front several replicas of one model: generation requests go to them in turn, and a
weight update reaches them all before the engine reports the new version. Requests go through
:class:`~orchard.rollout.openai_client.OpenAIClient` (its retries: full jitter, ``Retry-After``,
429 and 5xx). The module imports no JAX: an engine in a process that only drives servers needs none.

Generation has two faces over one request builder and one reply parser: ``generate`` blocks (httpx),
``agenerate`` is a coroutine (aiohttp, no connection cap of its own), so one process holds hundreds of
episodes' generations in flight on one event loop: :class:`~orchard.harness.policies.EnginePolicy`
uses ``agenerate`` (the engine says ``native_async``), and its ``concurrency`` alone bounds them.

Weight updates go through a pluggable :class:`WeightSync`. The default, :class:`ReloadFromDisk`,
writes every update as a complete model directory of its own, ``<directory>/v<version>``, and asks
each replica to load its weights from there. It relies on these vLLM routes, checked in the source
of vLLM 0.34.0 (all mounted only with ``VLLM_SERVER_DEV_MODE=1``, by
``vllm/entrypoints/launchers/api_server/routers.py``):

- ``POST /pause?mode=wait`` (``vllm/entrypoints/rl/online/api_router.py``): requests in flight
  finish, new ones are refused with a 503 (which the client retries) until ``POST /resume``;
  both answer ``{"status": ...}`` and their errors are ``{"error": "<text>"}``.
- ``POST /collective_rpc`` with ``{"method": "reload_weights", "kwargs": {"weights_path": dir}}``
  (``vllm/entrypoints/serve/dev/rpc/api_router.py``): every worker runs
  ``Worker.reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True)``
  (``vllm/v1/worker/gpu_worker.py``), which loads ``dir``'s safetensors in place and points the
  model config at ``dir`` (``vllm/model_executor/model_loader/reload/inplace.py``). The reply is
  ``{"results": [...]}``, one entry a worker, or an empty 200 when there are none.
- ``POST /reset_prefix_cache`` (``vllm/entrypoints/serve/dev/cache/api_router.py``):
  ``{"success": bool}``, false while blocks are still held; older vLLM answers an empty 200.

Errors are vLLM's ``{"error": {"message", "type", "param", "code"}}`` (older: the flat
``{"object": "error", ...}``), which the client reads. The pause, prefix-cache reset and resume around
an update (:func:`while_paused`) are shared with the other sync,
:class:`~orchard.rollout.weight_transfer.NcclWeightTransfer` (vLLM's native NCCL weight transfer, for a
learner on GPUs that reach the servers' GPUs).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from orchard.rollout.openai_client import OpenAIClient, OpenAIError, RetryPolicy
from orchard.rollout.types import Completion, SamplingParams, Weights

VERSION_DIR = re.compile(r"v(\d+)")
STAGING = ".staging-"  # a version being written (or one a crash left half written): never a v<N> name
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")  # not copied into versions


class WeightSync(Protocol):
    def __call__(self, weights: Weights, engine: OpenAIEngine) -> None:
        """Make every replica behind ``engine`` serve ``weights`` from its next request on."""
        ...


class ReloadFromDisk:
    """Write each update as ``<directory>/v<version>`` and have every replica reload from it.

    ``directory`` is the model directory the servers were started with (``vllm serve <directory>``),
    at the same path on the servers as here (a shared volume): its ``config.json`` gives the served
    dtype, the weights are written in, and it is copied into every version with the tokenizer's files,
    so each version is a model directory a server can load as it is. A version is written under a
    hidden name and renamed into place once complete, so a crash never leaves a half-written
    ``v<N>``. The replicas keep generating while a version is written; they pause only for the reload
    (:func:`reload_replicas`). After it, only the newest ``keep`` versions remain (and always the
    served one); one writer per directory.
    """

    def __init__(self, directory: str, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.directory, self.keep = directory, keep
        self.served: str | None = None  # the version directory every replica loaded last

    def __call__(self, weights: Weights, engine: OpenAIEngine) -> None:
        path = self.write(weights)
        reload_replicas(engine.replicas, path)
        self.served = path
        self.collect()

    def write(self, weights: Weights) -> str:
        """Write ``weights`` as ``<directory>/v<version>``, whole or not at all, and return its path."""
        final = os.path.join(self.directory, f"v{weights.version}")
        staging = tempfile.mkdtemp(prefix=f"{STAGING}v{weights.version}-", dir=self.directory)
        try:
            weights.save_pretrained(staging, dtype=served_dtype(self.directory))
            copy_model_files(self.directory, staging)
            for name in os.listdir(staging):
                _fsync(os.path.join(staging, name))
            _publish(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return final

    def collect(self) -> None:
        """Delete all but the newest ``keep`` versions (never the served one) and what crashes left."""
        versions = sorted(((int(m[1]), name) for name in os.listdir(self.directory)
                           if (m := VERSION_DIR.fullmatch(name))), reverse=True)
        doomed = [name for _, name in versions[self.keep:]]
        doomed += [name for name in os.listdir(self.directory) if name.startswith(STAGING)]
        for name in doomed:
            path = os.path.join(self.directory, name)
            if path != self.served:
                shutil.rmtree(path, ignore_errors=True)


def served_dtype(directory: str) -> str | None:
    """The dtype the server holds the weights in: its ``config.json``'s ``dtype`` (transformers 5) or
    ``torch_dtype``, at the top or in a vision-language model's ``text_config``; ``None`` if unnamed."""
    with open(os.path.join(directory, "config.json")) as handle:
        config = json.load(handle)
    for section in (config, config.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            if isinstance(section.get(key), str) and section[key] != "auto":
                return section[key]
    return None


def copy_model_files(source: str, target: str) -> None:
    """Copy ``source``'s own files but its weights (config, generation config, tokenizer, templates)
    into ``target``, over any ``target`` has: the served config is the one to keep."""
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if not name.startswith(".") and not name.endswith(WEIGHT_SUFFIXES) and os.path.isfile(path):
            shutil.copyfile(path, os.path.join(target, name))


def _publish(staging: str, final: str) -> None:
    """Rename the complete ``staging`` to ``final`` (atomic), replacing a ``final`` left by an earlier run."""
    if os.path.exists(final):
        old = staging + ".replaced"  # a staging name: collected if a crash leaves it
        os.rename(final, old)
        os.rename(staging, final)
        shutil.rmtree(old)
    else:
        os.rename(staging, final)
    _fsync(os.path.dirname(final))


def _fsync(path: str) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def reload_replicas(replicas: Sequence[OpenAIClient], path: str) -> None:
    """Have every replica serve the weights in ``path``: pause generation, reload, drop the prefix caches
    computed with the old weights, and resume (always, whatever failed). Each step runs on all the
    replicas at once; a replica's error names it."""
    while_paused(replicas, lambda: raise_first(on_all(replicas, lambda r: control(
        r, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}))[1]))


def while_paused(replicas: Sequence[OpenAIClient], update: Callable[[], None]) -> None:
    """Run ``update`` (a weight update of every replica) while the replicas are paused (``/pause?mode=wait``:
    requests in flight finish first), then drop their prefix caches (computed with the old weights) and
    resume every replica that paused, whatever failed. The pause, the reset and the resume each run on all
    the replicas at once; a replica's error names it (:func:`control`)."""
    paused, error = on_all(replicas, lambda r: control(r, "/pause?mode=wait"))
    try:
        raise_first(error)
        update()
        raise_first(on_all(replicas, _reset_prefix_cache)[1])
    finally:
        raise_first(on_all(paused, lambda r: control(r, "/resume"))[1])


def control(replica: OpenAIClient, path: str, body: dict[str, Any] | None = None,
            retry: RetryPolicy | None = None) -> Any:
    """POST a control route of ``replica``; its error, as :class:`OpenAIError`, names the replica and route."""
    try:
        return replica.post(path, body, retry)
    except OpenAIError as exc:
        raise OpenAIError(f"weight sync: replica {replica.root} failed {path}: {exc}", exc.status) from exc


def _reset_prefix_cache(replica: OpenAIClient) -> None:
    reply = control(replica, "/reset_prefix_cache")
    if isinstance(reply, dict) and reply.get("success") is False:
        raise OpenAIError(f"weight sync: replica {replica.root} kept its prefix cache (blocks still held)")


def on_all(replicas: Sequence[OpenAIClient], call: Callable[[OpenAIClient], Any]
           ) -> tuple[list[OpenAIClient], BaseException | None]:
    """Run ``call`` on every replica at once: the replicas it succeeded on, and the first error."""
    if not replicas:
        return [], None
    with ThreadPoolExecutor(len(replicas)) as pool:
        futures = [pool.submit(call, replica) for replica in replicas]
    errors = [future.exception() for future in futures]
    return ([r for r, e in zip(replicas, errors, strict=True) if e is None],
            next((e for e in errors if e is not None), None))


def raise_first(error: BaseException | None) -> None:
    """Raise ``error`` (the first error of :func:`on_all`), if there is one."""
    if error is not None:
        raise error


class OpenAIEngine:
    """A rollout engine over the server at ``base_url`` (its root or ``/v1``), or over several replicas
    of it (a list of URLs), serving ``model``."""

    native_async = True  # agenerate serves every call generate does, on the event loop (see RolloutEngine)

    def __init__(self, base_url: str | Sequence[str], model: str, api_key: str = "EMPTY",
                 weight_sync: WeightSync | None = None, timeout: float = 600.0,
                 retry: RetryPolicy | None = None) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("OpenAIEngine needs the URL of at least one server")
        self.replicas = [OpenAIClient(url, api_key, timeout=timeout, retry=retry) for url in urls]
        self._turn = itertools.count()  # generation requests go to the replicas in turn; weight syncs reach all
        self.model = model
        self.weight_sync = weight_sync
        self.weight_version: int | None = None  # unknown until this engine updates the weights
        self._syncs = 0  # weight syncs begun plus those ended (see _sampled_by)

    def post(self, path: str, body: dict | None) -> Any:
        """POST to the next replica's ``path`` (from its root; the replicas take turns), with the client's retries."""
        return self._next_replica().post(path, body)

    async def apost(self, path: str, body: dict | None) -> Any:
        """:meth:`post` on the event loop (the same turns, the client's async face)."""
        return await self._next_replica().apost(path, body)

    def _next_replica(self) -> OpenAIClient:
        return self.replicas[next(self._turn) % len(self.replicas)]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        """One completion per prompt, in one ``/v1/completions`` request (blocking)."""
        sent = self._served()
        reply = self.post("/v1/completions", self._request(prompts, sampling))
        return self._completions(reply, len(prompts), self._sampled_by(sent))

    async def agenerate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        """:meth:`generate` on the event loop: the same request and reply, through the client's async face
        (aiohttp), so a process holds as many generations in flight as its callers ask for, no thread each."""
        sent = self._served()
        reply = await self.apost("/v1/completions", self._request(prompts, sampling))
        return self._completions(reply, len(prompts), self._sampled_by(sent))

    def _served(self) -> tuple[int, int | None]:
        """What the replicas serve as a request leaves: the count of syncs begun and ended, and the version."""
        return self._syncs, self.weight_version

    def _sampled_by(self, sent: tuple[int, int | None]) -> int | None:
        """The weights version that sampled a reply to a request sent when :meth:`_served` was ``sent``: that
        version if no sync began or ended meanwhile (nor was running), else unknown (``None``): a request
        refused during a sync's pause and retried after it was sampled by the new weights, not the old."""
        syncs, version = sent
        return version if syncs == self._syncs and syncs % 2 == 0 else None

    def _request(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> dict[str, Any]:
        """The ``/v1/completions`` body: the prompts as token ids, the sampled ids and their logprobs asked back."""
        body = {"model": self.model, "prompt": [list(p) for p in prompts], "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
                "logprobs": 0, "return_token_ids": True}
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        return body

    @staticmethod
    def _completions(reply: Any, count: int, version: int | None) -> list[Completion]:
        """The completions of a ``/v1/completions`` reply to ``count`` prompts, sampled by weights ``version``
        (the engine's version when the request was sent: an update finishing meanwhile does not relabel them)."""
        try:
            choices = sorted(reply["choices"], key=lambda c: c["index"])
            completions = [Completion(token_ids=list(c["token_ids"]), logprobs=list(c["logprobs"]["token_logprobs"]),
                                      finish_reason=c["finish_reason"], text=c["text"], weight_version=version)
                           for c in choices]
        except (KeyError, TypeError) as exc:
            raise OpenAIError(f"/v1/completions gave no token ids and logprobs ({exc!r}): ask a server that "
                              "speaks return_token_ids (vLLM, orchard serve)") from exc
        if len(completions) != count:
            raise OpenAIError(f"asked for {count} completions, got {len(completions)}")
        return completions

    def update_weights(self, weights: Weights) -> None:
        if self.weight_sync is None:
            raise RuntimeError("this OpenAIEngine has no weight_sync: pass ReloadFromDisk(model_dir) or your own")
        self._syncs += 1  # odd while a sync runs: replies then are of no certain version
        try:
            self.weight_sync(weights, self)
        except BaseException:
            self.weight_version = None  # some replicas may have reloaded already: no version is certain
            raise
        finally:
            self._syncs += 1
        self.weight_version = weights.version

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()

    async def aclose(self) -> None:
        """Close every replica's pools, the async face's included (call it on the loop that used them)."""
        for replica in self.replicas:
            await replica.aclose()
