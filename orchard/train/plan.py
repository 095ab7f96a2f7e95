"""The memory plan of a training stage on a mesh it names, without the mesh: shapes, shardings and bytes
per device, for ``--dry-run`` on a workstation (:mod:`orchard.recipes.cli`).

What is *computed* (exact, from ``jax.eval_shape``; no array is allocated and no device is needed):

* the model's parameters: ``nnx.eval_shape`` of the model :func:`~orchard.models.build.build_model` would
  build (from an HF directory's ``config.json`` or ``.gguf`` when the path is there, else from
  ``model.init``, which a large variant sets to the architecture its path holds);
* each parameter's ``PartitionSpec`` by :func:`orchard.models.sharding.partition_spec` over a
  ``jax.sharding.AbstractMesh`` of the named axis sizes, and so its bytes on one device; the
  parameters a mesh axis cannot divide, which stay replicated over it;
* the optimizer state: ``jax.eval_shape(optimizer.init, params)`` of the stage's
  :func:`~orchard.train.state.make_optimizer` (AdamW: two moments per trained parameter, none for frozen
  ones); the moments take their parameter's sharding, as :func:`~orchard.train.state.init_state` places
  them, the scalars are replicated.

What is *estimated* (a formula, not a compiled program; expect it within a factor of about two, and
XLA's own workspace is not counted):

* gradients: two parameter-sized buffers in the parameters' dtype and sharding (the accumulator the
  step's scan over micro-batches carries and one micro-batch's gradients);
* activations of one micro-batch's forward and backward pass, :func:`activation_bytes`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, PartitionSpec

from orchard.models.build import ModelSpec, build_model
from orchard.models.config import ModelConfig
from orchard.models.gguf import GGUFCheckpoint
from orchard.models.sharding import MESH_AXES, RULES, MeshConfig, partition_spec
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.models.vlm import VLM_TYPES, VisionLanguageModel, VLMConfig
from orchard.train.state import OptimConfig, make_optimizer

GIB = 1 << 30

# Memory of one device (bytes) by the name a mesh config gives it (``mesh.device``).
DEVICE_MEMORY: dict[str, int] = {
    "tpu-v5e": 16 * GIB,
    "tpu-v5p": 95 * GIB,
    "tpu-v4": 32 * GIB,
    "tpu-v6e": 32 * GIB,
    "a100-80gb": 80 * GIB,
    "h100": 80 * GIB,
    "h200": 141 * GIB,
}

# Placeholder special-token ids for an abstract vision-language model (they do not change any shape).
_VISION_TOKENS = (1, 2, 3)


@dataclass(frozen=True)
class Replicated:
    """A parameter that a mesh axis cannot divide: it stays whole along that axis on every device."""

    name: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]  # the logical axes left replicated, e.g. ("kv_heads",)
    device_bytes: int


@dataclass(frozen=True)
class MemoryPlan:
    """One stage's bytes per device on its mesh (see the module docstring for computed vs. estimated)."""

    stage: str
    mesh: MeshConfig
    rows: int  # rows of a micro-batch (split over fsdp)
    seq_len: int
    parameters: int  # the model's parameter count (computed)
    param_bytes: int  # per device, computed
    optimizer_bytes: int  # per device, computed
    gradient_bytes: int  # per device, estimated
    activation_bytes: int  # per device, estimated
    device_memory: int | None  # bytes of one device, or None when the mesh names no known device
    replicated: tuple[Replicated, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.optimizer_bytes + self.gradient_bytes + self.activation_bytes

    @property
    def devices(self) -> int:
        return self.mesh.fsdp * self.mesh.tp * self.mesh.ep

    def table(self) -> str:
        """The plan as lines of text: the mesh, each part's GiB per device, the total against the device."""
        m = self.mesh
        gib = lambda n: f"{n / GIB:9.2f} GiB"  # noqa: E731
        device = (f"{m.device} ({self.device_memory / GIB:.0f} GiB)" if self.device_memory
                  else (m.device or "unnamed device") + " (memory unknown: not checked)")
        lines = [f"[{self.stage}] mesh fsdp {m.fsdp} x tp {m.tp} x ep {m.ep} = {self.devices} devices of {device}; "
                 f"{self.parameters / 1e9:.3f}B parameters; micro-batch {self.rows} rows x {self.seq_len} tokens "
                 f"({max(self.rows // max(m.fsdp, 1), 0)} a device)",
                 f"  parameters      {gib(self.param_bytes)}   (computed)",
                 f"  optimizer state {gib(self.optimizer_bytes)}   (computed)",
                 f"  gradients       {gib(self.gradient_bytes)}   (estimated: accumulator + one micro-batch's)",
                 f"  activations     {gib(self.activation_bytes)}   (estimated)",
                 f"  total / device  {gib(self.total_bytes)}"
                 + (f"   of {self.device_memory / GIB:.0f} GiB: {'fits' if self.fits else 'DOES NOT FIT'}"
                    if self.device_memory else "")]
        if self.replicated:
            worst = sorted(self.replicated, key=lambda r: -r.device_bytes)
            lines.append(f"  replicated (a mesh axis does not divide them): {len(worst)} parameters, "
                         f"{sum(r.device_bytes for r in worst) / GIB:.2f} GiB a device; largest:")
            lines += [f"    {r.name} {list(r.shape)} over {', '.join(r.axes)}: {r.device_bytes / GIB:.3f} GiB"
                      for r in worst[:5]]
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  problem: {problem}" for problem in self.problems]
        return "\n".join(lines)

    @property
    def fits(self) -> bool:
        return self.device_memory is None or self.total_bytes <= self.device_memory


def abstract_mesh(mesh: MeshConfig) -> AbstractMesh:
    """The mesh's axis names and sizes, with no devices behind them."""
    return AbstractMesh((mesh.fsdp, mesh.tp, mesh.ep), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def architecture(spec: ModelSpec, vocab_size: int | None = None) -> tuple[ModelSpec, str]:
    """The spec to plan from (a fresh model of the same shape) and where its shape came from: the
    checkpoint's ``config.json`` (or ``.gguf``) when ``spec.path`` is there, else ``spec.init``."""
    if not spec.path:
        return spec, "model.init"
    path = resolve(spec.path)
    if path.endswith(".gguf") and os.path.exists(path):
        cfg = ModelConfig.from_hf(GGUFCheckpoint(path).config)
        return replace(spec, path="", init=_fields(cfg)), path
    config_json = os.path.join(path, "config.json")
    if os.path.exists(config_json):
        with open(config_json) as handle:
            hf = json.load(handle)
        if hf.get("model_type") in VLM_TYPES:
            vlm = VLMConfig.from_hf(hf)
            init = {"text": _fields(vlm.text), "vision": _fields(vlm.vision, skip=("dtype", "param_dtype"))}
            return replace(spec, path="", init=init), config_json
        return replace(spec, path="", init=_fields(ModelConfig.from_hf(hf))), config_json
    text = spec.init.get("text", spec.init)
    if not (text.get("vocab_size") or vocab_size):
        raise ValueError(f"model.path {spec.path!r} is not there yet and model.init does not name its "
                         "architecture (no vocab_size): set model.init to the shape the path will hold")
    return replace(spec, path=""), f"model.init (model.path {spec.path!r} is not there yet)"


def _fields(cfg: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in skip
            and f.name not in ("dtype", "param_dtype", "attention_block", "remat", "logits_chunk")}


def abstract_model(spec: ModelSpec, vocab_size: int | None = None) -> Transformer:
    """The model ``spec`` names as shapes only (nothing allocated); a checkpoint's
    shape is read from its config when there, else taken from ``spec.init`` (:func:`architecture`)."""
    fresh, _ = architecture(spec, vocab_size)
    return build_model(fresh, 0, vocab_size, vision_tokens=_VISION_TOKENS, shapes_only=True)


def _device_bytes(shape: tuple[int, ...], dtype: Any, spec: PartitionSpec, mesh: AbstractMesh) -> int:
    per = list(shape)
    for i, axis in enumerate(spec):
        for name in (axis,) if isinstance(axis, str) else (axis or ()):
            per[i] = math.ceil(per[i] / mesh.shape[name])
    return math.prod(per) * jnp.dtype(dtype).itemsize


def param_specs(model: nnx.Module, mesh: AbstractMesh) -> tuple[Any, dict[str, PartitionSpec], list[Replicated]]:
    """The abstract parameters (an ``nnx.State`` of shapes), each one's ``PartitionSpec`` by dotted name,
    and the parameters some mesh axis (of size > 1) cannot divide."""
    state = nnx.state(model, nnx.Param)
    specs: dict[str, PartitionSpec] = {}
    replicated: list[Replicated] = []
    for path, variable in nnx.to_flat_state(state):
        name = ".".join(str(p) for p in path)
        value = variable.get_value()
        shape, axes = tuple(value.shape), tuple(variable.logical_axes)
        spec = partition_spec(axes, shape, mesh)
        specs[name] = spec
        left = tuple(a for a, s, got in zip(axes, shape, spec, strict=True)
                     if a and RULES.get(a) and mesh.shape[RULES[a]] > 1 and got is None)
        if left:
            replicated.append(Replicated(name, shape, left, _device_bytes(shape, value.dtype, spec, mesh)))
    return state, specs, replicated


def activation_bytes(cfg: ModelConfig, rows: int, seq_len: int, tp: int = 1) -> int:
    """An estimate of one device's activation memory for a micro-batch of ``rows`` rows (on that device)
    of ``seq_len`` tokens, forward and backward, with ``a`` the bytes of ``cfg.dtype``:

    * a decoder layer keeps, per token: ``4 D`` (its input, two norms, the residual) + ``(2 H + 2 KV)
      hd / tp`` (queries, keys, values, attention output; heads split over tp) + ``3 F / tp`` (gate, up,
      their product) for a dense MLP, or for an MoE layer ``k (2 D + 3 F_moe / tp)`` (each token's k
      routed rows in and out; the routed rows are sized for every token on every ``ep`` shard, which
      replicates tokens) + ``4 E / a`` (float32 router probabilities), all times ``a``; dense attention
      (``seq_len <= attention_block`` or ``attention_block`` 0) adds ``2 x 4 H / tp x seq_len`` bytes
      (float32 scores and probabilities), blockwise attention ``4 H / tp`` (the log-sum-exp);
    * ``remat`` ``"none"`` keeps every layer's; ``"layer"`` keeps each layer's input (``D a`` a token)
      and one layer's whole set while it is recomputed;
    * the LM head's float32 logits and their gradient, ``2 x 4 V / tp`` a position, for ``logits_chunk``
      positions of a row at a time when the rows are longer (else every position).
    """
    a = jnp.dtype(cfg.dtype).itemsize
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    split = lambda n: n // tp if n % tp == 0 else n  # noqa: E731  (what does not divide stays whole)
    attention = (2 * split(h) + 2 * split(kv)) * hd * a
    dense_attention = not cfg.attention_block or seq_len <= cfg.attention_block
    attention += 2 * 4 * split(h) * seq_len if dense_attention else 4 * split(h)

    def layer(index: int) -> int:
        if cfg.is_moe_layer(index):
            mlp = cfg.num_experts_per_tok * (2 * d + 3 * split(cfg.moe_intermediate_size)) * a + 4 * cfg.num_experts
        else:
            mlp = 3 * split(cfg.intermediate_size) * a
        return 4 * d * a + attention + mlp

    per_token = [layer(i) for i in range(cfg.num_layers)]
    kept = (cfg.num_layers * d * a + max(per_token)) if cfg.remat == "layer" else sum(per_token)
    tokens = rows * seq_len
    head_positions = min(seq_len, cfg.logits_chunk) if cfg.logits_chunk else seq_len
    head = rows * head_positions * 2 * 4 * split(cfg.vocab_size)
    return tokens * kept + head


def plan_stage(stage: str, spec: ModelSpec, mesh: MeshConfig, optim: OptimConfig, rows: int, seq_len: int,
               vocab_size: int | None = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of a stage that trains ``spec``'s model on ``mesh`` with ``optim``, in
    micro-batches of ``rows`` rows (split over ``fsdp``) of ``seq_len`` tokens; ``vocab_size`` is a fresh
    model's vocabulary when ``spec.init`` leaves it at 0. Its problems: a batch or an ``ep`` that does not
    divide, a known device the total does not fit."""
    _, source = architecture(spec, vocab_size)
    model = abstract_model(spec, vocab_size)
    amesh = abstract_mesh(mesh)
    state, specs, replicated = param_specs(model, amesh)
    params = nnx.to_flat_state(state)
    param_count, param_bytes = 0, 0
    leaves: dict[str, tuple[int, ...]] = {}
    for path, variable in params:
        name = ".".join(str(p) for p in path)
        value = variable.get_value()
        param_count += math.prod(value.shape)
        param_bytes += _device_bytes(tuple(value.shape), value.dtype, specs[name], amesh)
        leaves[name] = tuple(value.shape)
    optimizer, _ = make_optimizer(optim, 1)
    opt_state = jax.eval_shape(optimizer.init, nnx.to_pure_dict(state))
    optimizer_bytes = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        name = next((".".join(keys[i:]) for i in range(len(keys)) if ".".join(keys[i:]) in specs), None)
        sharding = specs[name] if name is not None and leaves[name] == tuple(leaf.shape) else PartitionSpec()
        optimizer_bytes += _device_bytes(tuple(leaf.shape), leaf.dtype, sharding, amesh)
    text = model.cfg  # the language model's config (a vision-language model's too)

    problems, notes = [], [f"shape from {source}"]
    if rows % mesh.fsdp:
        problems.append(f"{stage}: a micro-batch's {rows} rows do not divide over fsdp {mesh.fsdp}")
    if mesh.ep > 1 and not text.num_experts:
        problems.append(f"{stage}: mesh.ep is {mesh.ep} but the model has no experts (ep would only replicate)")
    elif mesh.ep > 1 and text.num_experts % mesh.ep:
        problems.append(f"{stage}: mesh.ep {mesh.ep} does not divide the model's {text.num_experts} experts")
    if mesh.device and mesh.device not in DEVICE_MEMORY:
        problems.append(f"{stage}: mesh.device {mesh.device!r} is not one of {', '.join(DEVICE_MEMORY)}")
    if isinstance(model, VisionLanguageModel):
        notes.append("the vision tower's activations are not counted (the language model's are)")
    rows_here = max(rows // mesh.fsdp, 1)
    plan = MemoryPlan(stage=stage, mesh=mesh, rows=rows, seq_len=seq_len, parameters=param_count,
                      param_bytes=param_bytes, optimizer_bytes=optimizer_bytes, gradient_bytes=2 * param_bytes,
                      activation_bytes=activation_bytes(text, rows_here, seq_len, mesh.tp),
                      device_memory=DEVICE_MEMORY.get(mesh.device), replicated=tuple(replicated),
                      problems=tuple(problems), notes=tuple(notes))
    if not plan.fits:
        plan = replace(plan, problems=(*plan.problems, f"{stage}: {plan.total_bytes / GIB:.1f} GiB a device does not "
                                       f"fit a {mesh.device}'s {plan.device_memory / GIB:.0f} GiB"))
    return plan


