"""One configuration for the decoder family, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

SUPPORTED = ("llama", "qwen2", "qwen3", "qwen3_moe")

# Named shapes of models trained from scratch (the vocabulary comes from the tokenizer):
# tiny: the embedded defaults' policy, 2 layers of width 64 (0.1M parameters besides the embedding).
# qwen3_30b_a3b: Qwen3-30B-A3B's architecture (its config.json: 48 layers, 128 experts of which 8 a token,
# 30.5B parameters), what a large variant names for the directory it will load (``--dry-run`` plans from it).
PRESETS: dict[str, dict] = {
    "tiny": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 192, "num_layers": 2, "num_heads": 4,
             "num_kv_heads": 2, "head_dim": 16, "tie_word_embeddings": True, "max_position_embeddings": 2048,
             "copy_head": 0},
    "qwen3_30b_a3b": {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
                      "intermediate_size": 6144, "num_layers": 48, "num_heads": 32, "num_kv_heads": 4,
                      "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "qk_norm": True,
                      "tie_word_embeddings": False, "max_position_embeddings": 40960, "num_experts": 128,
                      "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True},
}


# The attention block of the CPU defaults' tiny models (the recipes' configs; accelerator variants keep 512).
# On the 2-core CPU a tiny model's (width 64, 4 heads of 16) training pass, forward and backward, over 4 rows
# of 2,688 tokens took 1.33 s in blocks of 128 against 2.59 s in blocks of 512 and 1.64 s dense, and over 2
# rows of 6,208 tokens 3.19 s against 5.37 s; compiling it took a third less (a 128 x 128 block's scores stay
# in the core's cache).
CPU_ATTENTION_BLOCK = 128


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    # Multimodal rotary positions (Qwen3-VL's text model): frequencies per axis (temporal, height, width).
    mrope_section: tuple[int, ...] = ()
    # A copy head of this width (orchard.models.copy_head: a pointer over the context mixed into the output);
    # 0: none. Orchard's own: written to config.json as `orchard_copy_head`, which transformers does not read.
    copy_head: int = 0
    # Mixture of experts (Qwen3-MoE); num_experts == 0 means a dense model.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # Dtype policy: activations are computed in `dtype`, parameters are stored in `param_dtype`.
    dtype: str = "bfloat16"
    param_dtype: str = "float32"
    # How a pass is computed (not written to config.json). attention_block: a causal pass without a cache
    # over more than this many tokens runs blockwise in blocks of this size and never builds [T, T] arrays
    # (flash attention; 0: never); shorter passes keep the dense query-block path. On the 2-core CPU,
    # attention's forward and backward pass over 4096 tokens took 0.57 s in blocks of 512 against 1.97 s
    # dense (benchmarks/long_context.py measures whole steps). remat: "none", or "layer" to rematerialise
    # each decoder layer in the backward pass. logits_chunk: a training loss over rows longer than this
    # many tokens projects the hidden states onto the vocabulary this many positions of every row at a
    # time, never building the [B, T, vocab] logits (0: never).
    attention_block: int = 512
    remat: str = "none"
    logits_chunk: int = 1024

    def is_moe_layer(self, index: int) -> bool:
        return (self.num_experts > 0 and index not in self.mlp_only_layers
                and (index + 1) % self.decoder_sparse_step == 0)

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @staticmethod
    def preset_fields(name: str) -> dict:
        """The fields of a named shape (:data:`PRESETS`), for a config file to start from."""
        try:
            return dict(PRESETS[name])
        except KeyError:
            raise ValueError(f"unknown model preset {name!r}: one of {', '.join(PRESETS)}") from None

    @classmethod
    def tiny(cls, vocab_size: int, **overrides) -> ModelConfig:
        """The ``tiny`` preset over a vocabulary of ``vocab_size``."""
        return cls(**{**cls.preset_fields("tiny"), "vocab_size": vocab_size, **overrides})

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> ModelConfig:
        """Map a transformers config dict onto the family's fields."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED)}")
        # transformers 4.x writes rope_theta/rope_scaling; 5.x writes rope_parameters.
        rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise NotImplementedError(f"rope type {rope_type!r} is not implemented yet")
        rope_theta = hf.get("rope_theta") or rope.get("rope_theta", 10_000.0)
        heads = hf["num_attention_heads"]
        attention_bias = bool(hf.get("attention_bias", False))
        fields = dict(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama and Qwen3 follow `attention_bias` (o_proj too).
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            copy_head=int(hf.get("orchard_copy_head", 0)),
        )
        if model_type == "qwen3_moe":
            fields.update(
                num_experts=hf.get("num_experts") or hf["num_local_experts"],
                num_experts_per_tok=hf["num_experts_per_tok"],
                moe_intermediate_size=hf["moe_intermediate_size"],
                norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
                decoder_sparse_step=hf.get("decoder_sparse_step", 1),
                mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
            )
        fields.update(overrides)
        return cls(**fields)

    def to_hf(self) -> dict:
        """A transformers ``config.json`` dict (what vLLM and transformers read back)."""
        architectures = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                         "qwen3_moe": "Qwen3MoeForCausalLM"}
        hf = {
            "architectures": [architectures[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "torch_dtype": self.param_dtype,
        }
        if self.model_type != "qwen2":
            hf["attention_bias"] = self.qkv_bias
        if self.copy_head:
            hf["orchard_copy_head"] = self.copy_head
        if self.num_experts:
            hf.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                      moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                      decoder_sparse_step=self.decoder_sparse_step, mlp_only_layers=list(self.mlp_only_layers))
        return hf

    @classmethod
    def from_pretrained(cls, path: str, **overrides) -> ModelConfig:
        with open(os.path.join(path, "config.json")) as handle:
            return cls.from_hf(json.load(handle), **overrides)
