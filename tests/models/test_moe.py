"""The sparse MoE layer (each token through its top-k experts only) against every expert on every token."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from benchmarks.moe import every_expert  # the benchmark's peer is the reference
from orchard.models import ModelConfig
from orchard.models.sharding import make_mesh, shard_model
from orchard.models.transformer import SparseMoE, grouped_matmul, grouped_matmul_tiled


def moe_config(experts: int, top_k: int, norm: bool, dtype: str = "float32") -> ModelConfig:
    return ModelConfig(model_type="qwen3_moe", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=8, num_experts=experts, num_experts_per_tok=top_k,
                       moe_intermediate_size=24, norm_topk_prob=norm, dtype=dtype)


def routed_experts(moe: SparseMoE, x: jax.Array) -> np.ndarray:
    probs = jax.nn.softmax(moe.gate(x).astype(jnp.float32), axis=-1)
    return np.asarray(jax.lax.top_k(probs, moe.cfg.num_experts_per_tok)[1])


def value_and_grads(fn, moe: SparseMoE, x: jax.Array, cotangent: jax.Array):
    graphdef, params = nnx.split(moe, nnx.Param)

    def loss(params, x):
        return jnp.sum(fn(nnx.merge(graphdef, params), x) * cotangent)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)


def assert_layer_matches_reference(moe: SparseMoE, x: jax.Array, tol: float = 1e-5):
    got = nnx.jit(lambda m, x: m(x))(moe, x)
    want = every_expert(moe, x)
    scale = float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol * scale)
    cotangent = jax.random.normal(jax.random.key(7), want.shape, want.dtype)
    (_, (grads, dx)), (_, (want_grads, want_dx)) = (value_and_grads(fn, moe, x, cotangent)
                                                    for fn in (lambda m, x: m(x), every_expert))
    for name in ("gate_proj", "up_proj", "down_proj"):
        got_grad, want_grad = (np.asarray(g["experts"][name][...]) for g in (grads, want_grads))
        np.testing.assert_allclose(got_grad, want_grad, rtol=tol, atol=tol * np.abs(want_grad).max(), err_msg=name)
    router, want_router = (np.asarray(g["gate"]["kernel"][...]) for g in (grads, want_grads))
    np.testing.assert_allclose(router, want_router, rtol=tol, atol=tol * np.abs(want_router).max())
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want_dx), rtol=tol, atol=tol * np.abs(want_dx).max())


@pytest.mark.parametrize(("experts", "top_k", "norm"), [(4, 2, True), (8, 1, False), (8, 3, True), (16, 8, False),
                                                        (6, 6, True)])
def test_sparse_layer_equals_every_expert(experts, top_k, norm):
    moe = SparseMoE(moe_config(experts, top_k, norm), nnx.Rngs(experts * 10 + top_k))
    x = jax.random.normal(jax.random.key(1), (3, 37, 16), jnp.float32)
    assert_layer_matches_reference(moe, x)


def test_experts_that_get_no_tokens():
    moe = SparseMoE(moe_config(8, 2, True), nnx.Rngs(0))
    kernel = moe.gate.kernel[...]
    moe.gate.kernel.set_value(kernel.at[:, 3:6].set(-1.0))  # [D, E]
    x = jnp.abs(jax.random.normal(jax.random.key(2), (2, 20, 16), jnp.float32))  # positive: experts 3-5 lose
    routed = set(routed_experts(moe, x).ravel().tolist())
    assert routed and routed.isdisjoint({3, 4, 5})
    assert_layer_matches_reference(moe, x)


@pytest.mark.parametrize("top_k", [1, 3])
def test_all_tokens_pick_the_same_expert(top_k):
    moe = SparseMoE(moe_config(8, top_k, top_k > 1), nnx.Rngs(1))
    moe.gate.kernel.set_value(jnp.zeros((16, 8)).at[:, 5].set(1.0))  # expert 5 scores sum(x) > 0, the rest 0
    x = jnp.abs(jax.random.normal(jax.random.key(3), (2, 16, 16), jnp.float32)) + 0.1
    assert (routed_experts(moe, x)[..., 0] == 5).all()
    assert_layer_matches_reference(moe, x)


def test_bf16_compute_is_as_close_as_every_expert_in_bf16():
    moe = SparseMoE(moe_config(8, 2, True, dtype="bfloat16"), nnx.Rngs(4))
    x = jax.random.normal(jax.random.key(5), (2, 24, 16), jnp.float32)
    got = nnx.jit(lambda m, x: m(x))(moe, x.astype(jnp.bfloat16))
    assert got.dtype == jnp.bfloat16
    exact = every_expert(moe, x)
    error = float(jnp.mean(jnp.abs(got.astype(jnp.float32) - exact)))
    dense_error = float(jnp.mean(jnp.abs(every_expert(moe, x.astype(jnp.bfloat16)).astype(jnp.float32) - exact)))
    assert error < 2 * dense_error and error < 0.1 * float(jnp.mean(jnp.abs(exact)))


@pytest.mark.parametrize("sizes", [[3, 0, 9, 0, 4], [0, 0, 16, 0, 0], [16, 0, 0, 0, 0], [1, 1, 1, 1, 12],
                                   [0, 5, 0, 0, 6]])
@pytest.mark.parametrize("tile", [None, 4, 8])
def test_tiled_grouped_matmul_equals_ragged_dot(sizes, tile):
    x = jax.random.normal(jax.random.key(0), (16, 6), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (5, 6, 7), jnp.float32)
    sizes = jnp.asarray(sizes, jnp.int32)
    covered = int(sizes.sum())  # [0, 5, 0, 0, 6] leaves rows over: they come back zero
    got = grouped_matmul_tiled(x, w, sizes, tile)
    np.testing.assert_allclose(np.asarray(got[:covered]), np.asarray(jax.lax.ragged_dot(x, w, sizes))[:covered],
                               rtol=1e-5, atol=1e-5)
    assert not np.asarray(got[covered:]).any()
    np.testing.assert_allclose(np.asarray(grouped_matmul(x, w, sizes))[:covered], np.asarray(got[:covered]),
                               rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda x, w: jnp.sum(grouped_matmul_tiled(x, w, sizes, tile)[:covered] ** 2), (0, 1))
    reference = jax.grad(lambda x, w: jnp.sum(jax.lax.ragged_dot(x, w, sizes)[:covered] ** 2), (0, 1))
    for got_grad, want_grad in zip(grad(x, w), reference(x, w), strict=True):
        np.testing.assert_allclose(np.asarray(got_grad), np.asarray(want_grad), rtol=1e-4, atol=1e-4)


def test_grouped_matmul_flops_grow_with_rows_not_groups():
    """On the CPU the tiled path runs: FLOPs of about the rows' own, not ``ragged_dot``'s G-times dense."""
    x, sizes = jnp.ones((256, 32)), jnp.full((64,), 4, jnp.int32)
    w = jnp.ones((64, 32, 32))
    flops = jax.jit(grouped_matmul).lower(x, w, sizes).compile().cost_analysis()["flops"]
    assert flops < 4 * 2 * 256 * 32 * 32 < 64 * 2 * 256 * 32 * 32


def test_jits_once_per_shape():
    moe = SparseMoE(moe_config(8, 2, True), nnx.Rngs(0))
    traces = []

    @nnx.jit
    def forward(moe, x):
        traces.append(x.shape)
        return moe(x)

    seen = set()
    for seed in range(4):  # different tokens, so different routing and group sizes
        x = jax.random.normal(jax.random.key(seed), (2, 12, 16), jnp.float32) * (seed + 1)
        forward(moe, x)
        seen.add(tuple(np.bincount(routed_experts(moe, x).ravel(), minlength=8)))
    assert len(seen) > 1 and traces == [(2, 12, 16)]
    forward(moe, jnp.ones((1, 5, 16)))
    assert traces == [(2, 12, 16), (1, 5, 16)]


@pytest.mark.parametrize(("mesh_shape", "experts"), [((1, 1, 4), 8), ((2, 1, 4), 8), ((2, 2, 2), 4),
                                                     ((1, 1, 4), 6)])
def test_expert_parallel_equals_one_device(mesh_shape, experts):
    """With ``ep`` dividing the experts each shard computes its own experts (a shard_map over ``ep``);
    otherwise (6 experts over 4) the experts stay replicated and the single-device dispatch runs."""
    moe = SparseMoE(moe_config(experts, 2, True), nnx.Rngs(3))
    x = jax.random.normal(jax.random.key(4), (4, 10, 16), jnp.float32)
    want = nnx.jit(lambda m, x: m(x))(moe, x)
    cotangent = jax.random.normal(jax.random.key(8), want.shape)
    _, (want_grads, want_dx) = value_and_grads(lambda m, x: m(x), moe, x, cotangent)

    sharded = shard_model(SparseMoE(moe_config(experts, 2, True), nnx.Rngs(3)), make_mesh(*mesh_shape))
    jaxpr = str(jax.make_jaxpr(lambda m, x: m(x))(sharded, x))
    assert ("shard_map" in jaxpr) == (experts % mesh_shape[2] == 0)
    got = nnx.jit(lambda m, x: m(x))(sharded, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    _, (grads, dx) = value_and_grads(lambda m, x: m(x), sharded, x, cotangent)
    for got_leaf, want_leaf in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(got_leaf), np.asarray(want_leaf), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want_dx), rtol=1e-5, atol=1e-5)
