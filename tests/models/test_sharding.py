"""The same model, sharded over 8 fake CPU devices (fsdp x tp x ep), gives the same logits."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from orchard.models import from_pretrained
from orchard.models.sharding import make_mesh, partition_spec, shard_bytes

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models")


def test_eight_fake_devices_are_there():
    assert len(jax.devices()) == 8, "tests/conftest.py sets XLA_FLAGS before JAX starts"


@pytest.mark.parametrize(("family", "mesh_shape"), [("qwen3_moe", (2, 2, 2)), ("llama", (4, 2, 1)),
                                                    ("qwen2", (1, 8, 1))])
def test_sharded_logits_match_transformers(family, mesh_shape):
    mesh = make_mesh(*mesh_shape)
    path = os.path.join(FIXTURES, family)
    expected = np.load(os.path.join(path, "expected.npz"))
    model = from_pretrained(path, mesh=mesh, dtype="float32")
    logits = nnx.jit(lambda m, tokens: m(tokens))(model, jnp.asarray(expected["tokens"]))
    np.testing.assert_allclose(np.asarray(logits), expected["logits"], rtol=1e-4, atol=1e-4)


def test_parameters_are_split_across_devices():
    mesh = make_mesh(2, 2, 2)
    model = from_pretrained(os.path.join(FIXTURES, "qwen3_moe"), mesh=mesh, dtype="float32")
    experts = model.model.layers[0].mlp.experts.gate_proj[...]  # [E=4, D=32, F=16]
    assert experts.sharding.spec == PartitionSpec("ep", "fsdp", "tp")
    assert shard_bytes(experts) * 8 == experts.nbytes  # each device holds an eighth
    embed = model.model.embed_tokens.weight[...]  # [V=96, D=32]
    assert embed.sharding.spec == PartitionSpec("tp", "fsdp") and shard_bytes(embed) * 4 == embed.nbytes


def test_uneven_dimensions_stay_replicated():
    mesh = make_mesh(1, 8, 1)
    # `embed` maps to fsdp, which has size 1 here: not split. 192 rows split 8 ways; 188 do not.
    assert partition_spec(("embed", "kv_heads"), (576, 192), mesh) == PartitionSpec(None, "tp")
    assert partition_spec(("embed", "kv_heads"), (576, 188), mesh) == PartitionSpec(None, None)
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_mesh(4, 4, 1)


def test_the_mesh_is_laid_out_by_jax_with_auto_axes():
    mesh = make_mesh(2, 2, 1)
    assert mesh.axis_names == ("fsdp", "tp", "ep") and dict(mesh.shape) == {"fsdp": 2, "tp": 2, "ep": 1}
    assert set(mesh.axis_types) == {jax.sharding.AxisType.Auto}  # not jax.make_mesh's default, Explicit
    picked = jax.devices()[4:]
    assert list(make_mesh(2, 2, 1, devices=picked).devices.flat) == picked  # the given devices, the first ones


def test_a_sharded_load_reads_only_each_shards_block_of_the_file(monkeypatch):
    """From safetensors, each device's shard is read as a block of the file (an expert's [out, in] tensor,
    split over fsdp and tp, is read a quarter at a time), and the parameters equal a whole-tensor load."""
    from orchard.models.checkpoint import SafetensorsCheckpoint

    reads: list[tuple[str, int, int]] = []  # (tensor, elements read, elements in the tensor)
    get_slice = SafetensorsCheckpoint.get_slice

    class Recording:
        def __init__(self, tensor, name: str) -> None:
            self.tensor, self.name = tensor, name

        def get_shape(self):
            return self.tensor.get_shape()

        def __getitem__(self, index):
            block = self.tensor[index]
            reads.append((self.name, block.size, int(np.prod(self.tensor.get_shape()))))
            return block

    monkeypatch.setattr(SafetensorsCheckpoint, "get_slice", lambda self, name: Recording(get_slice(self, name), name))
    path = os.path.join(FIXTURES, "qwen3_moe")
    sharded = from_pretrained(path, mesh=make_mesh(2, 2, 2), dtype="float32")
    whole = from_pretrained(path, dtype="float32")  # no mesh: whole tensors, not through get_slice
    experts = [(size, full) for name, size, full in reads if ".experts." in name]
    assert experts and all(size * 4 == full for size, full in experts)
    assert max(size / full for _, size, full in reads) <= 1.0
    for a, b in zip(jax.tree.leaves(nnx.state(sharded, nnx.Param)), jax.tree.leaves(nnx.state(whole, nnx.Param)),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
