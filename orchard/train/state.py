"""The sharded, jitted training step shared by the trainers: masked next-token loss, gradient
accumulation over micro-batches, clipping and an Optax update, with the state donated.

State is a pair of pure pytrees (parameters, optimizer state) plus the model's graph definition,
so the step is one ``jax.jit`` and checkpoints are plain arrays. Parameters are placed by their
logical axes (:mod:`orchard.models.sharding`); the optimizer state follows them, and each batch is
split along its batch dimension over the ``fsdp`` axis (data parallel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orchard.models.sharding import param_shardings
from orchard.models.transformer import Transformer
from orchard.models.vision import Grid
from orchard.train.images import batch_logits


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup and cosine decay from ``peak_lr`` to ``final_lr``, after clipping."""

    peak_lr: float = 1e-3
    final_lr: float = 1e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    # Parameter path prefixes that never move, e.g. ("model.visual",): a VLM's vision tower and the
    # mergers that project into the language model (the paper's frozen "vision encoder and projector").
    frozen: tuple[str, ...] = ()
    # "" (off), or the dtype of a master copy of the trained parameters the optimizer keeps and updates
    # (:func:`with_master_weights`): "float32" for bfloat16 parameters, whose own AdamW steps would
    # round away (a 1e-6 step on a weight near 1 is below bfloat16's resolution of 2**-8).
    master_dtype: str = ""


class TrainState(NamedTuple):
    step: jax.Array
    params: Any
    opt_state: Any


def make_optimizer(config: OptimConfig, total_steps: int, b1: float = 0.9, b2: float = 0.95
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with linear warmup then cosine decay from ``peak_lr`` to ``final_lr`` over
    ``total_steps``, after global-norm clipping. The warmup starts at ``peak_lr / warmup_steps``,
    not 0, so the first update is not wasted (with one warmup step, there is no warmup)."""
    warmup = max(config.warmup_steps, 1)
    schedule = optax.warmup_cosine_decay_schedule(config.peak_lr / warmup, config.peak_lr, warmup,
                                                  max(total_steps, warmup + 1), end_value=config.final_lr)
    optimizer = optax.chain(optax.clip_by_global_norm(config.clip_norm),
                            optax.adamw(schedule, b1=b1, b2=b2, weight_decay=config.weight_decay))
    if config.frozen:  # frozen parameters get no update (nor weight decay, nor optimizer state)
        optimizer = optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()},
                                          lambda params: frozen_labels(params, config.frozen))
    if config.master_dtype:  # nor a master copy
        trained = (lambda params: jax.tree.map(lambda label: label == "trained", frozen_labels(params, config.frozen))
                   ) if config.frozen else None
        optimizer = with_master_weights(optimizer, config.master_dtype, trained)
    return optimizer, schedule


class MasterWeightsState(NamedTuple):
    """:func:`with_master_weights`'s state: ``master`` holds the master copy of each parameter that has
    one (:class:`optax.MaskedNode` for the others), ``inner`` the wrapped optimizer's state."""

    master: Any
    inner: Any


def _no_master(x: Any) -> bool:
    return isinstance(x, optax.MaskedNode)


def with_master_weights(inner: optax.GradientTransformation, dtype: str = "float32",
                        mask: Callable[[Any], Any] | None = None) -> optax.GradientTransformation:
    """``inner`` run on a master copy of the parameters in ``dtype`` (mixed precision: bfloat16
    parameters and compute, float32 optimizer state and updates).

    The state holds the master copy of each parameter stored in another dtype, those ``mask(params)``
    marks (a tree of bools like the parameters; default all): not of frozen parameters (their inner
    update must be zero), nor of those already in ``dtype`` (the parameter is its own master). ``inner``
    sees the gradients cast to ``dtype`` and the master copies as the parameters, so its moments are in
    ``dtype`` too; each update adds its step to the master in ``dtype``. The parameters are then the new
    master rounded to their dtype: :func:`make_train_step` takes them from the state
    (:func:`params_from_master`), exactly. The updates returned for :func:`optax.apply_updates` are that
    rounded master less the parameter, in ``dtype``; their sum is exact (``p + (q - p)``, two bfloat16
    numbers in float32) unless a step changes a weight's magnitude by more than a factor of 2**16.
    """
    dtype = jnp.dtype(dtype)

    def init(params: Any) -> MasterWeightsState:
        chosen = mask(params) if mask is not None else jax.tree.map(lambda _: True, params)
        master = jax.tree.map(lambda p, keep: p.astype(dtype) if keep and p.dtype != dtype else optax.MaskedNode(),
                              params, chosen)
        return MasterWeightsState(master, inner.init(_with_master(master, params)))

    def update(updates: Any, state: MasterWeightsState, params: Any = None) -> tuple[Any, MasterWeightsState]:
        if params is None:
            raise ValueError("with_master_weights needs the parameters")
        grads = jax.tree.map(lambda m, g: g if _no_master(m) else g.astype(dtype), state.master, updates,
                             is_leaf=_no_master)
        steps, inner_state = inner.update(grads, state.inner, _with_master(state.master, params))
        master = jax.tree.map(lambda m, s: m if _no_master(m) else (m + s).astype(dtype), state.master, steps,
                              is_leaf=_no_master)
        updates = jax.tree.map(lambda m, s, p: s if _no_master(m) else m.astype(p.dtype).astype(dtype) - p.astype(dtype),
                               master, steps, params, is_leaf=_no_master)
        return updates, MasterWeightsState(master, inner_state)

    return optax.GradientTransformation(init, update)


def _with_master(master: Any, params: Any) -> Any:
    """``params`` with each parameter that has a master copy replaced by it."""
    return jax.tree.map(lambda m, p: p if _no_master(m) else m, master, params, is_leaf=_no_master)


def master_weights(opt_state: Any) -> MasterWeightsState | None:
    """The :class:`MasterWeightsState` in ``opt_state`` (an optimizer made by :func:`with_master_weights`,
    perhaps inside a chain), or ``None``."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, MasterWeightsState))
             if isinstance(s, MasterWeightsState)]
    if len(found) > 1:
        raise ValueError("more than one master copy of the parameters in the optimizer state")
    return found[0] if found else None


def params_from_master(opt_state: Any, params: Any) -> Any:
    """``params`` with each parameter that has a master copy in ``opt_state`` set to that copy rounded to
    the parameter's dtype (as it is), or ``params`` unchanged when the optimizer keeps no master."""
    state = master_weights(opt_state)
    if state is None:
        return params
    return jax.tree.map(lambda m, p: p if _no_master(m) else m.astype(p.dtype), state.master, params,
                        is_leaf=_no_master)


def frozen_labels(params: Any, prefixes: tuple[str, ...]) -> Any:
    """``"frozen"`` for each parameter whose dotted path starts with one of ``prefixes``, else
    ``"trained"``; a prefix that names no parameter is an error (a typo would freeze nothing)."""
    used: set[str] = set()

    def label(path: tuple, _: Any) -> str:
        name = jax.tree_util.keystr(path, simple=True, separator=".")
        hits = [p for p in prefixes if name == p or name.startswith(p + ".")]
        used.update(hits)
        return "frozen" if hits else "trained"

    labels = jax.tree_util.tree_map_with_path(label, params)
    if unused := sorted(set(prefixes) - used):
        raise ValueError(f"frozen prefixes {unused} match no parameter")
    return labels


def init_state(model: Transformer, optimizer: optax.GradientTransformation, mesh: Mesh) -> tuple[Any, TrainState]:
    """Split ``model`` into its graph definition and a sharded :class:`TrainState`, placed as the
    training step returns it, so that the first and later steps share one compiled program: each
    parameter by its logical axes, each optimizer leaf that mirrors a parameter (AdamW's moments, a
    master copy) as that parameter, scalars (step counts) replicated, every sharding spelt as the
    compiler spells an output's (``P('fsdp', None)`` is ``P('fsdp')``). Placed otherwise (the moments
    replicated, as ``jax.jit(optimizer.init)`` returns them), every run compiled its step twice, and
    the moments sat whole on every device until the first step."""
    graphdef, params = nnx.split(model, nnx.Param)
    shardings = jax.tree.map(_output_spelling, param_shardings(model, mesh))
    params = jax.device_put(params, shardings)
    replicated = NamedSharding(mesh, PartitionSpec())
    by_path = {path: (leaf.shape, sharding) for (path, leaf), sharding in
               zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(shardings), strict=True)}

    def follow(path: tuple, leaf: jax.ShapeDtypeStruct) -> NamedSharding:
        """A parameter's sharding for a leaf whose path ends with that parameter's, of its shape."""
        for start in range(len(path)):
            shape, sharding = by_path.get(path[start:], (None, None))
            if shape == leaf.shape:
                return sharding
        return replicated

    opt_shardings = jax.tree_util.tree_map_with_path(follow, jax.eval_shape(optimizer.init, params))
    opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(params)
    return graphdef, TrainState(jax.device_put(jnp.zeros((), jnp.int32), replicated), params, opt_state)


def _output_spelling(sharding: NamedSharding) -> NamedSharding:
    """``sharding`` without trailing unsharded axes, as a compiled program spells its outputs'."""
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))


def target_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``log softmax(logits)[target]`` as ``target logit - logsumexp``: no ``[B, T, V]`` array of
    log-probabilities is built (about 30% faster training steps on the CPU benchmark)."""
    return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, axis=-1)


def chunked_target_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array, chunk: int) -> jax.Array:
    """:func:`target_logprobs` of the logits ``hidden [B, T, D] @ weight [D, V]`` (float32, as the model
    computes them) for ``targets [B, T]``, without the ``[B, T, V]`` logits: ``chunk`` positions of every
    row at a time (``lax.map`` over sequence chunks, the last one padded, so a batch split over devices
    stays split), each chunk rematerialised (``jax.checkpoint``): the backward pass keeps only its
    hidden states and recomputes its ``[B, chunk, V]`` logits."""
    t = targets.shape[1]
    pad = -t % chunk
    flat = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    flat = jnp.moveaxis(flat.reshape(flat.shape[0], -1, chunk, flat.shape[-1]), 1, 0)  # [chunks, B, chunk, D]
    ids = jnp.moveaxis(jnp.pad(targets, ((0, 0), (0, pad))).reshape(targets.shape[0], -1, chunk), 1, 0)

    @jax.checkpoint
    def one(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        h, ids = args
        return target_logprobs((h @ weight.astype(h.dtype)).astype(jnp.float32), ids)

    logprobs = jax.lax.map(one, (flat, ids))  # [chunks, B, chunk]
    return jnp.moveaxis(logprobs, 0, 1).reshape(targets.shape[0], -1)[:, :t]


def batch_target_logprobs(model: Transformer, batch: dict[str, jax.Array], image_grid: Grid | None = None
                          ) -> jax.Array:
    """``log p(target)`` of each token of a packed batch (:func:`orchard.train.images.batch_logits`'s
    forward pass): through the full logits, or, for rows longer than ``model.cfg.logits_chunk`` tokens,
    by :func:`chunked_target_logprobs` (the same values); a model with a copy head mixes them with its
    pointer's (:meth:`~orchard.models.transformer.Transformer.copy_target_logprobs`)."""
    targets, chunk = batch["targets"], model.cfg.logits_chunk
    if model.copy_head is not None:  # the vocabulary's log-probabilities mixed with the pointer's
        hidden = batch_logits(model, batch, image_grid, head=False)
        vocab = chunked_target_logprobs(hidden, model.output_weight(), targets, chunk or targets.shape[-1])
        return model.copy_target_logprobs(batch["tokens"], hidden, batch["segment_ids"], targets, vocab)
    if not chunk or targets.shape[-1] <= chunk:
        return target_logprobs(batch_logits(model, batch, image_grid), targets)
    hidden = batch_logits(model, batch, image_grid, head=False)
    return chunked_target_logprobs(hidden, model.output_weight(), targets, chunk)


def token_losses(graphdef: Any, params: Any, batch: dict[str, jax.Array], image_grid: Grid | None = None
                 ) -> tuple[jax.Array, jax.Array]:
    """The summed masked next-token loss of a (packed) batch, and the number of trained tokens; with
    ``image_grid``, a batch with images (:func:`orchard.train.images.attach_images`)."""
    nll = -batch_target_logprobs(nnx.merge(graphdef, params), batch, image_grid)
    mask = batch["loss_mask"].astype(jnp.float32)
    return jnp.sum(nll * mask), jnp.sum(mask)


def batch_sharding(mesh: Mesh, accumulated: bool = True) -> NamedSharding:
    """Batches split over ``fsdp``: ``[accumulation, batch, sequence]`` arrays, or ``[batch, sequence]``."""
    return NamedSharding(mesh, PartitionSpec(None, "fsdp", None) if accumulated else PartitionSpec("fsdp", None))


# (summed loss, tokens) or (summed loss, tokens, {name: summed statistic}): see make_train_step
LossFn = Callable[[Any, Any, dict[str, jax.Array]],
                  tuple[jax.Array, jax.Array] | tuple[jax.Array, jax.Array, dict[str, jax.Array]]]


def make_train_step(graphdef: Any, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                    loss_fn: LossFn = token_losses) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """``step(state, batch) -> (state, metrics)``; ``batch`` arrays are ``[accumulation, batch, seq]``.

    ``loss_fn(graphdef, params, micro_batch)`` returns a summed loss and the number of tokens it
    covers (masked next-token loss for SFT, the clipped policy loss for GRPO), and optionally a third
    item, a dict of summed statistics that carry no gradient (the policy loss's diagnostics). The loss
    is the mean over every such token of the whole global batch (all micro-batches), so accumulating
    gradients over micro-batches gives the same update as one big batch; each statistic is likewise
    summed over the micro-batches and divided by the tokens, and reported under its name beside
    ``loss, grad_norm, lr, tokens``. With a master copy of the parameters in
    the optimizer state (:func:`with_master_weights`), the gradients of the parameters that have one are
    accumulated in its dtype, and the new parameters are the new master rounded to their dtype.
    """

    def loss_and_aux(params: Any, micro_batch: dict[str, jax.Array]) -> tuple[jax.Array, tuple]:
        loss, count, *stats = loss_fn(graphdef, params, micro_batch)
        return loss, (count, stats[0] if stats else {})

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict]:
        grad_fn = jax.value_and_grad(loss_and_aux, has_aux=True)

        def micro(carry, micro_batch):
            grads, loss, count, stats = carry
            (micro_loss, (micro_count, micro_stats)), micro_grads = grad_fn(state.params, micro_batch)
            return (jax.tree.map(jnp.add, grads, micro_grads), loss + micro_loss, count + micro_count,
                    jax.tree.map(jnp.add, stats, micro_stats)), None

        master = master_weights(state.opt_state)
        if master is None:
            zeros = jax.tree.map(jnp.zeros_like, state.params)
        else:  # accumulated in the master's dtype
            zeros = jax.tree.map(lambda m, p: jnp.zeros_like(p if _no_master(m) else m), master.master, state.params,
                                 is_leaf=_no_master)
        first = jax.tree.map(lambda x: x[0], batch)
        stats_shape = jax.eval_shape(loss_and_aux, state.params, first)[1][1]
        no_stats = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), stats_shape)
        (grads, loss, count, stats), _ = jax.lax.scan(micro, (zeros, 0.0, 0.0, no_stats), batch)
        count = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = params_from_master(opt_state, optax.apply_updates(state.params, updates))
        metrics = {"loss": loss / count, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step),
                   "tokens": count}
        if clash := set(stats) & set(metrics):
            raise ValueError(f"the loss's statistics {sorted(clash)} clash with the step's own metrics")
        metrics.update({name: total / count for name, total in stats.items()})
        return TrainState(state.step + 1, params, opt_state), metrics

    return jax.jit(step, donate_argnums=0)


def make_eval_step(graphdef: Any, image_grid: Grid | None = None) -> Callable[[Any, dict], tuple[jax.Array, jax.Array]]:
    """``eval(params, batch) -> (summed loss, trained tokens)`` for ``[batch, seq]`` arrays (with images
    of ``image_grid``, for a vision-language model)."""
    return jax.jit(lambda params, batch: token_losses(graphdef, params, batch, image_grid))
