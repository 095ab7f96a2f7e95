"""Logical axes to mesh axes: one model definition, unsharded on a laptop or sharded on a pod.

Every parameter names its dimensions with logical axes (``vocab``, ``embed``, ``heads``,
``kv_heads``, ``mlp``, ``experts``). :data:`RULES` maps them onto the mesh axes ``fsdp`` (parameters
split across data-parallel replicas), ``tp`` (tensor parallel) and ``ep`` (expert parallel). A
dimension that does not divide evenly by its mesh axis stays replicated rather than failing, so
small models and odd head counts (SmolLM2 has 3 KV heads) still load on any mesh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("fsdp", "tp", "ep")
RULES: dict[str, str | None] = {
    "vocab": "tp",
    "embed": "fsdp",
    "heads": "tp",
    "kv_heads": "tp",
    "mlp": "tp",
    "experts": "ep",
}


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh of a stage: data parallel (``fsdp``, parameters sharded too) x tensor parallel x
    expert parallel (``ep``: a mixture of experts' experts split over it, the tokens replicated), and the
    accelerator it runs on (``device``, a key of ``orchard.train.plan.DEVICE_MEMORY``: what ``--dry-run``
    checks the memory per device against; empty: not checked)."""

    fsdp: int = 1
    tp: int = 1
    ep: int = 1
    device: str = ""

    def make(self) -> Mesh:
        return make_mesh(self.fsdp, self.tp, self.ep)


def make_mesh(fsdp: int = 1, tp: int = 1, ep: int = 1, devices: list | None = None) -> Mesh:
    """A mesh over ``fsdp * tp * ep`` devices (the first ones, unless ``devices`` is given), laid out by
    ``jax.make_mesh``: on TPU slices and GPU hosts it orders the devices along the physical topology, so
    the groups of the inner axes (``tp``, ``ep``), which talk the most, are neighbours; on the CPU the
    order is the devices' own. Its axes are ``Auto`` (the compiler propagates the parameters' shardings,
    as :func:`shard_model` places them), not ``jax.make_mesh``'s default ``Explicit``."""
    devices = list(devices if devices is not None else jax.devices())
    needed = fsdp * tp * ep
    if needed > len(devices):
        raise ValueError(f"mesh fsdp={fsdp} x tp={tp} x ep={ep} needs {needed} devices, {len(devices)} available")
    return jax.make_mesh((fsdp, tp, ep), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices[:needed])


def partition_spec(logical_axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """The mesh placement of one parameter; axes that do not divide evenly are replicated."""
    spec = []
    for axis, size in zip(logical_axes, shape, strict=True):
        mesh_axis = RULES.get(axis) if axis else None
        if mesh_axis is not None and (mesh.shape[mesh_axis] == 1 or size % mesh.shape[mesh_axis]):
            mesh_axis = None
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


def named_sharding(logical_axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(logical_axes, shape, mesh))


def shard_bytes(array: jax.Array) -> int:
    """Bytes of the largest shard one device holds (to check that nothing sits whole on a device)."""
    return max(math.prod(shard.data.shape) * shard.data.dtype.itemsize for shard in array.addressable_shards)


def param_shardings(model: nnx.Module, mesh: Mesh) -> Any:
    """The ``NamedSharding`` of every parameter of ``model``, from its logical axes."""
    state = nnx.state(model, nnx.Param)
    return jax.tree.map(lambda v: named_sharding(v.logical_axes, tuple(v.get_value().shape), mesh), state,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Place ``model``'s parameters on ``mesh`` by their logical axes (in place); returns the model."""
    nnx.update(model, jax.device_put(nnx.state(model, nnx.Param), param_shardings(model, mesh)))
    return model
