"""Reading llama.cpp GGUF files as if they were Hugging Face checkpoints.

:class:`GGUFCheckpoint` offers the same ``get(hf_name)`` as the safetensors reader, plus an HF-style
config dict built from the GGUF metadata, so :func:`orchard.models.from_pretrained` loads either.
Quantised tensors (Q4_1, Q8_0, ...) are dequantised to float32 with the ``gguf`` package.

llama.cpp stores the query and key projections of llama-architecture models with the two halves of
each head's rotary dimensions interleaved (it uses the pairwise rotary layout); HF and this model
use the half-split layout, so those rows are put back in order on the way in.

Supported architectures: ``llama`` (SmolLM2 and other Llama-family models).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from orchard.models.checkpoint import CheckpointError

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None for tensors the
    model does not use (``rope_freqs.weight`` in some files, for example)."""
    stem, suffix = gguf_name.rsplit(".", 1)
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{suffix}" if part in _LAYER_NAMES else None
    return f"{_GLOBAL_NAMES[stem]}.{suffix}" if stem in _GLOBAL_NAMES else None


def unpermute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleaving of rotary rows. weight: [heads * head_dim, in]."""
    head_dim = weight.shape[0] // heads
    pairs = weight.reshape(heads, head_dim // 2, 2, *weight.shape[1:])
    return pairs.swapaxes(1, 2).reshape(weight.shape)


def read_gguf(path: str) -> Any:
    """The ``gguf.GGUFReader`` of the file at ``path``, parsed once per process and version of the file: a
    model's weights and its tokenizer come from the same file, and parsing SmolLM2's metadata (a vocabulary of
    49,152 tokens and their merges) takes ~0.7 s of CPU."""
    stat = os.stat(path)
    return _parsed_gguf(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _parsed_gguf(path: str, mtime_ns: int, size: int) -> Any:
    import gguf  # optional dependency: only GGUF loading needs it

    class PlainViewReader(gguf.GGUFReader):
        """The reader over a plain ``ndarray`` view of its memory map: the same mapped pages, but slicing it
        skips ``np.memmap.__array_finalize__``, which the parse calls once per field part (1.2 million times
        for SmolLM2's vocabulary: the parse took 2.4 s of CPU, 0.7 s over the plain view)."""

        @property
        def data(self) -> np.ndarray:
            return self._data

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._data = mapped.view(np.ndarray)

    return PlainViewReader(path)


class GGUFCheckpoint:
    def __init__(self, path: str) -> None:
        import gguf

        self._gguf = gguf
        self.reader = read_gguf(path)
        self.architecture = self._field("general.architecture")
        if self.architecture != "llama":
            raise ValueError(f"GGUF architecture {self.architecture!r} is not supported (only 'llama')")
        self._tensors = {name: t for t in self.reader.tensors if (name := hf_name(t.name)) is not None}
        self.config = self._read_config()

    def _field(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def _read_config(self) -> dict:
        """The metadata as a transformers ``config.json`` dict."""
        arch = self.architecture
        return {
            "model_type": arch,
            "vocab_size": int(self._tensors["model.embed_tokens.weight"].shape[-1]),  # ggml: [embed, vocab]
            "hidden_size": self._field(f"{arch}.embedding_length"),
            "intermediate_size": self._field(f"{arch}.feed_forward_length"),
            "num_hidden_layers": self._field(f"{arch}.block_count"),
            "num_attention_heads": self._field(f"{arch}.attention.head_count"),
            "num_key_value_heads": self._field(f"{arch}.attention.head_count_kv"),
            "rms_norm_eps": self._field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
            "rope_theta": self._field(f"{arch}.rope.freq_base", 10_000.0),
            "max_position_embeddings": self._field(f"{arch}.context_length", 4096),
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
        }

    def names(self) -> Iterator[str]:
        return iter(self._tensors)

    def get(self, name: str) -> np.ndarray:
        try:
            tensor = self._tensors[name]
        except KeyError:
            raise CheckpointError(f"GGUF file has no tensor for {name!r}") from None
        weight = np.asarray(self._gguf.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        weight = weight.reshape([int(n) for n in reversed(tensor.shape)])  # ggml lists dims innermost first
        config = self.config
        if name.endswith("self_attn.q_proj.weight"):
            weight = unpermute_rotary_rows(weight, config["num_attention_heads"])
        elif name.endswith("self_attn.k_proj.weight"):
            weight = unpermute_rotary_rows(weight, config["num_key_value_heads"])
        return weight
