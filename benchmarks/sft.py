"""SFT training throughput: Orchard's train step against google-tunix's ``PeftTrainer``, one run.

Both sides train the same tiny Qwen3-style :class:`~orchard.models.Transformer` (same config, same
seed, so the same initial weights), fp32 on one device, with the same Optax optimizer (Orchard's
:func:`~orchard.train.state.make_optimizer`: global-norm clipping, then AdamW with warmup and cosine
decay), the same masked next-token loss and the same packed batches, in the same order:

* Data: synthetic examples (repeated random token motifs; only the repeats train) written to a temp
  JSONL file and packed by :func:`orchard.data.pipeline.make_dataset` into ``[batch, seq_len]``
  rows. All ``warmup + repeats * steps`` batches are read into memory first, so loading and packing
  are never timed. Each side gets the numpy batches and moves them to the device itself, every step.
* Orchard: :func:`~orchard.train.state.init_state` on ``make_mesh(1, 1)`` and the jitted, state-
  donating :func:`~orchard.train.state.make_train_step`; each step reshapes the batch to
  ``[1, batch, seq]`` (one micro-batch), ``jax.device_put`` s it with
  :func:`~orchard.train.state.batch_sharding` and calls the step, as ``orchard.train.sft`` does. The
  loop keeps each step's loss as a device array (no host sync per step) and ends with
  ``jax.block_until_ready`` on the state and the last metrics.
* Tunix: ``PeftTrainer(model, optimizer, TrainingConfig(...))`` on a fresh copy of the model (placed
  on the same mesh), ``with_loss_fn(`` :func:`masked_next_token_loss` ``)``; a training input is the
  packed batch dict itself, so the default (identity) ``gen_model_input_fn`` passes it as keyword
  arguments to the loss. Training runs inside ``with mesh:`` as Tunix's own ``peft_main`` does, so
  ``shard_input`` places each batch on the ``fsdp`` axis. Checkpointing is off
  (``checkpoint_root_directory=None``), there is no eval set, ``metrics_logging_options=None`` (no
  TensorBoard or W&B backend: metrics stay in the trainer's in-memory history), no profiler, and
  ``max_steps=None`` so no progress bar is made; the loop still does its normal per-step host work
  (input sharding, the in-flight throttle of 2, buffering the loss and grad norm and logging the
  previous step's, which reads that step's loss back to the host).

Timing: every side first trains ``warmup`` untimed steps (JAX compiles on the first). Then, for
each of ``repeats`` rounds, Orchard and Tunix in turn each train the next ``steps`` batches, timed
with :func:`time.perf_counter` from just before the first batch is handed over until the updated
parameters are ready (``jax.block_until_ready``). For Tunix that is one ``trainer.train(batches)``
call: ``PeftTrainer.train`` skips the first ``iter_steps`` items of the iterable it is given (its
resume logic), so each round passes every batch so far and it trains only the new ones; skipping
in-memory items costs microseconds, and the per-call setup of ``train`` (cached jitted step, no
progress bar) is paid once per round, inside the timing, as it would be in one long run's first
step. Measuring the whole call rather than hooks is deliberate: Tunix's per-step hooks fire on
dispatch, not on completion, so they cannot time device work. tokens/s is ``batch * seq_len``
positions per step (padding included, the same for both) times ``steps`` over the round's seconds;
the summary keeps every round and reports the best (as the other benchmarks here do) and the
median. Rounds alternate between the sides so that load from other processes hits both alike.

Orchard compiles its step twice, on the first step and again on the second, because the state
:func:`~orchard.train.state.init_state` returns carries no mesh on its scalars (``TrainState.step``
and the Optax counts) while the state a step returns does (``jax_explain_cache_misses`` shows it);
Tunix compiles once. ``warmup`` must therefore be at least 2 so that no compile is timed.

Both sides record the loss of every step; with the same weights, data and optimizer the curves
should agree to float32 round-off, which the summary checks (``max_abs_loss_diff``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from orchard.data.pipeline import make_dataset
from orchard.models import ModelConfig, Transformer
from orchard.models.sharding import make_mesh, shard_model
from orchard.results import markdown_table
from orchard.train.state import (
    OptimConfig,
    batch_sharding,
    init_state,
    make_optimizer,
    make_train_step,
)

Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class SftBenchConfig:
    """The model, the data and how many steps are trained and timed."""

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    seq_len: int = 256
    batch_size: int = 8
    warmup: int = 2  # untimed steps per side (the first compiles)
    steps: int = 10  # timed steps per side and round
    repeats: int = 5  # timed rounds per side
    examples: int = 2000  # synthetic examples written (the dataset repeats if they run out)
    peak_lr: float = 3e-3
    final_lr: float = 3e-4
    lr_warmup_steps: int = 2
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    seed: int = 0

    @property
    def total_steps(self) -> int:
        return self.warmup + self.repeats * self.steps

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


# ----------------------------------------------------------------- model, optimizer, data


def model_config(cfg: SftBenchConfig) -> ModelConfig:
    """A Qwen3-style dense decoder (QK-norm, untied embeddings), computed and stored in fp32."""
    return ModelConfig(model_type="qwen3", vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size, num_layers=cfg.num_layers,
                       num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       qk_norm=True, tie_word_embeddings=False, max_position_embeddings=max(cfg.seq_len, 512),
                       dtype="float32", param_dtype="float32")


def build_model(cfg: SftBenchConfig) -> Transformer:
    """A freshly initialised model; the same ``cfg.seed`` gives the same weights every call."""
    return Transformer(model_config(cfg), rngs=nnx.Rngs(cfg.seed))


def build_optimizer(cfg: SftBenchConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Orchard's AdamW (clipping, warmup, cosine decay over every step the benchmark trains)."""
    return make_optimizer(OptimConfig(cfg.peak_lr, cfg.final_lr, cfg.lr_warmup_steps, cfg.weight_decay, cfg.clip_norm),
                          cfg.total_steps)


def write_examples(path: str, count: int, vocab_size: int, seed: int = 0) -> str:
    """Examples with structure to learn: a random motif repeated; the first copy is masked out.

    Motif tokens are drawn Zipf-like (token ``i`` with weight ``1 / (i + 10)``), so the loss falls
    within a few steps (token frequencies) before copying the motif is learnt.
    """
    rng = np.random.default_rng(seed)
    weights = 1.0 / (np.arange(vocab_size - 3) + 10.0)
    weights /= weights.sum()
    with open(path, "w") as handle:
        for _ in range(count):
            motif = (3 + rng.choice(vocab_size - 3, size=int(rng.integers(4, 17)), p=weights)).tolist()
            tokens = [1, *motif * int(rng.integers(3, 13))]
            mask = [0] * (1 + len(motif)) + [1] * (len(tokens) - 1 - len(motif))
            handle.write(json.dumps({"token_ids": tokens, "loss_mask": mask}) + "\n")
    return path


def make_batches(cfg: SftBenchConfig, count: int | None = None) -> list[Batch]:
    """``count`` (default ``cfg.total_steps``) packed ``[batch_size, seq_len]`` batches, in memory."""
    count = cfg.total_steps if count is None else count
    with tempfile.TemporaryDirectory(prefix="orchard-sft-bench-") as tmp:
        path = write_examples(os.path.join(tmp, "train.jsonl"), cfg.examples, cfg.vocab_size, cfg.seed)
        data = make_dataset(path, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed)
        return [{k: np.asarray(v) for k, v in next(data).items()} for _ in range(count)]


def masked_next_token_loss(model: nnx.Module, tokens: jax.Array, targets: jax.Array, loss_mask: jax.Array,
                           segment_ids: jax.Array, positions: jax.Array) -> jax.Array:
    """The mean next-token loss over the trained positions of a packed batch (Tunix's ``loss_fn``).

    The same value as :func:`orchard.train.state.token_losses` divided by the number of trained
    tokens, written the way Tunix's default loss is: a full ``log_softmax`` over the vocabulary,
    then the targets' entries (a gather here, where Tunix multiplies by a one-hot array, which costs
    more still). Orchard computes ``logsumexp - target logit`` instead and never builds the
    ``[batch, seq, vocab]`` log-probabilities: that, not the loop around the step, is where its lead
    on this benchmark comes from.
    """
    logits = model(tokens, positions, segment_ids)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    mask = loss_mask.astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


# ----------------------------------------------------------------- the two trainers


class OrchardSide:
    """Orchard's jitted, donating train step on a 1x1 mesh; :meth:`train` blocks until it is done."""

    name = "orchard"

    def __init__(self, cfg: SftBenchConfig) -> None:
        self.mesh = make_mesh(1, 1)
        optimizer, schedule = build_optimizer(cfg)
        graphdef, self.state = init_state(build_model(cfg), optimizer, self.mesh)
        self.step = make_train_step(graphdef, optimizer, schedule)
        self.sharding = batch_sharding(self.mesh)
        self._losses: list[jax.Array] = []

    def train(self, batches: Sequence[Batch]) -> None:
        """One step per batch, fed from host numpy arrays as ``orchard.train.sft`` feeds them."""
        metrics = None
        for batch in batches:
            batch = {k: np.reshape(v, (1, *v.shape)) for k, v in batch.items()}  # one micro-batch
            self.state, metrics = self.step(self.state, jax.device_put(batch, self.sharding))
            self._losses.append(metrics["loss"])
        jax.block_until_ready((self.state, metrics))

    def losses(self) -> list[float]:
        """The loss of every step trained so far."""
        return [float(loss) for loss in jax.device_get(self._losses)]


class TunixSide:
    """google-tunix's ``PeftTrainer`` (full fine-tuning: the model has no LoRA parameters).

    Checkpointing, eval, metrics backends, the profiler and the progress bar are off; see the module
    docstring. Tunix is imported here so that the Orchard half runs without it.
    """

    name = "tunix"

    def __init__(self, cfg: SftBenchConfig) -> None:
        try:
            from tunix.sft import peft_trainer
        except ImportError as exc:
            raise SystemExit(f"the Tunix baseline needs google-tunix: pip install google-tunix ({exc})") from None
        self.mesh = make_mesh(1, 1)
        model = build_model(cfg)
        shard_model(model, self.mesh)
        optimizer, _ = build_optimizer(cfg)
        config = peft_trainer.TrainingConfig(
            eval_every_n_steps=cfg.total_steps + 1, max_steps=None, checkpoint_root_directory=None,
            metrics_logging_options=None, profiler_options=None, data_sharding_axis=("fsdp",), pbar_description=None)
        self.trainer = peft_trainer.PeftTrainer(model, optimizer, config).with_loss_fn(masked_next_token_loss)
        self._seen: list[Batch] = []

    def train(self, batches: Sequence[Batch]) -> None:
        """``trainer.train`` over every batch so far; it skips the ones it already trained on."""
        self._seen.extend(batches)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # `with mesh:`, as tunix's peft_main uses it
            with self.mesh:
                self.trainer.train(list(self._seen))
        jax.block_until_ready(nnx.state(self.trainer.model))

    def losses(self) -> list[float]:
        """The loss of every step trained so far, from the trainer's in-memory metrics history."""
        history = self.trainer.metrics_logger.get_metric_history(self.trainer.metrics_prefix, "loss", "train")
        return [float(loss) for loss in np.asarray(history)]


def timed_train(side: OrchardSide | TunixSide, batches: Sequence[Batch]) -> float:
    """Seconds ``side`` takes to train on ``batches``, until its parameters are updated on the device."""
    start = time.perf_counter()
    side.train(batches)
    return time.perf_counter() - start


def measure(sides: Sequence[OrchardSide | TunixSide], batches: Sequence[Batch],
            cfg: SftBenchConfig) -> dict[str, list[float]]:
    """Warm every side up, then time ``cfg.repeats`` rounds of ``cfg.steps`` steps, alternating sides.

    Every side sees the same batches in the same order. Returns each side's tokens/s per round.
    """
    if len(batches) < cfg.total_steps:
        raise ValueError(f"need {cfg.total_steps} batches, got {len(batches)}")
    for side in sides:
        side.train(batches[: cfg.warmup])
    rates: dict[str, list[float]] = {side.name: [] for side in sides}
    for round_index in range(cfg.repeats):
        start = cfg.warmup + round_index * cfg.steps
        for side in sides:
            seconds = timed_train(side, batches[start: start + cfg.steps])
            rates[side.name].append(cfg.tokens_per_step * cfg.steps / seconds)
    return rates


def run_orchard(cfg: SftBenchConfig, batches: Sequence[Batch] | None = None) -> dict[str, Any]:
    """The Orchard half alone: best tokens/s over the rounds, every round's rate and the last loss."""
    side = OrchardSide(cfg)
    rates = measure([side], make_batches(cfg) if batches is None else batches, cfg)[side.name]
    losses = side.losses()
    return {"tokens_per_s": max(rates), "rounds_tokens_per_s": rates, "first_loss": losses[0],
            "final_loss": losses[-1], "losses": losses}


# ----------------------------------------------------------------- summary


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run_metadata(cfg: SftBenchConfig, command: str | None, load_at_start: float | None = None) -> dict[str, Any]:
    """Where and how the numbers were taken; deliberately without the hostname."""
    model = model_config(cfg)
    params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(
        nnx.state(nnx.eval_shape(lambda: build_model(cfg)), nnx.Param)))
    return {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_start": None if load_at_start is None else round(load_at_start, 2),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "jax_backend": jax.default_backend(),
        "devices": [str(device) for device in jax.devices()[:1]],
        "versions": {name: _version(name) for name in ("orchard", "jax", "jaxlib", "flax", "optax", "google-tunix")},
        "command": command,
        "config": asdict(cfg),
        "model": {"model_type": model.model_type, "parameters": params, "dtype": model.dtype,
                  "param_dtype": model.param_dtype},
    }


def summarize(rates: dict[str, list[float]], losses: dict[str, list[float]], meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary: best tokens/s per side and their ratio, every round, and the loss check.

    ``round_ratios`` pairs each Orchard round with the Tunix round timed right after it; their
    median is the number least moved by other processes' load coming and going during the run.
    """
    best = {name: max(values) for name, values in rates.items()}
    ratios = [a / b for a, b in zip(rates["orchard"], rates["tunix"], strict=True)]
    diff = max(abs(a - b) for a, b in zip(losses["orchard"], losses["tunix"], strict=True))
    return {
        "tokens_per_s": {name: round(value, 1) for name, value in best.items()},
        "ratio_orchard_over_tunix": round(best["orchard"] / best["tunix"], 3),
        "median_tokens_per_s": {name: round(float(np.median(values)), 1) for name, values in rates.items()},
        "rounds_tokens_per_s": {name: [round(v, 1) for v in values] for name, values in rates.items()},
        "round_ratios": [round(r, 3) for r in ratios],
        "median_round_ratio": round(float(np.median(ratios)), 3),
        "loss": {name: {"first": round(values[0], 5), "final": round(values[-1], 5), "steps": len(values)}
                 for name, values in losses.items()},
        "max_abs_loss_diff": float(f"{diff:.3g}"),
        "metadata": meta,
    }


def run_benchmark(cfg: SftBenchConfig, command: str | None = None) -> dict[str, Any]:
    """Build both trainers, train and time them on the same batches, and return the summary."""
    load_at_start = os.getloadavg()[0]
    batches = make_batches(cfg)
    sides = [OrchardSide(cfg), TunixSide(cfg)]
    rates = measure(sides, batches, cfg)
    losses = {side.name: side.losses() for side in sides}
    return summarize(rates, losses, run_metadata(cfg, command, load_at_start))


def render_markdown(summary: dict[str, Any]) -> str:
    """The summary as the ``sft_bench`` section of ``docs/benchmarks.md``."""
    meta, cfg, rates = summary["metadata"], summary["metadata"]["config"], summary["tokens_per_s"]
    versions, model, loss = meta["versions"], meta["model"], summary["loss"]
    rounds, sides = summary["rounds_tokens_per_s"], ("orchard", "tunix")
    lines = [
        "## SFT training step",
        "",
        f"Produced by `experiments/sft_bench/run.py` on {meta['timestamp']} ({meta['cpu_count']} CPUs, "
        f"{meta['platform']}, JAX {versions['jax']} on `{meta['jax_backend']}`, flax {versions['flax']}, "
        f"optax {versions['optax']}, google-tunix {versions['google-tunix']}; 1-minute load average "
        f"{meta['load_avg_1m_at_start']} at the start, {meta['load_avg_1m_at_end']} at the end). Both columns were measured in the same run: a "
        f"{model['parameters'] / 1e6:.2f}M-parameter Qwen3-style model ({cfg['num_layers']} layers, hidden "
        f"{cfg['hidden_size']}, vocab {cfg['vocab_size']}, {model['dtype']}) trained from the same initial "
        f"weights on the same packed batches of {cfg['batch_size']} x {cfg['seq_len']} tokens with the same "
        "AdamW. See the docstring of `benchmarks/sft.py` for exactly what is timed.",
        "",
        markdown_table(["", "orchard `make_train_step`", "tunix `PeftTrainer`"], [
            ["tokens/s (best round)", *(f"{rates[side]:,.1f}" for side in sides)],
            ["tokens/s (median round)", *(f"{summary['median_tokens_per_s'][side]:,.1f}" for side in sides)],
            ["tokens/s per round", *(", ".join(f"{v:,.1f}" for v in rounds[side]) for side in sides)],
            ["loss at step 1", *(f"{loss[side]['first']:.4f}" for side in sides)],
            [f"loss at step {loss['orchard']['steps']}", *(f"{loss[side]['final']:.4f}" for side in sides)],
        ], [None, "right", "right"]),
        "",
        f"orchard / tunix tokens/s: **{summary['ratio_orchard_over_tunix']:.2f}x** (best rounds; the median of "
        f"the per-round ratios is {summary['median_round_ratio']:.2f}x); the two loss curves differ by at most "
        f"{summary['max_abs_loss_diff']:.2g}.",
        "",
        f"{cfg['warmup']} untimed warm-up steps per side, then {cfg['repeats']} rounds of {cfg['steps']} timed "
        "steps, alternating sides.",
        "",
        "Reproduce (in a venv with `pip install -e '.[train,env]' google-tunix`):",
        "",
        "```sh",
        meta["command"] or "python experiments/sft_bench/run.py --markdown docs/benchmarks.md",
        "```",
        "",
    ]
    return "\n".join(lines)
