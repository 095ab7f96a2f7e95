"""Loading Hugging Face checkpoints (safetensors, single or sharded) into the NNX model.

The model is first built abstractly (:func:`~orchard.models.params.model_shapes`: shapes and dtypes, no memory), then each
parameter is read from its tensor(s), transposed where HF stores ``[out, in]``, stacked for
experts, cast to the parameter dtype and put in place. A checkpoint whose tensors do not match the
config is a clear error naming the tensor.

A checkpoint is anything with ``get(hf_tensor_name) -> np.ndarray``
(:class:`orchard.models.checkpoint.Checkpoint`): safetensors directories or llama.cpp GGUF files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from orchard.distributed import host_array, is_controller
from orchard.models.checkpoint import Checkpoint, CheckpointError, SafetensorsCheckpoint
from orchard.models.config import ModelConfig
from orchard.models.gguf import GGUFCheckpoint
from orchard.models.params import model_shapes
from orchard.models.sharding import named_sharding
from orchard.models.transformer import Transformer
from orchard.models.vlm import VLM_TYPES, VisionLanguageModel, VLMConfig


def _hf_names(path: tuple, cfg: ModelConfig) -> tuple[str, list[str], bool]:
    """The leaf (``kernel``, ``weight``, ``bias``) of one NNX parameter path, the HF tensors behind it, and
    whether they are stacked experts (one ``[out, in]`` tensor an expert, ``[E, in, out]`` in NNX)."""
    *modules, leaf = (str(p) for p in path)
    if modules[-1] == "experts":
        return leaf, [f"{'.'.join(modules)}.{e}.{leaf}.weight" for e in range(cfg.num_experts)], True
    return leaf, [".".join(modules) + (".weight" if leaf in ("kernel", "weight") else ".bias")], False


def _hf_tensor(checkpoint: Checkpoint, path: tuple, cfg: ModelConfig) -> np.ndarray:
    """The HF tensor(s) behind one NNX parameter path, in the NNX layout."""
    leaf, names, experts = _hf_names(path, cfg)
    if experts:
        return np.stack([checkpoint.get(name).T for name in names])
    tensor = checkpoint.get(names[0])
    return tensor.T if leaf == "kernel" else tensor


def _hf_block_reader(checkpoint: Checkpoint, path: tuple, cfg: ModelConfig
                     ) -> tuple[tuple[int, ...], Callable[[tuple[slice, ...]], np.ndarray]] | None:
    """The shape of one NNX parameter in the checkpoint and a reader of any block of it (NNX layout) that
    reads only that block, for a checkpoint that reads slices (safetensors: ``get_slice``); None otherwise."""
    tensor_slice = getattr(checkpoint, "get_slice", None)
    if tensor_slice is None:
        return None
    leaf, names, experts = _hf_names(path, cfg)
    if experts:  # [E, in, out] from per-expert [out, in] tensors
        out, inner = tensor_slice(names[0]).get_shape()
        return ((len(names), inner, out),
                lambda index: np.stack([tensor_slice(name)[index[2], index[1]].T for name in names[index[0]]]))
    name = names[0]
    shape = tuple(tensor_slice(name).get_shape())
    if leaf == "kernel":  # [in, out] from HF's [out, in]
        return shape[::-1], lambda index: tensor_slice(name)[index[::-1]].T
    return shape, lambda index: tensor_slice(name)[index]


def load_params(model: Transformer, checkpoint: Checkpoint, mesh: Mesh | None = None) -> None:
    """Fill every parameter of ``model`` (abstract or concrete) from the checkpoint.

    With a ``mesh``, each parameter goes straight to its shards on the devices, so no device ever holds a
    whole parameter it does not own (let alone the whole model); in a learner over several processes, each
    process places only the shards of its own devices. From safetensors, each shard's block is all that is
    read of the file; a GGUF file's tensors are read whole (its quantised blocks do not slice), one at a time.
    """
    cfg = model.cfg
    dtype = jnp.dtype(cfg.param_dtype)
    state = nnx.state(model, nnx.Param)
    for path, variable in nnx.to_flat_state(state):
        expected = tuple(variable.get_value().shape)
        blocks = _hf_block_reader(checkpoint, path, cfg) if mesh is not None else None
        tensor = _hf_tensor(checkpoint, path, cfg) if blocks is None else None
        shape = blocks[0] if blocks is not None else tensor.shape
        if shape != expected:
            raise CheckpointError(f"{'.'.join(map(str, path))}: checkpoint shape {shape}, model {expected}")
        if mesh is None:
            variable.set_value(jax.device_put(tensor.astype(dtype)))
            continue
        read = blocks[1] if blocks is not None else tensor.__getitem__
        variable.set_value(jax.make_array_from_callback(
            expected, named_sharding(variable.logical_axes, expected, mesh),
            lambda index, read=read: np.asarray(read(index)).astype(dtype)))
    nnx.update(model, state)


def from_pretrained(path: str, mesh: Mesh | None = None, **overrides) -> Transformer:
    """Load an HF directory (``config.json`` + safetensors) or a llama.cpp ``.gguf`` file; a
    vision-language directory (Qwen3-VL) gives a :class:`~orchard.models.vlm.VisionLanguageModel`.

    ``mesh`` shards the parameters by their logical axes (see :mod:`orchard.models.sharding`);
    ``overrides`` replace config fields, e.g. ``dtype="float32"`` for exact parity checks.
    """
    if path.endswith(".gguf"):
        checkpoint: Checkpoint = GGUFCheckpoint(path)
        cfg = ModelConfig.from_hf(checkpoint.config, **overrides)
        model = model_shapes(lambda rngs: Transformer(cfg, rngs=rngs))
    else:
        config_path = os.path.join(path, "config.json")
        if not os.path.exists(config_path):
            raise CheckpointError(f"{path} has no config.json: not a Hugging Face model directory")
        checkpoint = SafetensorsCheckpoint(path)
        with open(config_path) as handle:
            hf = json.load(handle)
        if hf.get("model_type") in VLM_TYPES:
            vlm_cfg = VLMConfig.from_pretrained(path, **overrides)
            model = model_shapes(lambda rngs: VisionLanguageModel(vlm_cfg, rngs=rngs))
        else:
            cfg = ModelConfig.from_hf(hf, **overrides)
            model = model_shapes(lambda rngs: Transformer(cfg, rngs=rngs))
    load_params(model, checkpoint, mesh)
    return model


def _hf_tensors(path: tuple, value: Any, cfg: ModelConfig) -> Iterator[tuple[str, Any]]:
    """The HF tensors of one NNX parameter: the inverse of :func:`_hf_tensor`. ``value`` is a host array
    (the tensors are contiguous host arrays) or a JAX array (they stay JAX arrays, on its devices)."""
    leaf, names, experts = _hf_names(path, cfg)
    contiguous = np.ascontiguousarray if isinstance(value, np.ndarray) else (lambda x: x)
    if experts:
        for e, name in enumerate(names):
            yield name, contiguous(value[e].T)
        return
    yield names[0], contiguous(value.T if leaf == "kernel" else value)


def _as_model(model: Any) -> Transformer:
    return nnx.merge(model.graphdef, model.params) if isinstance(model, ModelWeights) else model


def hf_tensors(model: Transformer | ModelWeights, dtype: str | None = None) -> Iterator[tuple[str, jax.Array]]:
    """Every HF tensor of ``model`` (or of a trainer's :class:`ModelWeights`) as a JAX array on the
    parameters' devices, cast to ``dtype`` (``None``: the parameters' own), in :func:`save_pretrained`'s
    names, layout and order (the one mapping, :func:`_hf_tensors`): what a transfer to a server sends
    without a round trip through host memory. Each tensor is computed when the generator reaches it."""
    model = _as_model(model)
    cast = None if dtype is None else jnp.dtype(dtype)
    for param_path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = variable.get_value()
        yield from _hf_tensors(param_path, value if cast is None else value.astype(cast), model.cfg)


def hf_tensor_specs(model: Transformer | ModelWeights, dtype: str | None = None
                    ) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype name)`` of every tensor :func:`hf_tensors` yields, in its order, computed
    abstractly (``jax.eval_shape``: nothing is transposed, cast or copied)."""
    names: list[str] = []

    def tensors() -> list[jax.Array]:
        names.clear()
        pairs = list(hf_tensors(model, dtype))
        names.extend(name for name, _ in pairs)
        return [tensor for _, tensor in pairs]

    shapes = jax.eval_shape(tensors)
    return [(name, tuple(s.shape), jnp.dtype(s.dtype).name) for name, s in zip(names, shapes, strict=True)]


def save_pretrained(model: Transformer, path: str | None, max_shard_bytes: int = 5 << 30,
                    dtype: str | None = None) -> None:
    """Write ``config.json`` and safetensors (sharded with an index past ``max_shard_bytes``).

    The layout is the one transformers and vLLM read, so a trained checkpoint can be served.
    ``dtype`` (``"bfloat16"``, ``"float16"``, ...) casts every tensor and the config's
    ``torch_dtype``: a server loads the checkpoint in the dtype it serves, not the trainer's fp32.
    Each parameter is gathered to host memory one at a time and each shard is written once it is
    full, so the host holds at most one shard.

    In a learner over several processes (:mod:`orchard.distributed`) this is a collective: every process
    calls it, each parameter is gathered from the processes that hold its pieces, and the controller alone
    writes. ``path`` None takes part in the gathers and writes nothing (what a process that is not the
    controller passes when the controller's path is not its own to know).
    """
    from safetensors.numpy import save_file

    writer = path is not None and is_controller()
    if writer:
        _write_config(model, path, dtype)
    cast = None if dtype is None else jnp.dtype(dtype)
    written: list[tuple[str, list[str]]] = []  # (file written, its tensors): named once their count is known
    shard: dict[str, np.ndarray] = {}
    size = total = 0

    def flush() -> None:
        filename = f".shard-{len(written) + 1:05d}.safetensors"
        if writer:
            save_file(shard, os.path.join(path, filename), metadata={"format": "pt"})
        written.append((filename, list(shard)))

    for param_path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = host_array(variable.get_value())
        for name, tensor in _hf_tensors(param_path, value if cast is None else value.astype(cast), model.cfg):
            if size + tensor.nbytes > max_shard_bytes and shard:
                flush()
                shard, size = {}, 0
            shard[name] = tensor
            size += tensor.nbytes
            total += tensor.nbytes
    flush()
    if not writer:
        return
    if len(written) == 1:
        os.replace(os.path.join(path, written[0][0]), os.path.join(path, "model.safetensors"))
        return
    weight_map = {}
    for i, (temporary, names) in enumerate(written, start=1):
        filename = f"model-{i:05d}-of-{len(written):05d}.safetensors"
        os.replace(os.path.join(path, temporary), os.path.join(path, filename))
        weight_map.update(dict.fromkeys(names, filename))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=2)


def _write_config(model: Transformer, path: str, dtype: str | None) -> None:
    """``config.json`` (and a vision-language model's image processor's settings) into ``path``."""
    os.makedirs(path, exist_ok=True)
    hf = model.hf_config()
    if dtype is not None:
        hf["torch_dtype"] = dtype
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump(hf, handle, indent=2)
    if isinstance(model, VisionLanguageModel):  # its image processor's settings go with it
        with open(os.path.join(path, "preprocessor_config.json"), "w") as handle:
            json.dump(model.config.processing.to_hf(model.config.vision), handle, indent=2)


@dataclass
class ModelWeights:
    """A model's parameters as a trainer hands them to a rollout engine (:class:`orchard.rollout.types.Weights`).

    ``params`` is the ``nnx.Param`` state a trainer updates (``nnx.split(model, nnx.Param)``), kept
    beside the graph definition that turns it back into a model for :func:`save_pretrained`.
    """

    graphdef: Any
    params: Any
    version: int = 0

    @classmethod
    def of(cls, model: Transformer, version: int = 0) -> ModelWeights:
        graphdef, params = nnx.split(model, nnx.Param)
        return cls(graphdef, params, version)

    def save_pretrained(self, directory: str | None, dtype: str | None = None) -> None:
        """:func:`save_pretrained` of these parameters (a collective over a learner's processes)."""
        save_pretrained(nnx.merge(self.graphdef, self.params), directory, dtype=dtype)
