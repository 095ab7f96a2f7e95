"""The sparse MoE layer against the every-expert computation it replaced, one run, on this machine.

Both sides are the same :class:`~orchard.models.transformer.SparseMoE` (same config, same seed, so
the same router and expert weights; float32, one device), on the same ``[1, tokens, hidden]`` input:

* ``sparse``: the layer itself. Each token goes to its top-k experts only: the ``tokens * k`` rows
  are sorted by expert and the three expert matmuls run grouped (on the CPU a tiled grouped matmul,
  since ``jax.lax.ragged_dot`` lowers there to a dense matmul per expert; see
  :func:`~orchard.models.transformer.grouped_matmul`).
* ``every_expert`` (the peer): what the layer did before, :func:`every_expert` below: the same router,
  then every expert on every token, the outputs weighted by the top-k probabilities (zero elsewhere).
  Its work does not depend on k, so it is measured once per expert count (at the smallest k that
  count allows) and shown beside each k.

For each side and each (experts, k): the forward pass, and the forward and backward pass (the
gradient of ``sum(out * cotangent)`` with respect to all layer parameters and the input), are
compiled ahead of time (``jax.jit(...).lower(...).compile()``); ``flops`` is XLA's own count from
``cost_analysis()`` (gathers, scatters and sorts count no FLOPs there), ``routed`` the matmul FLOPs of
the routed rows alone (``2 * 3 * tokens * k * hidden * ffn`` forward). Timing: ``repeats`` calls of
the compiled executable, each until its outputs are ready, the best kept, as microseconds per token.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from orchard.models.config import ModelConfig
from orchard.models.transformer import SparseMoE
from orchard.results import markdown_table


@dataclass(frozen=True)
class MoeBenchConfig:
    hidden_size: int = 256
    ffn: int = 512
    experts: tuple[int, ...] = (8, 32, 128)
    top_k: tuple[int, ...] = (1, 2, 8)
    tokens: int = 2048
    repeats: int = 2
    seed: int = 0


def build_layer(cfg: MoeBenchConfig, experts: int, top_k: int) -> SparseMoE:
    model = ModelConfig(model_type="qwen3_moe", vocab_size=8, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn,
                        num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8, num_experts=experts,
                        num_experts_per_tok=top_k, moe_intermediate_size=cfg.ffn, norm_topk_prob=True,
                        dtype="float32")
    return SparseMoE(model, nnx.Rngs(cfg.seed))


def every_expert(moe: SparseMoE, x: jax.Array) -> jax.Array:
    """The peer: every expert on every token, weighted by the top-k (renormalised) router probabilities."""
    cfg = moe.cfg
    probs = jax.nn.softmax(moe.gate(x).astype(jnp.float32), axis=-1)  # [B, T, E]
    top, index = jax.lax.top_k(probs, cfg.num_experts_per_tok)  # [B, T, k]
    if cfg.norm_topk_prob:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    weights = jnp.sum(jax.nn.one_hot(index, cfg.num_experts) * top[..., None], axis=-2)  # [B, T, E]
    gate, up, down = (p[...].astype(x.dtype) for p in (moe.experts.gate_proj, moe.experts.up_proj,
                                                       moe.experts.down_proj))
    hidden = jax.nn.silu(jnp.einsum("btd,edf->btef", x, gate)) * jnp.einsum("btd,edf->btef", x, up)
    return jnp.einsum("bte,bted->btd", weights.astype(x.dtype), jnp.einsum("btef,efd->bted", hidden, down))


def sparse(moe: SparseMoE, x: jax.Array) -> jax.Array:
    return moe(x)


def measure(layer: Callable[[SparseMoE, jax.Array], jax.Array], moe: SparseMoE, x: jax.Array,
            repeats: int) -> dict[str, float]:
    """FLOPs (XLA's count) and the best µs per token of the forward and the forward + backward pass."""
    graphdef, params = nnx.split(moe, nnx.Param)
    cotangent = jax.random.normal(jax.random.key(1), x.shape, x.dtype)

    def forward(params, x):
        return layer(nnx.merge(graphdef, params), x)

    def loss(params, x):
        return jnp.sum(forward(params, x) * cotangent)

    result = {}
    for name, fn in (("fwd", forward), ("fwd_bwd", jax.value_and_grad(loss, argnums=(0, 1)))):
        compiled = jax.jit(fn).lower(params, x).compile()
        result[f"{name}_flops"] = int(compiled.cost_analysis()["flops"])
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(params, x))
            best = min(best, time.perf_counter() - start)
        result[f"{name}_us_per_token"] = round(best / x.shape[1] * 1e6, 3)
    return result


def run_benchmark(cfg: MoeBenchConfig, command: str | None = None) -> dict[str, Any]:
    x = jax.random.normal(jax.random.key(cfg.seed), (1, cfg.tokens, cfg.hidden_size), jnp.float32)
    rows, peers = [], []
    for experts in cfg.experts:
        ks = [k for k in cfg.top_k if k <= experts]
        peer = {"experts": experts, "top_k": ks[0],
                **measure(every_expert, build_layer(cfg, experts, ks[0]), x, cfg.repeats)}
        peers.append(peer)
        for k in ks:
            moe = build_layer(cfg, experts, k)
            index = jax.lax.top_k(jax.nn.softmax(moe.gate(x), axis=-1), k)[1]
            load = jnp.bincount(index.ravel(), length=experts)
            mine = measure(sparse, moe, x, cfg.repeats)
            rows.append({
                "experts": experts, "top_k": k, "tokens": cfg.tokens,
                "routed_fwd_flops": 2 * 3 * cfg.tokens * k * cfg.hidden_size * cfg.ffn,
                "experts_without_tokens": int(jnp.sum(load == 0)),
                "busiest_expert_rows": int(jnp.max(load)),
                "sparse": mine,
                "every_expert": {key: value for key, value in peer.items() if key not in ("experts", "top_k")},
                "speedup_fwd": round(peer["fwd_us_per_token"] / mine["fwd_us_per_token"], 2),
                "speedup_fwd_bwd": round(peer["fwd_bwd_us_per_token"] / mine["fwd_bwd_us_per_token"], 2),
            })
    return {
        "results": rows,
        "every_expert": peers,
        "metadata": {"timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "jax": jax.__version__,
                     "backend": jax.default_backend(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "command": command, "config": asdict(cfg)},
    }


def render_markdown(summary: dict[str, Any]) -> str:
    meta = summary["metadata"]
    cfg = meta["config"]
    lines = [
        "## Sparse MoE dispatch",
        "",
        f"Produced by `experiments/moe_bench/run.py` on {meta['timestamp']} ({meta['cpu_count']} CPUs, "
        f"{meta['platform']}, JAX {meta['jax']} on {meta['backend']}): one `SparseMoE` layer, hidden "
        f"{cfg['hidden_size']}, expert FFN {cfg['ffn']}, {cfg['tokens']} tokens, float32. `sparse` sends each token "
        "to its top-k experts (sorted rows, grouped matmuls: on the CPU the tiled grouped matmul, not "
        "`ragged_dot`'s dense-per-expert lowering); the peer `every expert` is the computation it replaced "
        "(every expert on every token, weighted by the top-k probabilities), measured once per expert count. "
        "GFLOP is XLA's `cost_analysis()` of the compiled pass; *routed* is the matmul FLOPs of the routed rows "
        f"alone. Times are the best of {cfg['repeats']} calls, µs per token. See `benchmarks/moe.py`.",
        "",
    ]
    columns = ["E", "k", "routed fwd GFLOP", "sparse fwd GFLOP", "every-expert fwd GFLOP", "sparse fwd µs/tok",
               "every-expert fwd µs/tok", "fwd speedup", "sparse fwd+bwd GFLOP", "every-expert fwd+bwd GFLOP",
               "sparse fwd+bwd µs/tok", "every-expert fwd+bwd µs/tok", "fwd+bwd speedup"]
    rows = []
    for row in summary["results"]:
        mine, peer = row["sparse"], row["every_expert"]
        rows.append([row["experts"], row["top_k"], f"{row['routed_fwd_flops'] / 1e9:.2f}", f"{mine['fwd_flops'] / 1e9:.2f}",
                     f"{peer['fwd_flops'] / 1e9:.2f}", f"{mine['fwd_us_per_token']:.1f}", f"{peer['fwd_us_per_token']:.1f}",
                     f"{row['speedup_fwd']:.2f}x", f"{mine['fwd_bwd_flops'] / 1e9:.2f}", f"{peer['fwd_bwd_flops'] / 1e9:.2f}",
                     f"{mine['fwd_bwd_us_per_token']:.1f}", f"{peer['fwd_bwd_us_per_token']:.1f}",
                     f"{row['speedup_fwd_bwd']:.2f}x"])
    lines += [markdown_table(columns, rows, "right"), "", f"Reproduce: `{meta['command']}`"]
    return "\n".join(lines)
