"""The stages every recipe shares, written once: the typed configs every recipe config holds, the
tokenizer, copying lessons (a fresh policy's pretraining), SFT and evaluation stages, the trained policy,
and the paired change between two evaluations.

Each stage is a :class:`~orchard.workdir.Stage`: its folder records the config and the inputs that made
it, a rerun with the same ones reuses it, and other ones stop the run (or, with ``rerun``, redo it).
What differs between task families (how examples are written, what an evaluation measures) comes in
as a :class:`~orchard.recipes.family.Family`; the order of the stages is :mod:`orchard.recipes.runner`'s.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from jax.sharding import Mesh
from ml_collections import ConfigDict

from orchard.config import fingerprint, from_config
from orchard.data.chat import make_chat_format
from orchard.data.copying import LESSONS, write_copy_examples
from orchard.data.examples import to_example
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories
from orchard.eval.copying import CopyProbe, ProbeRow, copy_accuracy, novel_tokens
from orchard.eval.metrics import paired_change
from orchard.eval.runner import Evaluation
from orchard.models.build import ModelSpec, build_model
from orchard.models.sharding import MeshConfig
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.recipes.sft_data import ExamplesConfig, build_examples
from orchard.train.rl import RLConfig
from orchard.train.sft import SFTConfig, train_and_evaluate
from orchard.workdir import Stage, made_by, read_json, write_json

log = logging.getLogger(__name__)

PASSES = ("greedy", "sampled")
ENGINES = {"jax": (), "vllm": ("url", "served_model", "weights_dir"), "openai": ("url", "served_model", "weights_dir")}
TEMPLATE_MARGIN = 8  # tokens the chat format adds after the last sampled token of a rollout
STAGES = ("init", "sft", "rl")
PROBE_RUNS = 48  # resolved teacher runs the copy probe renames (orchard.eval.copying)


@dataclass(frozen=True)
class TokenizerConfig:
    path: str = ""  # a tokenizer (an HF directory, a .gguf, "smollm2"); empty: train one on the teacher text
    train_vocab: int = 2048
    split_digits: bool = False  # a trained tokenizer's: one token a digit (orchard.data.tokenizer.Tokenizer.train)


@dataclass(frozen=True)
class PretrainConfig:
    """Copying lessons for a policy trained from scratch, before SFT (:mod:`orchard.data.copying`); 0 steps: none.
    The run's SFT settings otherwise (optimiser, mesh, model), at these steps, rows and learning rates."""

    num_steps: int = 0
    kind: str = "span"  # the lessons (orchard.data.copying.LESSONS): a span and its repeat, or items recalled by key
    examples: int = 60000  # lessons (more than the steps read: each is seen once)
    min_span: int = 8
    max_span: int = 40
    seq_len: int = 512
    batch_size: int = 8
    peak_lr: float = 1e-2
    final_lr: float = 1e-3
    # Longer lessons after those, each phase (steps, max_span, seq_len) continuing from the one before, its rows
    # holding the first phase's tokens a step, its learning rate decaying from final_lr to a tenth of it. A fresh
    # policy given long lessons at once stays on the plateau (the tiny one: 1,100 steps at 8-1,000-token spans);
    # lengthened in phases it learns them.
    lengthen: tuple[tuple[int, int, int], ...] = ()

    def phases(self) -> list[LessonPhase]:
        """The phases of lessons in order: the first (``num_steps`` ...), then :attr:`lengthen`'s."""
        first = LessonPhase(self.num_steps, self.max_span, self.seq_len, self.batch_size, self.peak_lr, self.final_lr,
                            self.examples)
        tokens = self.seq_len * self.batch_size
        return [first, *(LessonPhase(steps, span, seq_len, max(1, tokens // seq_len), self.final_lr, self.final_lr / 10,
                                     max(1, steps * tokens // (self.min_span + span)))
                         for steps, span, seq_len in self.lengthen)]


@dataclass(frozen=True)
class LessonPhase:
    """One phase of copying lessons: steps, the longest span, rows, learning rates, and how many lessons it draws
    (a lengthening phase: about as many as its steps read)."""

    num_steps: int
    max_span: int
    seq_len: int
    batch_size: int
    peak_lr: float
    final_lr: float
    examples: int


@dataclass(frozen=True)
class EvalConfig:
    samples: int = 8  # sampled episodes a held-out task
    # the sampled passes' temperature; 0: the rollouts' (rl.rollout.temperature). Set it apart from RL's when RL
    # explores hotter than the policy is best evaluated at.
    temperature: float = 0.0


@dataclass(frozen=True)
class EnvConfig:
    url: str = ""  # the orchestrator; empty: a local one started for the run
    api_key: str = ""  # its key; empty: $ORCHARD_API_KEY
    backend: Literal["local", "kubernetes"] = "local"


@dataclass(frozen=True)
class SharedStages:
    """The typed stage configs every recipe config holds (:func:`shared_stages`); each family's config
    adds its own (its tasks, teacher, examples...)."""

    seed: int
    tokenizer: TokenizerConfig
    chat_format: str
    model: ModelSpec
    mesh: MeshConfig
    pretrain: PretrainConfig
    sft: SFTConfig
    rl: RLConfig
    eval: EvalConfig
    env: EnvConfig


# Fields a stage config gets from the top of the recipe config (shared_stages copies them), not from its own block.
COPIED_FIELDS = ("sft.seed", "sft.mesh", "sft.model", "rl.seed", "rl.chat_format", "rl.mesh", "rl.dtype",
                 "rl.param_dtype", "rl.attention_block", "rl.remat", "rl.logits_chunk", "examples.seed",
                 "examples.chat_format")


def shared_stages(config: ConfigDict) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The stage configs every recipe config holds, typed: the seed and chat format (set once at the
    top), the tokenizer, model, mesh, SFT, RL, eval and env blocks (the seed, chat format, mesh and
    model's compute settings, dtypes included, copied into the stages that use them); and the config as
    a dict and its ``sft.examples`` block, for the family's own stages."""
    c = config.to_dict()
    sft = dict(c["sft"])
    examples = sft.pop("examples")
    seed, chat_format = c["seed"], c["chat"]["format"]
    model = from_config(ModelSpec, c["model"], "model")
    common = dict(
        seed=seed, chat_format=chat_format,
        tokenizer=from_config(TokenizerConfig, c["tokenizer"], "tokenizer"),
        model=model,
        mesh=from_config(MeshConfig, c["mesh"], "mesh"),
        pretrain=from_config(PretrainConfig, c["pretrain"], "pretrain"),
        sft=from_config(SFTConfig, {**sft, "seed": seed, "mesh": c["mesh"], "model": c["model"]}, "sft"),
        rl=from_config(RLConfig, {**c["rl"], "seed": seed, "chat_format": chat_format, "mesh": c["mesh"],
                                  **model.compute()}, "rl"),
        eval=from_config(EvalConfig, c["eval"], "eval"),
        env=from_config(EnvConfig, c["env"], "env"))
    return common, c, examples


class Clock:
    """Seconds spent per stage, summed over the calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now


def task_ids(tasks: Sequence[Any]) -> str:
    """The fingerprint of which tasks a stage sees (anything with an ``id``)."""
    return fingerprint(sorted(task.id for task in tasks))


def message_texts(trajectories: Sequence[Trajectory]) -> list[str]:
    """The text of the teacher's trajectories a BPE learns from: each message's content, reasoning and
    tool calls (as JSON), in order."""
    texts = []
    for trajectory in trajectories:
        for message in trajectory.messages:
            texts += [message.content or "", message.reasoning or ""]
            texts += [json.dumps({"name": c.name, "arguments": c.arguments}) for c in message.tool_calls]
    return texts


def content_texts(trajectories: Sequence[Trajectory]) -> list[str]:
    """The messages' contents, in order (the default a BPE learns from)."""
    return [m.content for t in trajectories for m in t.messages if m.content]


@dataclass
class Made:
    """What a stage made, where it lives, and the fingerprint later stages take as an input."""

    directory: str
    made_by: str


def tokenizer_stage(config: SharedStages, workdir: str, trajectories: Sequence[Trajectory], teacher: str,
                    rerun: bool, texts: Callable[[Sequence[Trajectory]], list[str]] = content_texts,
                    special_tokens: Sequence[str] | None = None) -> tuple[Tokenizer, Made]:
    """The tokenizer ``config.tokenizer.path`` names, or a BPE of ``config.tokenizer.train_vocab`` tokens
    trained on ``texts(trajectories)`` with ``special_tokens`` (default: :meth:`Tokenizer.train`'s)."""
    if config.tokenizer.path:
        path = resolve(config.tokenizer.path)
        return Tokenizer.from_pretrained(path), Made(path, fingerprint({"tokenizer": config.tokenizer.path}))
    stage = Stage(os.path.join(workdir, "tokenizer"), "tokenizer", config.tokenizer, {"teacher": teacher})
    if stage.open(rerun) != "done":
        corpus = texts(trajectories)
        if not any(corpus):
            raise ValueError("no teacher text to train a tokenizer on: set tokenizer.path or collect trajectories")
        extra = {"special_tokens": special_tokens} if special_tokens is not None else {}
        Tokenizer.train(corpus, config.tokenizer.train_vocab, split_digits=config.tokenizer.split_digits,
                        **extra).save_pretrained(stage.directory)
        stage.finish()
    return Tokenizer.from_pretrained(stage.directory), Made(stage.directory, stage.fingerprint)


def trained_policy(config: SharedStages, directory: str, mesh: Mesh | None = None) -> Transformer:
    """The policy a stage trained into ``directory``, as the config's stages compute with it: the config's
    model settings (dtypes, attention block, rematerialisation, logits chunk) with that path; on ``mesh``,
    placed as RL places its own (so the two share their compiled programs)."""
    return build_model(replace(config.model, path=directory), config.seed, mesh=mesh)


def copy_probe(config: SharedStages, examples: ExamplesConfig, workdir: str, policy: str,
               pairs: Sequence[tuple[Trajectory, Trajectory]], tokenizer: Tokenizer,
               mesh: Mesh | None = None) -> CopyProbe:
    """:func:`~orchard.eval.copying.copy_accuracy` of the policy in ``policy`` on ``pairs`` (a teacher run, and
    its copy renamed with a copy index no SFT row used: the family's renaming), written to
    ``<workdir>/sft/copy_probe.json`` and logged: whether the policy copies names it cannot have seen."""
    chat = make_chat_format(examples.chat_format, tokenizer)
    rows = []
    for run, renamed in pairs:
        example = to_example(renamed, chat)
        rows.append(ProbeRow(example.token_ids, example.loss_mask,
                             novel_tokens(example.token_ids, to_example(run, chat).token_ids)))
    probe = copy_accuracy(trained_policy(config, policy, mesh), rows, config.sft.seq_len)
    write_json(os.path.join(workdir, "sft", "copy_probe.json"), probe.to_dict())
    log.info("copy probe of the SFT policy (greedy, teacher-forced, renamed runs): %.3f of action tokens, "
             "%.3f of copyable ones, %.3f of new names' pieces (%d)", probe.actions, probe.copyable,
             probe.novel, probe.counts["novel"])
    return probe


def pretrain_stage(config: SharedStages, workdir: str, tokenizer: Tokenizer, tokenizer_made: Made,
                   rerun: bool) -> Made:
    """Copying lessons (``config.pretrain``) for the fresh policy ``config.model`` describes: each phase's examples
    in ``pretrain_data/`` (``pretrain_data_2/``...), its training in ``pretrain/`` (``pretrain_2/``...), from the
    policy the phase before it trained; the returned directory holds the last policy and its tokenizer."""
    lessons = config.pretrain
    made: Made | None = None
    for index, phase in enumerate(lessons.phases()):
        suffix = f"_{index + 1}" if index else ""
        drawn = {"kind": lessons.kind, "examples": phase.examples, "min_span": lessons.min_span,
                 "max_span": phase.max_span}
        data = Stage(os.path.join(workdir, "pretrain_data" + suffix), "pretrain_data", drawn,
                     {"tokenizer": tokenizer_made.made_by, "seed": str(config.seed)})
        if data.open(rerun) != "done":
            written = write_copy_examples(os.path.join(data.directory, "train.jsonl"), tokenizer, phase.examples,
                                          config.seed, lessons.min_span, phase.max_span, f"copy-examples{suffix}",
                                          kind=lessons.kind)
            data.finish({"examples": written})
        steps = phase.num_steps
        training = replace(config.sft, num_steps=steps, seq_len=phase.seq_len, batch_size=phase.batch_size,
                           grad_accum=1, eval_every=steps, checkpoint_every=steps, log_every=max(1, steps // 20),
                           optim=replace(config.sft.optim, peak_lr=phase.peak_lr, final_lr=phase.final_lr),
                           model=config.sft.model if made is None else replace(config.sft.model, path=made.directory))
        directory = os.path.join(workdir, "pretrain" + suffix)
        train_and_evaluate(training, directory, examples=os.path.join(data.directory, "train.jsonl"),
                           vocab_size=tokenizer.vocab_size, rerun=rerun,
                           inputs={"examples": data.fingerprint, **({"start": made.made_by} if made else {})})
        model_dir = os.path.join(directory, "model")
        if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
            tokenizer.save_pretrained(model_dir)
        made = Made(model_dir, made_by(directory))
    assert made is not None  # phases() holds the first phase at least
    return made


def starting_from(config: Any, policy: str) -> Any:
    """``config`` (a recipe's typed config) with every stage that builds the policy starting from ``policy``."""
    return replace(config, model=replace(config.model, path=policy),
                   sft=replace(config.sft, model=replace(config.sft.model, path=policy)))


def sft_stage(config: SharedStages, workdir: str, examples_config: Any, write: Callable[[str], dict[str, Any]],
              tokenizer_dir: str, inputs: dict[str, str], rerun: bool,
              train_options: Callable[[str], dict[str, Any]] | None = None) -> Made:
    """SFT: the examples ``write`` puts into ``sft_data/`` (a stage of ``examples_config`` and ``inputs``),
    then :func:`~orchard.train.sft.train_and_evaluate` into ``sft/`` (``train_options(data folder)``: its
    extra arguments, such as a VLM's model and image table); the trained policy (with its tokenizer) is in
    the returned directory."""
    data = Stage(os.path.join(workdir, "sft_data"), "sft_data", examples_config, inputs)
    if data.open(rerun) != "done":
        data.finish(write(data.directory))
    directory = os.path.join(workdir, "sft")
    eval_path = os.path.join(data.directory, "eval.jsonl")
    vocab_size = Tokenizer.from_pretrained(tokenizer_dir).vocab_size
    train_and_evaluate(config.sft, directory, examples=os.path.join(data.directory, "train.jsonl"),
                       eval_examples=eval_path if os.path.getsize(eval_path) else "", vocab_size=vocab_size,
                       inputs={"examples": data.fingerprint}, rerun=rerun,
                       **(train_options(data.directory) if train_options else {}))
    model_dir = os.path.join(directory, "model")
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        Tokenizer.from_pretrained(tokenizer_dir).save_pretrained(model_dir)
    return Made(model_dir, made_by(directory))


def text_sft_stage(config: SharedStages, workdir: str, examples: ExamplesConfig, trajectories: Sequence[Trajectory],
                   tokenizer: Tokenizer, tokenizer_dir: str, inputs: dict[str, str], rerun: bool,
                   group: Callable[[Trajectory], str] | None = None) -> Made:
    """:func:`sft_stage` of a text family: credit-assignment examples of ``trajectories``
    (:func:`~orchard.recipes.sft_data.build_examples`; ``group``: a trajectory's group for the ``diverse``
    selection rule)."""

    pretrain = config.pretrain
    lessons = pretrain.kind, pretrain.min_span, pretrain.phases()[-1].max_span  # as the last phase draws them

    def write(directory: str) -> dict[str, Any]:
        build_examples(examples, directory, tokenizer, list(trajectories), group, lessons=lessons)
        return read_json(os.path.join(directory, "stats.json"))["train"]

    if examples.copy_lessons:  # the lessons kept in SFT are drawn as the pretrain block's last phase draws them
        inputs = {**inputs, "lessons": fingerprint(list(lessons))}
    return sft_stage(config, workdir, examples, write, tokenizer_dir, inputs, rerun)


def episodes_path(directory: str) -> str:
    """Where an evaluation stage keeps the graded episodes behind its result."""
    return os.path.join(directory, "trajectories.jsonl")


def sampled_change(before: str, after: str) -> dict[str, float]:
    """The paired per-task change of the pass rate between the episodes in two evaluation folders, and
    its one-sided sign test."""
    start, end = (Evaluation.of(list(read_trajectories(episodes_path(d)))).task_rates() for d in (before, after))
    return paired_change(start, end).to_dict()


def pretrain_problems(config: Any) -> list[str]:
    """The copying lessons' inconsistencies: they teach a policy trained from scratch, in rows that hold a copy."""
    lessons, problems = config.pretrain, []
    if lessons.num_steps < 0:
        problems.append("pretrain.num_steps must be 0 (no copying lessons) or more")
    if lessons.num_steps and config.model.path:
        problems.append(f"pretrain teaches a policy trained from scratch; model.path ({config.model.path}) is "
                        "already trained: set pretrain.num_steps = 0")
    # Lessons kept in SFT (sft.examples.copy_lessons) are drawn as this block says, with or without steps here.
    drawn = lessons.num_steps or getattr(getattr(config, "examples", None), "copy_lessons", 0)
    if drawn and lessons.kind not in LESSONS:
        problems.append(f"pretrain.kind {lessons.kind!r}: one of {', '.join(LESSONS)}")
    if drawn and not 1 <= lessons.min_span <= lessons.max_span:
        problems.append(f"pretrain spans need 1 <= min_span <= max_span, got {lessons.min_span} and {lessons.max_span}")
    if lessons.num_steps and 2 * lessons.max_span > lessons.seq_len + 1:
        problems.append(f"pretrain.seq_len ({lessons.seq_len}) cannot hold a span and its copy "
                        f"(2 x max_span = {2 * lessons.max_span} tokens)")
    for steps, span, seq_len in lessons.lengthen if lessons.num_steps else ():
        if steps < 1 or span < lessons.min_span or 2 * span > seq_len + 1:
            problems.append(f"pretrain.lengthen phase ({steps}, {span}, {seq_len}) needs steps >= 1, max_span >= "
                            f"min_span ({lessons.min_span}) and rows that hold a span and its copy (2 x max_span)")
    return problems


def rl_problems(config: Any) -> list[str]:
    """The RL stage's inconsistencies in any recipe config with ``rl``, ``mesh`` and ``env`` blocks:
    the group sampler, rows and micro-batches, the learner's rows against the rollouts' context, the
    clip range, the engine, the backend, the step and concurrency counts."""
    problems: list[str] = []
    rl, sampler = config.rl, config.rl.sampler
    if sampler.group_size < 2:
        problems.append("rl.sampler.group_size must be at least 2 (GRPO compares rollouts within a group)")
    if sampler.name == "bar":
        if not 0.0 <= sampler.rho_min <= sampler.rho_max <= 1.0:
            problems.append(f"BAR window [{sampler.rho_min}, {sampler.rho_max}] must satisfy 0 <= min <= max <= 1")
        elif math.ceil(sampler.rho_min * sampler.group_size - 1e-9) > math.floor(
                sampler.rho_max * sampler.group_size + 1e-9):
            problems.append(f"BAR window [{sampler.rho_min}, {sampler.rho_max}] holds no positive count for "
                            f"N = {sampler.group_size}")
        if sampler.max_budget < sampler.group_size or sampler.stride < 1:
            problems.append("BAR needs max_budget >= group_size and stride >= 1")
    if rl.rows_per == "trajectory" and rl.rows < rl.prompts_per_step * sampler.group_size:
        problems.append(f"rl.rows ({rl.rows}) < prompts_per_step x group_size "
                        f"({rl.prompts_per_step * sampler.group_size}): a step's groups would not fit")
    if rl.micro_rows < 1 or rl.rows % rl.micro_rows or rl.micro_rows % config.mesh.fsdp:
        problems.append(f"rl.rows ({rl.rows}) must be a multiple of rl.micro_rows ({rl.micro_rows}), and that of "
                        f"mesh.fsdp ({config.mesh.fsdp})")
    if rl.seq_len < rl.rollout.max_context + TEMPLATE_MARGIN:
        problems.append(f"rl.seq_len ({rl.seq_len}) < rl.rollout.max_context ({rl.rollout.max_context}) + "
                        f"{TEMPLATE_MARGIN} template tokens: the longest rollouts would not fit the learner's rows")
    if not 0.0 <= rl.eps_low < 1.0 or rl.eps_high < 0.0:
        problems.append(f"PPO clip range (eps_low {rl.eps_low}, eps_high {rl.eps_high}) is invalid")
    if rl.engine.kind not in ENGINES:
        problems.append(f"rl.engine.kind must be one of {tuple(ENGINES)}, got {rl.engine.kind!r}")
    else:
        problems += [f"rl.engine.{name} is required for a {rl.engine.kind} engine"
                     for name in ENGINES[rl.engine.kind] if not getattr(rl.engine, name)]
    if config.env.backend == "kubernetes" and not config.env.url:
        problems.append("env.url (the orchestrator of the cluster) is required for the kubernetes backend")
    if rl.num_steps < 1:
        problems.append("rl.num_steps must be at least 1")
    if rl.rollout.concurrency < 1:
        problems.append("rl.rollout.concurrency must be at least 1")
    if rl.updates_per_batch < 1:
        problems.append("rl.updates_per_batch (policy updates per step's rollouts) must be at least 1")
    return problems
