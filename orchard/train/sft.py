"""Supervised fine-tuning: ``train_and_evaluate(config, workdir, examples=...)``.

Credit-assignment SFT (Orchard-SWE) is this trainer fed with examples from
:mod:`orchard.data.examples`: the loss mask already holds which action tokens train. The trainer is
generic: a masked next-token loss over packed rows from :mod:`orchard.data.pipeline`, AdamW with
warmup and cosine decay, clipping, gradient accumulation, parameters and optimizer state sharded
on an ``(fsdp, tp)`` mesh, bf16 compute over fp32 parameters (the model's dtype policy), a jitted
step with donated state, Orbax checkpoints that include the data iterator, eval loss, and metrics
in ``metrics.jsonl`` and TensorBoard.

Over several processes (:mod:`orchard.distributed`: a multi-host learner), the controller's call leads the
others into the same training (they wait in :func:`orchard.train.follow.follow_controller`); every process
reads the same global batches and places its own rows, so the run trains on exactly the batches, and
ends with exactly the parameters, of a run on one process.

The workdir is a :class:`~orchard.workdir.Stage`: a run killed and restarted with the same config
and examples resumes from its last checkpoint and continues with the same batches and the same
loss curve as an uninterrupted run; a finished one returns its final metrics; one made by another
config or other examples is an error unless ``rerun``. The final model goes to ``workdir/model``.

:class:`SFTConfig` holds the settings (see ``configs/swe_sft.py``); the example files and the
vocabulary size of a fresh model are the caller's inputs.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from orchard.data.pipeline import make_dataset, truncation
from orchard.data.vision_rows import IMAGE_FEATURES, ImageTable
from orchard.distributed import global_batch, is_controller, is_multiprocess, lead
from orchard.models.build import ModelSpec, build_model
from orchard.models.sharding import MeshConfig
from orchard.models.transformer import Transformer
from orchard.models.weights import ModelWeights
from orchard.seeds import derive_seed
from orchard.train.checkpoint import Checkpointer
from orchard.train.images import attach_images
from orchard.train.metrics import MetricsWriter
from orchard.train.state import (
    OptimConfig,
    batch_sharding,
    init_state,
    make_eval_step,
    make_optimizer,
    make_train_step,
    token_losses,
)
from orchard.workdir import Stage, file_fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTConfig:
    seed: int = 0
    num_steps: int = 100
    log_every: int = 10
    eval_every: int = 50
    checkpoint_every: int = 50
    seq_len: int = 1024  # packed rows
    batch_size: int = 4  # rows per micro-batch
    grad_accum: int = 1  # micro-batches per step
    images_per_row: int = 2  # room for images in each packed row (a vision-language model's examples)
    model: ModelSpec = field(default_factory=ModelSpec)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)


def eval_loss(eval_step: Any, params: Any, config: SFTConfig, path: str, mesh: Any,
              images: ImageTable | None = None) -> float:
    """Mean loss per trained token over one pass of the examples in ``path`` (a last partial batch is dropped)."""
    total, tokens = 0.0, 0.0
    sharding = batch_sharding(mesh, accumulated=False)
    for batch in make_dataset(path, seq_len=config.seq_len, batch_size=config.batch_size, seed=0, shuffle=False,
                              num_epochs=1, inputs=IMAGE_FEATURES if images is not None else ()):
        loss, count = eval_step(params, global_batch(with_images(batch, images, config), sharding))
        total, tokens = total + float(loss), tokens + float(count)
    return total / max(tokens, 1.0)


def with_images(batch: dict[str, np.ndarray], images: ImageTable | None, config: SFTConfig) -> dict[str, np.ndarray]:
    """A packed batch with its images attached (:func:`orchard.train.images.attach_images`), or as it is."""
    if images is None:
        return batch
    grid = images.grid_of_all()
    return attach_images(batch, images.patches, grid, images.cfg.vision.tokens_for(grid), config.images_per_row)


def train_and_evaluate(config: SFTConfig, workdir: str, *, examples: str, eval_examples: str = "",
                       vocab_size: int | None = None, inputs: dict[str, str] | None = None,
                       rerun: bool = False, images: ImageTable | None = None,
                       model: Transformer | None = None) -> dict[str, float]:
    """Train for ``config.num_steps`` steps on the examples in the file ``examples`` (``eval_examples``:
    held-out examples for the eval loss; may be empty) in ``workdir``; return the last logged metrics, with how much
    rows of ``seq_len`` cut from the examples (:func:`~orchard.data.pipeline.truncation`, also logged). A fresh model
    (``config.model`` without a path) has ``vocab_size`` tokens. The final model is written to
    ``workdir/model`` (``config.json`` and safetensors) that ``from_pretrained``, ``orchard serve``
    and vLLM load. ``inputs`` name what made the examples (default: their files' fingerprints).

    A vision-language model's examples carry image features (:func:`orchard.data.examples.turn_examples`);
    ``images`` is the table their ids point into, and ``model`` (default: ``config.model`` built) the
    model to start from, for one the config cannot describe alone (a fresh VLM needs its token ids)."""
    inputs = inputs if inputs is not None else {
        "examples": file_fingerprint(examples), **({"eval": file_fingerprint(eval_examples)} if eval_examples else {})}
    if is_multiprocess() and (images is not None or model is not None):
        raise ValueError("SFT over several processes starts from config.model: a model or image table handed "
                         "over in process cannot reach the others")
    lead("sft", config=config, workdir=workdir, examples=examples, eval_examples=eval_examples,
         vocab_size=vocab_size, inputs=inputs, rerun=rerun)
    stage = Stage(workdir, "sft", config, {**inputs, "vocab_size": str(vocab_size)}, shared=True)
    if stage.open(rerun) == "done":
        return stage.summary()
    cut = truncation(examples, config.seq_len)
    if cut.truncated:
        log.warning("%d of %d examples are longer than seq_len + 1 = %d tokens: rows cut their ends, %.1f%% of the "
                    "trained tokens (an agent's last actions); raise seq_len to train them", cut.truncated,
                    cut.scanned, config.seq_len + 1, 100 * cut.cut_share)
    mesh = config.mesh.make()
    model = model if model is not None else build_model(config.model, config.seed, vocab_size, mesh=mesh)
    optimizer, schedule = make_optimizer(config.optim, config.num_steps)
    graphdef, state = init_state(model, optimizer, mesh)
    del model
    accum, rows = config.grad_accum, config.batch_size
    features = IMAGE_FEATURES if images is not None else ()
    # Every process reads the same global batches and places only its own rows (global_batch): a run over
    # several processes trains on exactly the batches of a run on one.
    data = make_dataset(examples, seq_len=config.seq_len, batch_size=rows * accum, seed=derive_seed(config.seed, "sft-batches"),
                        inputs=features)
    checkpointer = Checkpointer(os.path.join(os.path.abspath(workdir), "checkpoints"), config.checkpoint_every)
    if (start := checkpointer.latest_step()) is not None:
        state = checkpointer.restore(start, state, data)
        log.info("resumed from the checkpoint at step %d", start)
    start = int(state.step)
    grid = images.grid_of_all() if images is not None else None
    train_step = make_train_step(graphdef, optimizer, schedule, functools.partial(token_losses, image_grid=grid))
    eval_step = make_eval_step(graphdef, grid)
    sharding = batch_sharding(mesh)
    last: dict[str, float] = {}
    with MetricsWriter(workdir) as metrics, tqdm(total=config.num_steps, initial=start, desc="sft", unit="step",
                                                  dynamic_ncols=True, disable=not is_controller()) as bar:
        started = time.perf_counter()
        for step in range(start + 1, config.num_steps + 1):
            batch = next(data)
            batch = with_images({k: np.reshape(v, (accum, rows, *v.shape[1:])) for k, v in batch.items()}, images,
                                config)
            state, step_metrics = train_step(state, global_batch(batch, sharding))
            if step % config.log_every == 0 or step == config.num_steps:
                last = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
                last["tokens_per_s"] = accum * rows * config.seq_len * config.log_every / max(
                    time.perf_counter() - started, 1e-9)
                started = time.perf_counter()
                if eval_examples and (step % config.eval_every == 0 or step == config.num_steps):
                    last["eval_loss"] = eval_loss(eval_step, state.params, config, eval_examples, mesh, images)
                metrics.write(step, last)
                bar.set_postfix(loss=f"{last['loss']:.4f}", refresh=False)
            checkpointer.save(step, state, data, force=step == config.num_steps)
            bar.update()
    checkpointer.close()
    ModelWeights(graphdef, state.params).save_pretrained(os.path.join(workdir, "model"))
    last = {**last, "truncated_examples": float(cut.truncated), "trained_tokens_cut": cut.cut_share}
    stage.finish(last)
    return last
