r"""Orchard-GUI end to end: MiniWoB++ tasks, oracle trajectories, per-turn SFT of a vision-language policy,
multi-turn GRPO with the paper's reward and step-budget curriculum, held-out evaluation.

Command to run (the embedded default: local sandboxes with Debian's Chromium, a few MiniWoB++ pages,
a tiny Qwen3-VL trained from scratch, CPU):

  python experiments/gui_grpo/run.py                     # = --config=configs/gui_grpo.py:tiny
  python experiments/gui_grpo/run.py --config=configs/gui_grpo.py:elements --workdir=runs/gui_grpo_elements

Variants:
  tiny             the default: the policy sees the latest screenshot (k = 1), as the paper's does.
  elements         the same run with the page's element list (tag, text, centre) beside the screenshot.
  marks            the same run in the set-of-marks mode: the elements listed with marks, four tools on a mark.
  smoke            a minute's run of every stage (3 pages, a few steps): what the tests and the notebook's CI run use.
  qwen3vl_4b       the paper's setup: Qwen3-VL-4B from an HF directory with its vision tower and projector
                   frozen, lr 1e-5 SFT, GRPO with 15-step then 30-step episodes, rollouts from vLLM,
                   sandboxes on Kubernetes. The learner runs on the cluster's learner slice (infra/gke: one
                   4x4x4 TPU v5p slice, 64 chips of 95 GiB, 16 hosts), mesh fsdp 32 x tp 2: a micro-batch's
                   32 rows of 64K tokens, one a data-parallel group, about 17 GiB a chip by
                   orchard.train.plan's estimate (the vision tower's activations not counted). The GPU
                   pool is vLLM's, and 8 H100s would hold 4 rows each (about 83 GiB): they do not fit.
                   ``--dry-run`` resolves and checks it, prints its memory per device and launches nothing.

Blocks: ``tasks``, ``teacher``, ``harness``, ``tokenizer``, ``sft`` (with ``sft.examples``), ``rl`` (with
``rl.rollout`` and ``rl.curriculum``), ``eval`` and ``env``; ``seed``, ``chat``, ``model`` and ``mesh`` are
shared (orchard.recipes.gui.gui_config). No setting was chosen on a held-out set.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from orchard.harness.browser import TOOL_NAMES
from orchard.models.build import qwen3_vl_4b, tiny_vision_language
from orchard.models.config import CPU_ATTENTION_BLOCK

# Single-action pages whose target a tiny model can find (a labelled button, a link, a box, a dialog's X),
# and two-action ones, so the step budget matters.
PAGES = ("click-test", "click-test-2", "click-button", "click-link", "click-dialog", "focus-text", "click-widget",
         "click-button-sequence", "enter-text", "click-option")


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = ConfigDict()
    config.seed = 0

    # Stage 1: the pages, a fifth of them held out whole; of the others, 12 seeds for the teacher, 4 for RL,
    # and 2 held-out seeds of every page.
    config.tasks = ConfigDict({"pages": PAGES, "sft_seeds": 12, "rl_seeds": 4, "held_out_seeds": 2,
                               "held_out_page_fraction": 0.2, "viewport": (160, 224), "concurrency": 2})
    # Stage 2: the oracle teacher, one episode per SFT instance; the shortest success per instance, K per page.
    config.teacher = ConfigDict({"samples": 1, "cap_per_site": 20, "max_turns": 8, "concurrency": 2})
    # The tools the policy is given: the paper's 13 (orchard.harness.browser.TOOLS), whose schemas are ~1,600
    # tokens of every row's system turn.
    config.harness = ConfigDict({"elements": False, "marks": False, "tools": TOOL_NAMES, "pool": 4})
    config.tokenizer = ConfigDict({"path": "", "train_vocab": 2048, "split_digits": False})
    config.chat = ConfigDict({"format": "qwen3_vl"})

    # The policy: a tiny Qwen3-VL (2 text layers of width 64; 2 vision blocks over 16-pixel patches merged 2x2: a
    # 160 x 224 screenshot is 35 tokens) trained from scratch; its images are not resized (min_pixels).
    config.model = ConfigDict({"path": "", "init": {**tiny_vision_language(), "processing": {"min_pixels": 4096}},
                               "dtype": "float32", "param_dtype": "float32", "attention_block": CPU_ATTENTION_BLOCK,
                               "remat": "none", "logits_chunk": 1024})
    config.mesh = ConfigDict({"fsdp": 1, "tp": 1, "ep": 1, "device": ""})

    # Copying lessons before SFT for a policy trained from scratch (orchard.data.copying, the loss on the copy): a
    # span and its repeat ("span"), or keyed names recalled in a shuffled order ("recall"); 0 steps, none.
    config.pretrain = ConfigDict({"num_steps": 0, "kind": "span", "examples": 60000, "min_span": 8, "max_span": 40,
                                  "seq_len": 512, "batch_size": 8, "peak_lr": 1e-2, "final_lr": 1e-3, "lengthen": ()})

    # Stage 3: per-turn SFT (each assistant turn its own example, supervised on that turn only). A row holds one
    # example: the harness's system turn (the 13 tool schemas) is ~1,600 tokens of this BPE, a turn ~1,800-2,300.
    config.sft = ConfigDict({"num_steps": 200, "log_every": 10, "eval_every": 200, "checkpoint_every": 50,
                             "seq_len": 2560, "batch_size": 4, "grad_accum": 1, "images_per_row": 1})
    config.sft.optim = ConfigDict({"peak_lr": 3e-3, "final_lr": 3e-4, "warmup_steps": 10, "weight_decay": 0.01,
                                   "clip_norm": 1.0, "frozen": (), "master_dtype": ""})
    config.sft.examples = ConfigDict({"eval_fraction": 0.1})

    # Stage 4: GRPO, per-turn rows with the latest screenshot (k = 1), fixed groups of 4, no KL, clip 0.2 / 0.28,
    # and the step-budget curriculum scaled to these pages: 2 steps until the reward saturates (or 4 RL
    # steps), then 4. Greedy held-out success midway (step 4), for the curve of notebooks/gui_rl_init.ipynb.
    config.rl = ConfigDict({"num_steps": 8, "checkpoint_every": 4, "prompts_per_step": 4, "updates_per_batch": 1,
                            "eps_low": 0.2, "eps_high": 0.28, "kl_coef": 0.0, "seq_len": 2688, "rows": 64, "micro_rows": 4,
                            "rows_per": "turn", "context_images": 1, "images_per_row": 1, "eval_every": 4,
                            "rollout_budget": 0, "max_staleness": 0})
    config.rl.optim = ConfigDict({"peak_lr": 3e-4, "final_lr": 3e-4, "warmup_steps": 1, "weight_decay": 0.0,
                                  "clip_norm": 1.0, "frozen": (), "master_dtype": ""})
    # Fixed groups (BAR's fields unused); no pass-rate filter.
    config.rl.sampler = ConfigDict({"name": "fixed", "group_size": 4, "max_budget": 16, "stride": 16, "rho_min": 0.375,
                                    "rho_max": 0.625})
    config.rl.pass_filter = ConfigDict({"samples": 0, "low": 0.0, "high": 0.5})
    config.rl.curriculum = ConfigDict({"stages": ({"max_turns": 2, "min_steps": 2, "max_steps_in_stage": 4},
                                                  {"max_turns": 4}), "window": 2, "tolerance": 0.02})
    # The engine RL samples with: in-process JAX, or a server (vllm, openai) synced by disk or NCCL. In process,
    # no prefix cache (orchard.rollout.prefix_cache): prompts with screenshots cannot use one.
    config.rl.engine = ConfigDict({"kind": "jax", "url": "", "served_model": "", "weights_dir": "", "api_key": "EMPTY",
                                   "weight_sync": "disk", "nccl_master_address": "", "nccl_master_port": 29500,
                                   "prefix_cache_mb": 0})
    config.rl.rollout = ConfigDict({"max_new_tokens": 80, "temperature": 1.0, "max_turns": 4, "max_context": 2600,
                                    "episode_seconds": 120.0, "concurrency": 2})

    # Stage 5: every stage's policy greedily; the policies RL starts from and ends with also sampled.
    config.eval = ConfigDict({"samples": 2, "temperature": 0.0})  # temperature 0: the rollouts'
    config.env = ConfigDict({"url": "", "api_key": "", "backend": "local"})

    if variant == "tiny":
        pass
    elif variant == "elements":
        config.harness.elements = True
    elif variant == "marks":
        # Set-of-marks: the elements listed with marks beside the screenshot, and four tools that act on a mark (a
        # quarter of the paper's schema: 319 against 1,296 tokens of the smoke run's BPE); the oracle solves 34 of
        # the 43 catalogue pages this way.
        config.harness.marks = True
    elif variant == "smoke":
        config.tasks.update({"pages": ("click-test", "click-button", "click-link"), "sft_seeds": 1, "rl_seeds": 1,
                             "held_out_seeds": 1, "held_out_page_fraction": 0.3})
        # The smoke pages take clicks only: two tools' schemas, so rows of under 1,024 tokens.
        config.harness.tools = ("click", "done")
        config.sft.update({"num_steps": 4, "log_every": 2, "eval_every": 4, "checkpoint_every": 4, "seq_len": 1024})
        config.rl.update({"num_steps": 2, "checkpoint_every": 1, "prompts_per_step": 2, "rows": 16, "eval_every": 1,
                          "seq_len": 1152})
        config.rl.sampler.group_size = 2
        config.rl.curriculum.stages = ({"max_turns": 1, "min_steps": 1, "max_steps_in_stage": 1}, {"max_turns": 2})
        config.rl.rollout.update({"max_new_tokens": 24, "max_turns": 2, "max_context": 1100})
        config.eval.samples = 1
    elif variant == "qwen3vl_4b":
        config.tasks.update({"sft_seeds": 40, "rl_seeds": 200, "held_out_seeds": 20, "concurrency": 32})
        config.teacher.update({"samples": 4, "max_turns": 30, "concurrency": 64})
        config.harness.update({"elements": False, "pool": 0})  # a sandbox per episode, as the paper
        config.tokenizer.update({"path": "checkpoints/qwen3-vl-4b-thinking", "train_vocab": 0})
        config.chat.format = "qwen3_vl"
        # bfloat16 parameters and compute, AdamW on a float32 master copy of the trained ones (not of the frozen
        # vision tower: orchard.train.state.with_master_weights)
        config.model.update({"path": "checkpoints/qwen3-vl-4b-thinking", "dtype": "bfloat16",
                             "param_dtype": "bfloat16"})
        config.model.update({"init": qwen3_vl_4b(), "remat": "layer",  # the shape it holds, for --dry-run
                             "attention_block": 512})
        config.sft.update({"num_steps": 400, "seq_len": 65536, "batch_size": 32, "images_per_row": 1})
        config.sft.optim.update({"peak_lr": 1e-5, "final_lr": 1e-6, "frozen": ("model.visual",),
                                 "master_dtype": "float32"})
        config.rl.update({"num_steps": 200, "prompts_per_step": 32, "rows": 32 * 8 * 30, "micro_rows": 32,
                          "seq_len": 65536, "eval_every": 20})
        config.rl.optim.update({"peak_lr": 1e-6, "final_lr": 1e-6, "frozen": ("model.visual",),
                                "master_dtype": "float32"})
        config.rl.sampler.update({"group_size": 8})
        config.rl.curriculum.update({"stages": ({"max_turns": 15, "min_steps": 20}, {"max_turns": 30}), "window": 10})
        config.rl.engine.update({"kind": "vllm", "url": "http://vllm.orchard.svc:8000/v1",
                                 "served_model": "qwen3-vl-4b", "weights_dir": "/weights/policy"})
        config.rl.rollout.update({"max_new_tokens": 2048, "max_turns": 30, "max_context": 65536 - 64,
                                  "episode_seconds": 1800.0, "concurrency": 256})
        config.eval.samples = 4
        config.mesh.update({"fsdp": 32, "tp": 2, "ep": 1, "device": "tpu-v5p"})  # the learner slice (infra/gke)
        config.env.update({"url": "http://orchard-env.orchard.svc:8080", "backend": "kubernetes"})
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny, elements, marks, smoke or qwen3vl_4b")
    return config
