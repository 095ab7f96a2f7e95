"""The learner and the sampler on an accelerator, each against its PyTorch peer on the same device and shapes.

Sections (each a function of a :class:`Size`, each run by ``experiments/gpu_check/accelerator.py`` in a
process of its own, so that JAX's and torch's memory pools never meet and a crash costs one section):

* ``orchard_train``: Orchard's SFT step (:func:`~orchard.train.state.token_losses`) and GRPO step (the clipped
  policy loss, :func:`~orchard.train.grpo.make_policy_loss`) on a Qwen3-0.6B-shaped model (``bfloat16``
  parameters and compute with a ``float32`` master copy in the optimizer, blockwise attention, a chunked LM
  head), ``rows x seq_len`` tokens a step: tokens/s and MFU (``6 x parameters x tokens/s`` over the device's
  dense bf16 peak; attention's FLOPs are not counted, which understates MFU at long rows).
* ``torch_train``: the same two steps with transformers' ``Qwen3ForCausalLM`` (the same config, random weights,
  ``bfloat16``, eager, fused AdamW on a GPU): the loss on the same tokens, the policy loss written the same way.
* ``orchard_sampler``: :class:`~orchard.rollout.sampler.Sampler` greedy decoding of ``new_tokens`` after a
  ``prompt_tokens`` prompt at each batch size; writes the weights as an HF directory and its greedy tokens.
* ``torch_sampler``: ``transformers.generate`` (greedy, the same prompts, exactly ``new_tokens``) over those
  weights; its tokens against Orchard's (the share of rows identical, and of tokens before the first
  difference: ``bfloat16`` sums in another order split near-ties, so a row can part late and stay right).
* ``moe``: the sparse MoE dispatch against every expert on every token (:mod:`benchmarks.moe`).
* ``attention``: Orchard's blockwise attention against ``jax.nn.dot_product_attention`` (cuDNN on a GPU, XLA
  elsewhere), forward and backward, at each length, with their outputs compared.

``Size`` ``qwen3_0_6b`` is the device check's; ``tiny`` is what the CPU test runs (the same code, small).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Dense bfloat16 peaks (FLOP/s) by the device kind JAX and torch report; MFU is left out elsewhere.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12}
QWEN3_0_6B = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
              "num_layers": 28, "num_heads": 16, "num_kv_heads": 8, "head_dim": 128, "rope_theta": 1_000_000.0,
              "qk_norm": True, "tie_word_embeddings": True, "max_position_embeddings": 40960}


@dataclass(frozen=True)
class Size:
    model: dict = field(default_factory=lambda: dict(QWEN3_0_6B))
    dtype: str = "bfloat16"
    rows: int = 8
    seq_len: int = 2048
    steps: int = 5  # timed train steps, after one untimed (JAX compiles on it)
    losses: tuple[str, ...] = ("sft", "grpo")  # the train steps measured
    attention_block: int = 512
    logits_chunk: int = 1024
    batches: tuple[int, ...] = (1, 16, 64)
    prompt_tokens: int = 128
    new_tokens: int = 128
    attention_lengths: tuple[int, ...] = (8192, 32768)
    moe: dict = field(default_factory=lambda: {"hidden_size": 1024, "ffn": 768, "experts": (64, 128),
                                               "top_k": (8,), "tokens": 8192})
    seed: int = 0


SIZES = {
    "qwen3_0_6b": Size(),
    "tiny": Size(model={**QWEN3_0_6B, "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
                        "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "max_position_embeddings": 512},
                 dtype="float32", rows=2, seq_len=64, steps=1, attention_block=32, logits_chunk=32, batches=(1, 2),
                 prompt_tokens=8, new_tokens=6, attention_lengths=(128,),
                 moe={"hidden_size": 32, "ffn": 64, "experts": (4,), "top_k": (2,), "tokens": 64}),
}


def peak_flops(kind: str) -> float | None:
    """The dense bf16 peak of a device kind ("NVIDIA H200", "TPU v5p"...), None where unknown (a CPU)."""
    return next((peak for name, peak in PEAK_FLOPS.items() if name.lower() in kind.lower()), None)


def train_tokens(size: Size) -> dict[str, np.ndarray]:
    """One step's batch, shared by both sides: random token rows (``[rows, seq_len + 1]`` before the
    shift), every target trained, advantages alternating +1 / -1 by row, old logprobs of a uniform policy."""
    rng = np.random.default_rng(size.seed)
    ids = rng.integers(0, size.model["vocab_size"], (size.rows, size.seq_len + 1), dtype=np.int32)
    advantages = np.where(np.arange(size.rows) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None]
    shape = (size.rows, size.seq_len)
    return {"inputs": ids[:, :-1], "targets": ids[:, 1:], "loss_mask": np.ones(shape, np.float32),
            "advantages": np.broadcast_to(advantages, shape).copy(),
            "old_logprobs": np.full(shape, -np.log(size.model["vocab_size"]), np.float32)}


def _timed(call: Callable[[], Any], steps: int = 1) -> tuple[float, Any]:
    """Seconds per call of ``call`` (which blocks until its results are ready), after one untimed call, and
    what the last call returned."""
    value = call()
    started = time.perf_counter()
    for _ in range(steps):
        value = call()
    return (time.perf_counter() - started) / steps, value


def _throughput(seconds: float, tokens: int, params: int, kind: str) -> dict[str, Any]:
    rate = tokens / seconds
    peak = peak_flops(kind)
    return {"step_s": seconds, "tokens_per_s": rate, "mfu": 6 * params * rate / peak if peak else None}


def orchard_train(size: Size, out: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from orchard.models import ModelConfig, Transformer
    from orchard.models.sharding import MeshConfig
    from orchard.train.grpo import make_policy_loss
    from orchard.train.state import OptimConfig, init_state, make_optimizer, make_train_step, token_losses

    cfg = ModelConfig(**{**size.model, "dtype": size.dtype, "param_dtype": size.dtype,
                         "attention_block": size.attention_block, "logits_chunk": size.logits_chunk})
    data = train_tokens(size)
    positions = np.broadcast_to(np.arange(size.seq_len, dtype=np.int32), (size.rows, size.seq_len))
    batch = {"tokens": data["inputs"], "targets": data["targets"], "loss_mask": data["loss_mask"],
             "positions": positions, "segment_ids": np.ones_like(positions), "advantages": data["advantages"],
             "old_logprobs": data["old_logprobs"]}
    batch = {k: jnp.asarray(v)[None] for k, v in batch.items()}  # one micro-batch
    result: dict[str, Any] = {"device": jax.devices()[0].device_kind, "tokens_per_step": size.rows * size.seq_len}
    for name, loss in (("sft", token_losses), ("grpo", make_policy_loss())):
        if name not in size.losses:
            continue
        model = Transformer(cfg, rngs=nnx.Rngs(size.seed))
        params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        master = "float32" if size.dtype != "float32" else ""
        optimizer, schedule = make_optimizer(OptimConfig(1e-5, 1e-6, 1, master_dtype=master), 100)
        graphdef, state = init_state(model, optimizer, MeshConfig().make())
        del model
        holder = {"state": state, "step": make_train_step(graphdef, optimizer, schedule, loss_fn=loss)}
        seconds, _ = _timed(functools.partial(_orchard_step, holder, batch), size.steps)
        result[name] = {**_throughput(seconds, size.rows * size.seq_len, params, result["device"]), "params": params}
    return result


def _orchard_step(holder: dict[str, Any], batch: dict[str, Any]) -> None:
    import jax

    holder["state"], metrics = holder["step"](holder["state"], batch)
    jax.block_until_ready(metrics)


def _torch_device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _hf_config(size: Size) -> Any:
    import transformers

    m = size.model
    return transformers.Qwen3Config(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
                                    intermediate_size=m["intermediate_size"], num_hidden_layers=m["num_layers"],
                                    num_attention_heads=m["num_heads"], num_key_value_heads=m["num_kv_heads"],
                                    head_dim=m["head_dim"], rope_theta=m["rope_theta"],
                                    tie_word_embeddings=m["tie_word_embeddings"],
                                    max_position_embeddings=m["max_position_embeddings"])


def torch_train(size: Size, out: str) -> dict[str, Any]:
    import torch
    import transformers

    from orchard.train.grpo import EPS_HIGH, EPS_LOW  # importing JAX claims no device memory

    device = _torch_device()
    dtype = getattr(torch, size.dtype)
    data = {k: torch.as_tensor(v, device=device) for k, v in train_tokens(size).items()}
    kind = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result: dict[str, Any] = {"device": kind, "tokens_per_step": size.rows * size.seq_len,
                              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}

    def sft_loss(logits: Any) -> Any:
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), data["targets"].long().flatten())

    def grpo_loss(logits: Any) -> Any:  # the clipped policy loss, as orchard.train.grpo writes it
        logp = torch.log_softmax(logits.float(), -1).gather(-1, data["targets"].long()[..., None])[..., 0]
        ratio = torch.exp(logp - data["old_logprobs"])
        advantages = data["advantages"]
        loss = -torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * advantages)
        return (loss * data["loss_mask"]).sum() / data["loss_mask"].sum()

    for name, loss_of in (("sft", sft_loss), ("grpo", grpo_loss)):
        if name not in size.losses:
            continue
        torch.manual_seed(size.seed)
        model = transformers.Qwen3ForCausalLM(_hf_config(size)).to(device=device, dtype=dtype).train()
        params = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
        seconds, _ = _timed(functools.partial(_torch_step, model, optimizer, loss_of, data["inputs"]), size.steps)
        result[name] = {**_throughput(seconds, size.rows * size.seq_len, params, kind), "params": params}
        del model, optimizer
    return result


def _torch_step(model: Any, optimizer: Any, loss_of: Callable[[Any], Any], inputs: Any) -> None:
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss_of(model(input_ids=inputs.long()).logits).backward()
    optimizer.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _prompts(size: Size, batch: int) -> np.ndarray:
    rng = np.random.default_rng(size.seed + batch)
    return rng.integers(0, size.model["vocab_size"], (batch, size.prompt_tokens), dtype=np.int32)


def orchard_sampler(size: Size, out: str) -> dict[str, Any]:
    import jax
    from flax import nnx

    from orchard.models import ModelConfig, Transformer, save_pretrained
    from orchard.rollout.sampler import Sampler
    from orchard.rollout.types import SamplingParams

    cfg = ModelConfig(**{**size.model, "dtype": size.dtype, "param_dtype": size.dtype})
    model = Transformer(cfg, rngs=nnx.Rngs(size.seed))
    save_pretrained(model, os.path.join(out, "model"))
    sampler = Sampler(model)
    greedy = SamplingParams(max_tokens=size.new_tokens, temperature=0.0)
    result: dict[str, Any] = {"device": jax.devices()[0].device_kind, "batches": {}}
    tokens = {}
    for batch in size.batches:
        prompts = [list(map(int, row)) for row in _prompts(size, batch)]
        seconds, completions = _timed(functools.partial(sampler.generate, prompts, greedy))
        result["batches"][str(batch)] = {"seconds": seconds, "tokens_per_s": batch * size.new_tokens / seconds}
        tokens[str(batch)] = [list(c.token_ids) for c in completions]
    with open(os.path.join(out, "orchard_tokens.json"), "w") as handle:
        json.dump(tokens, handle)
    return result


def torch_sampler(size: Size, out: str) -> dict[str, Any]:
    import torch
    import transformers

    device = _torch_device()
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(out, "model"),
                                                              dtype=getattr(torch, size.dtype)).to(device).eval()
    with open(os.path.join(out, "orchard_tokens.json")) as handle:
        orchard_tokens = json.load(handle)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                              "batches": {}}
    for batch in size.batches:
        prompts = torch.as_tensor(_prompts(size, batch), device=device).long()
        seconds, generated = _timed(functools.partial(_hf_generate, model, prompts, size.new_tokens))
        result["batches"][str(batch)] = {"seconds": seconds, "tokens_per_s": batch * size.new_tokens / seconds,
                                         **greedy_parity(orchard_tokens.get(str(batch), []), generated)}
    return result


def _hf_generate(model: Any, prompts: Any, new_tokens: int) -> list[list[int]]:
    import torch

    with torch.no_grad():
        ids = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return ids[:, prompts.shape[1]:].tolist()  # .tolist() waits for the device


def greedy_parity(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, float]:
    """How far two greedy decodings of the same prompts agree: the share of rows identical, and the mean share
    of each row's tokens before the first difference."""
    if not ours or len(ours) != len(theirs):
        return {"rows_identical": 0.0, "agreeing_prefix": 0.0}
    prefixes = []
    for a, b in zip(ours, theirs, strict=True):
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        prefixes.append(same / max(len(a), len(b), 1))
    return {"rows_identical": float(np.mean([a == b for a, b in zip(ours, theirs, strict=True)])),
            "agreeing_prefix": float(np.mean(prefixes))}


def moe(size: Size, out: str) -> dict[str, Any]:
    from benchmarks.moe import MoeBenchConfig, run_benchmark

    return run_benchmark(MoeBenchConfig(**size.moe))


def attention(size: Size, out: str) -> dict[str, Any]:
    import jax

    on_gpu = jax.devices()[0].platform == "gpu"
    result: dict[str, Any] = {"device": jax.devices()[0].device_kind, "peer": "cudnn" if on_gpu else "xla",
                              "lengths": {}}
    for length in size.attention_lengths:
        result["lengths"][str(length)] = _attention_row(size, length, "cudnn" if on_gpu else "xla")
    return result


def _blockwise(q: Any, k: Any, v: Any, block: int) -> Any:
    """Orchard's blockwise attention on the peer's layout (``[B, T, heads, Dh]`` queries; both scale by
    ``Dh ** -0.5`` themselves): query head ``n`` is kv head ``n // groups``'s, as the peer groups them."""
    import jax.numpy as jnp

    from orchard.models.transformer import attend_blockwise

    b, t, heads, dh = q.shape
    kv = k.shape[2]
    grouped = q.reshape(b, t, kv, heads // kv, dh)
    return attend_blockwise(grouped, k, v, jnp.ones((b, t), jnp.int32), block).reshape(b, t, heads, dh)


def _attention_row(size: Size, length: int, implementation: str) -> dict[str, Any]:
    """Both attentions at one length: forward and forward-backward seconds, and their outputs' difference."""
    import jax
    import jax.numpy as jnp

    m, dtype = size.model, getattr(jnp, size.dtype)
    keys = jax.random.split(jax.random.key(size.seed), 4)
    q = jax.random.normal(keys[0], (1, length, m["num_heads"], m["head_dim"]), dtype)
    k = jax.random.normal(keys[1], (1, length, m["num_kv_heads"], m["head_dim"]), dtype)
    v = jax.random.normal(keys[2], (1, length, m["num_kv_heads"], m["head_dim"]), dtype)
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32)
    sides = {"orchard_blockwise": functools.partial(_blockwise, block=size.attention_block),
             "jax_dot_product_attention": functools.partial(jax.nn.dot_product_attention, is_causal=True,
                                                            implementation=implementation)}
    row: dict[str, Any] = {}
    outputs = {}
    for name, attend in sides.items():
        forward = jax.jit(attend)
        backward = jax.jit(jax.grad(functools.partial(_weighted_sum, attend, cotangent), argnums=(0, 1, 2)))
        try:
            seconds, out = _timed(functools.partial(_ready, forward, q, k, v), 2)
            outputs[name] = np.asarray(out.astype(jnp.float32))
            row[name] = {"forward_s": seconds,
                         "forward_backward_s": _timed(functools.partial(_ready, backward, q, k, v), 2)[0]}
        except Exception as error:  # e.g. cuDNN refusing a shape: the other side still counts
            row[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    if len(outputs) == 2:
        row["max_abs_difference"] = float(np.max(np.abs(outputs["orchard_blockwise"]
                                                        - outputs["jax_dot_product_attention"])))
    return row


def _weighted_sum(attend: Callable[..., Any], cotangent: Any, q: Any, k: Any, v: Any) -> Any:
    import jax.numpy as jnp

    return jnp.sum(attend(q, k, v).astype(jnp.float32) * cotangent)


def _ready(fn: Callable[..., Any], *args: Any) -> Any:
    import jax

    return jax.block_until_ready(fn(*args))


SECTIONS: dict[str, Callable[[Size, str], dict[str, Any]]] = {
    "orchard_train": orchard_train, "torch_train": torch_train, "orchard_sampler": orchard_sampler,
    "torch_sampler": torch_sampler, "moe": moe, "attention": attention}


def compare(sections: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios from the sections that ran: Orchard over torch tokens/s for each train step and
    batch size, and the blockwise attention over the peer's forward-backward time (below 1: faster)."""
    ratios: dict[str, Any] = {}
    ours, theirs = sections.get("orchard_train", {}), sections.get("torch_train", {})
    for step in ("sft", "grpo"):
        if "tokens_per_s" in ours.get(step, {}) and "tokens_per_s" in theirs.get(step, {}):
            ratios[f"{step}_tokens_per_s_vs_torch"] = ours[step]["tokens_per_s"] / theirs[step]["tokens_per_s"]
    ours, theirs = sections.get("orchard_sampler", {}), sections.get("torch_sampler", {})
    for batch, row in ours.get("batches", {}).items():
        if batch in theirs.get("batches", {}):
            ratios[f"sampler_batch_{batch}_vs_generate"] = row["tokens_per_s"] / theirs["batches"][batch]["tokens_per_s"]
    for length, row in sections.get("attention", {}).get("lengths", {}).items():
        a, b = row.get("orchard_blockwise", {}), row.get("jax_dot_product_attention", {})
        if "forward_backward_s" in a and "forward_backward_s" in b:
            ratios[f"attention_{length}_time_vs_peer"] = a["forward_backward_s"] / b["forward_backward_s"]
    return ratios
