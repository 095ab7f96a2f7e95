r"""Orchard-SWE RL with Balanced Adaptive Rollout (BAR) on GRPO.

The RL stage (``orchard.train.rl.train_rl``) is built and tested; the one-command main job
(``experiments/swe_bar/run.py``: tasks, collection, SFT, RL, held-out evaluation) is not written
yet, so this config is used through the library for now.

Variants:
  tiny           CPU: a tiny model, local sandboxes, synthetic tasks.
  qwen3_30b_a3b  the paper's setup: rollout batch 16, N = 8, N_max = 16, stride 16, window
                 [0.375, 0.625], peak lr 1e-6 with cosine decay, 64K context, at most 150 steps.
                 (On clusters: the vLLM engine and the Kubernetes backend.)
"""

from __future__ import annotations

from ml_collections import ConfigDict

from configs.swe_sft import TINY_MODEL


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = ConfigDict()
    config.seed = 0
    config.num_steps = 20
    config.checkpoint_every = 5
    config.tokenizer = "smollm2"

    config.model = ConfigDict()
    config.model.path = ""  # an SFT checkpoint exported with save_pretrained, or empty for model.init
    config.model.init = ConfigDict(TINY_MODEL)
    config.model.dtype = "float32"
    config.model.param_dtype = "float32"

    config.mesh = ConfigDict({"fsdp": 1, "tp": 1})
    config.optim = ConfigDict({"peak_lr": 1e-4, "final_lr": 1e-5, "warmup_steps": 2, "weight_decay": 0.0,
                               "clip_norm": 1.0})

    config.rl = ConfigDict()
    config.rl.sampler = ConfigDict({"name": "bar", "group_size": 4, "max_budget": 8, "stride": 4,
                                    "rho_min": 0.25, "rho_max": 0.75})
    config.rl.prompts_per_step = 2
    config.rl.concurrency = 4  # sandboxes in flight
    config.rl.max_new_tokens = 256  # per turn
    config.rl.temperature = 1.0
    config.rl.eps_low, config.rl.eps_high = 0.2, 0.28
    config.rl.max_turns = 8
    config.rl.max_context = 4096
    config.rl.episode_seconds = 120.0
    config.rl.seq_len = 4096
    config.rl.rows = 8  # prompts_per_step x group_size rollouts, one row each at most

    if variant == "tiny":
        pass
    elif variant == "qwen3_30b_a3b":
        config.model.path = "checkpoints/qwen3_30b_a3b_sft"
        config.tokenizer = config.model.path
        config.model.dtype = "bfloat16"
        config.num_steps = 150
        config.checkpoint_every = 10
        config.optim.update({"peak_lr": 1e-6, "final_lr": 1e-7, "warmup_steps": 5})
        config.rl.sampler.update({"group_size": 8, "max_budget": 16, "stride": 16, "rho_min": 0.375,
                                  "rho_max": 0.625})
        config.rl.prompts_per_step = 16
        config.rl.concurrency = 256
        config.rl.max_new_tokens = 8192
        config.rl.max_turns = 100
        config.rl.max_context = config.rl.seq_len = 65536
        config.rl.rows = 16 * 8
        config.rl.episode_seconds = 3600.0
        config.mesh.update({"fsdp": 32, "tp": 4})
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny or qwen3_30b_a3b")
    return config
