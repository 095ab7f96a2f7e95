"""Supervised fine-tuning: ``train_and_evaluate(config, workdir)``.

Credit-assignment SFT (Orchard-SWE) is this trainer fed with examples from
:mod:`orchard.data.examples`: the loss mask already holds which action tokens train. The trainer is
generic: a masked next-token loss over packed rows from :mod:`orchard.data.pipeline`, AdamW with
warmup and cosine decay, clipping, gradient accumulation, parameters and optimizer state sharded
on an ``(fsdp, tp)`` mesh, bf16 compute over fp32 parameters (the model's dtype policy), a jitted
step with donated state, Orbax checkpoints that include the data iterator, eval loss, and metrics
in ``metrics.jsonl`` and TensorBoard.

A run killed and restarted on the same ``workdir`` resumes from its last checkpoint and continues
with the same batches and the same loss curve as an uninterrupted run.

The config (see ``configs/swe_sft.py``)::

    model.path | model.init       an HF directory or .gguf, or ModelConfig fields for a fresh model
    model.dtype, model.param_dtype
    data.train, data.eval         example files (JSONL or ArrayRecord); data.eval may be empty
    data.seq_len, data.batch_size rows per micro-batch; data.grad_accum micro-batches per step
    optim.peak_lr, final_lr, warmup_steps, weight_decay, clip_norm
    mesh.fsdp, mesh.tp
    num_steps, log_every, eval_every, checkpoint_every, seed
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict
from tqdm import tqdm

from orchard.data.pipeline import make_dataset
from orchard.models import ModelConfig, Transformer, from_pretrained, save_pretrained
from orchard.models.sharding import make_mesh
from orchard.train.checkpoint import Checkpointer
from orchard.train.metrics import MetricsWriter
from orchard.train.state import batch_sharding, init_state, make_eval_step, make_optimizer, make_train_step

log = logging.getLogger(__name__)


def build_model(config: ConfigDict, seed: int) -> Transformer:
    """The model to fine-tune: loaded from ``model.path`` or freshly initialised from ``model.init``."""
    dtypes = {"dtype": config.dtype, "param_dtype": config.param_dtype}
    if config.get("path"):
        return from_pretrained(config.path, **dtypes)
    return Transformer(ModelConfig(**{**config.init.to_dict(), **dtypes}), rngs=nnx.Rngs(seed))


def evaluate(eval_step, params: Any, config: ConfigDict, mesh) -> float:
    """Mean loss per trained token over one pass of ``data.eval`` (a last partial batch is dropped)."""
    total, tokens = 0.0, 0.0
    sharding = batch_sharding(mesh, accumulated=False)
    for batch in make_dataset(config.data.eval, seq_len=config.data.seq_len, batch_size=config.data.batch_size,
                              seed=0, shuffle=False, num_epochs=1):
        loss, count = eval_step(params, jax.device_put(batch, sharding))
        total, tokens = total + float(loss), tokens + float(count)
    return total / max(tokens, 1.0)


def train_and_evaluate(config: ConfigDict, workdir: str, export_dir: str | None = None) -> dict[str, float]:
    """Train for ``config.num_steps`` steps in ``workdir`` (resuming from its checkpoints); return the
    last logged metrics. With ``export_dir``, the final model is also written there as an HF
    directory (``config.json`` and safetensors) that ``from_pretrained``, ``orchard serve`` and vLLM
    load."""
    os.makedirs(workdir, exist_ok=True)
    mesh = make_mesh(config.mesh.fsdp, config.mesh.tp)
    model = build_model(config.model, config.seed)
    optimizer, schedule = make_optimizer(config.optim.peak_lr, config.optim.final_lr, config.optim.warmup_steps,
                                         config.num_steps, config.optim.weight_decay, config.optim.clip_norm)
    graphdef, state = init_state(model, optimizer, mesh)
    del model
    accum, rows = config.data.grad_accum, config.data.batch_size
    data = make_dataset(config.data.train, seq_len=config.data.seq_len, batch_size=rows * accum, seed=config.seed,
                        shard_index=jax.process_index(), shard_count=jax.process_count())
    checkpointer = Checkpointer(os.path.join(os.path.abspath(workdir), "checkpoints"), config.checkpoint_every)
    if (start := checkpointer.latest_step()) is not None:
        state = checkpointer.restore(start, state, data)
        log.info("resumed from the checkpoint at step %d", start)
    start = int(state.step)
    train_step, eval_step = make_train_step(graphdef, optimizer, schedule), make_eval_step(graphdef)
    sharding = batch_sharding(mesh)
    last: dict[str, float] = {}
    with MetricsWriter(workdir) as metrics, tqdm(total=config.num_steps, initial=start, desc="sft",
                                                  unit="step", dynamic_ncols=True) as bar:
        started = time.perf_counter()
        for step in range(start + 1, config.num_steps + 1):
            batch = next(data)
            batch = {k: np.reshape(v, (accum, rows, *v.shape[1:])) for k, v in batch.items()}
            state, step_metrics = train_step(state, jax.device_put(batch, sharding))
            if step % config.log_every == 0 or step == config.num_steps:
                last = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
                last["tokens_per_s"] = accum * rows * config.data.seq_len * config.log_every / max(
                    time.perf_counter() - started, 1e-9)
                started = time.perf_counter()
                if config.data.eval and (step % config.eval_every == 0 or step == config.num_steps):
                    last["eval_loss"] = evaluate(eval_step, state.params, config, mesh)
                metrics.write(step, last)
                bar.set_postfix(loss=f"{last['loss']:.4f}", refresh=False)
            checkpointer.save(step, state, data, force=step == config.num_steps)
            bar.update()
    checkpointer.close()
    if export_dir:
        save_pretrained(nnx.merge(graphdef, state.params), export_dir)
    return last
