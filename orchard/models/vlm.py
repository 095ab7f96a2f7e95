"""Qwen3-VL in Flax NNX: the vision tower (:mod:`orchard.models.vision`), the Qwen3 decoder of
:mod:`orchard.models.transformer` with multimodal rotary positions, and DeepStack.

A prompt holds ``<|vision_start|>``, then one ``<|image_pad|>`` per merged patch of the image, then
``<|vision_end|>``. The tower's outputs replace the placeholders' embeddings; the DeepStack features
(from the tower's intermediate blocks) are added to the same positions after the first decoder layers.
Positions are three-dimensional (:func:`mrope_positions`): text advances all three axes together, an
image's tokens take its frame, row and column from where the text stopped, and the text after it
resumes past the image's largest position. Text-only inputs behave exactly as Qwen3.

Everything that depends on where the images are (:class:`Images`, the positions) is computed on the
host from the token ids (:func:`vision_inputs`), so the model itself is jit-able with the image sizes
as static shapes. :class:`VisionLanguageModel` is a :class:`~orchard.models.transformer.Transformer`
(same ``forward``, caches and ``cfg`` for its language model), with images as an extra input.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard.models.config import ModelConfig
from orchard.models.pixels import ImageProcessing
from orchard.models.transformer import Decoder, KVCache, Linear, Segments, Transformer, decode, segments
from orchard.models.vision import Grid, VisionConfig, VisionTower

VLM_TYPES = ("qwen3_vl",)

# The tiny shape of the CPU default: the text model is the ``tiny`` preset as a Qwen3 (QK-norm, 3-D
# rotary positions split 4/2/2 over its 8 frequencies); the tower has 2 blocks of width 64 over 16-pixel
# patches merged 2x2, so a 160 x 224 screenshot is 35 language-model tokens, with DeepStack after block 0.
TINY_TEXT = {**ModelConfig.preset_fields("tiny"), "model_type": "qwen3", "qk_norm": True, "mrope_section": (4, 2, 2),
             "max_position_embeddings": 4096}  # a GUI turn's prompt: the 13 tools' schemas, the page, a screenshot
TINY_VISION = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "patch_size": 16,
               "num_position_embeddings": 64, "deepstack_visual_indexes": (0,)}

# Qwen3-VL-4B's shape (its config.json's text_config and vision_config): a Qwen3-4B language model
# (36 layers of width 2560, tied embeddings) and a 24-block tower of width 1024 with DeepStack after
# blocks 5, 11 and 17.
QWEN3_VL_4B_TEXT = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
                    "num_layers": 36, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
                    "rope_theta": 5_000_000.0, "qk_norm": True, "tie_word_embeddings": True,
                    "max_position_embeddings": 262144, "mrope_section": (24, 20, 20)}
QWEN3_VL_4B_VISION = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "patch_size": 16,
                      "num_position_embeddings": 2304, "deepstack_visual_indexes": (5, 11, 17)}


@dataclass(frozen=True)
class VLMConfig:
    """A vision-language model: its language model, its vision tower and the special token ids."""

    text: ModelConfig
    vision: VisionConfig
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    video_token_id: int = -1
    model_type: str = "qwen3_vl"
    # The image processor's settings (preprocessor_config.json).
    processing: ImageProcessing = dataclasses.field(default_factory=ImageProcessing)

    def replace(self, **changes) -> VLMConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def tiny(cls, vocab_size: int, image_token_id: int, vision_start_token_id: int, vision_end_token_id: int,
             text: dict | None = None, vision: dict | None = None) -> VLMConfig:
        """The CPU default's shape (:data:`TINY_TEXT`, :data:`TINY_VISION`), trained from scratch; ``text``
        and ``vision`` override fields."""
        text_cfg = ModelConfig(**{**TINY_TEXT, "vocab_size": vocab_size, **(text or {})})
        vision_cfg = VisionConfig(**{**TINY_VISION, "out_hidden_size": text_cfg.hidden_size, **(vision or {})})
        return cls(text_cfg, vision_cfg, image_token_id, vision_start_token_id, vision_end_token_id)

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> VLMConfig:
        """A transformers ``Qwen3VLConfig`` dict; ``overrides`` apply to the language model, and its dtypes to
        both towers."""
        if hf.get("model_type") not in VLM_TYPES:
            raise ValueError(f"unsupported vision-language model_type {hf.get('model_type')!r}: one of {VLM_TYPES}")
        text = dict(hf["text_config"])
        rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
        if not rope.get("mrope_interleaved", True):
            raise NotImplementedError("only interleaved multimodal rotary positions (Qwen3-VL) are implemented")
        text_cfg = ModelConfig.from_hf(
            {**text, "model_type": "qwen3", "rope_parameters": {"rope_type": rope.get("rope_type", "default"),
                                                                "rope_theta": rope.get("rope_theta", 5e6)}},
            mrope_section=tuple(rope.get("mrope_section") or (24, 20, 20)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            **overrides)
        dtypes = {key: value for key, value in overrides.items() if key in ("dtype", "param_dtype")}
        return cls(text=text_cfg, vision=VisionConfig.from_hf(hf["vision_config"], **dtypes),
                   image_token_id=hf["image_token_id"], vision_start_token_id=hf["vision_start_token_id"],
                   vision_end_token_id=hf["vision_end_token_id"], video_token_id=hf.get("video_token_id", -1),
                   model_type=hf["model_type"])

    @classmethod
    def from_pretrained(cls, path: str, **overrides) -> VLMConfig:
        """``config.json``, and ``preprocessor_config.json`` when the directory has one."""
        with open(os.path.join(path, "config.json")) as handle:
            cfg = cls.from_hf(json.load(handle), **overrides)
        processor = os.path.join(path, "preprocessor_config.json")
        if os.path.exists(processor):
            with open(processor) as handle:
                cfg = cfg.replace(processing=ImageProcessing.from_hf(json.load(handle)))
        return cfg

    def to_hf(self) -> dict:
        text = self.text.to_hf()
        for key in ("architectures", "model_type", "rope_theta", "torch_dtype"):
            text.pop(key)
        text.update(model_type="qwen3_vl_text", rope_parameters={
            "rope_type": "default", "rope_theta": self.text.rope_theta,
            "mrope_section": list(self.text.mrope_section), "mrope_interleaved": True})
        return {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": self.model_type,
                "text_config": text, "vision_config": self.vision.to_hf(),
                "image_token_id": self.image_token_id, "video_token_id": self.video_token_id,
                "vision_start_token_id": self.vision_start_token_id,
                "vision_end_token_id": self.vision_end_token_id,
                "tie_word_embeddings": self.text.tie_word_embeddings, "torch_dtype": self.text.param_dtype}


@functools.partial(jax.tree_util.register_dataclass, data_fields=["patches", "rows"], meta_fields=["grids"])
@dataclass(frozen=True)
class Images:
    """The images of a batch: all their patches, each image's grid (static: a jitted caller compiles
    once per set of image sizes) and where their placeholder tokens are (flat indices into the
    ``B x T`` tokens, in image order)."""

    patches: jax.Array  # [sum of t*h*w, C*T*P*P]
    grids: tuple[Grid, ...]
    rows: jax.Array  # [sum of tokens_for(grid)] int32


def placeholder_starts(tokens: np.ndarray, grids: Sequence[Grid], cfg: VLMConfig) -> list[int]:
    """Where each image's placeholders start, found by scanning for image tokens (as transformers does):
    the first run of ``tokens_for(grid)`` image tokens for each grid in turn, and no image token
    besides. Callers that know where their images are (a rendered prompt) pass their starts instead,
    since a sampled completion may contain the image token as text."""
    tokens = np.asarray(tokens)
    placeholder = np.flatnonzero(tokens == cfg.image_token_id)
    starts, used = [], 0
    for grid in grids:
        if used >= len(placeholder):
            raise ValueError(f"{len(grids)} images but fewer runs of image tokens in the prompt")
        starts.append(int(placeholder[used]))
        used += cfg.vision.tokens_for(grid)
    if used < len(placeholder):
        raise ValueError(f"more image tokens than the {len(grids)} images account for")
    return starts


def mrope_positions(tokens: np.ndarray, grids: Sequence[Grid], cfg: VLMConfig,
                    starts: Sequence[int] | None = None) -> tuple[np.ndarray, int]:
    """Positions ``[3, T]`` of one row of tokens whose images of ``grids`` have their placeholders at
    ``starts`` (default: :func:`placeholder_starts`), and the row's rotary delta (its largest
    position + 1 - T: what decoding adds to a token's index)."""
    tokens = np.asarray(tokens)
    starts = placeholder_starts(tokens, grids, cfg) if starts is None else list(starts)
    if len(starts) != len(grids):
        raise ValueError(f"{len(starts)} placeholder starts for {len(grids)} images")
    merge = cfg.vision.spatial_merge_size
    positions = np.zeros((3, len(tokens)), np.int64)
    next_position, start = 0, 0
    for (t, h, w), first in zip(grids, starts, strict=True):
        gh, gw = h // merge, w // merge
        count = t * gh * gw
        if first < start or not np.all(tokens[first:first + count] == cfg.image_token_id) or first + count > len(tokens):
            raise ValueError(f"an image of grid {(t, h, w)} needs {count} placeholder tokens at {first}")
        text = first - start
        positions[:, start:first] = next_position + np.arange(text)
        frame, row, col = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        positions[:, first:first + count] = np.stack([frame, row, col]).reshape(3, -1) + next_position + text
        next_position = int(positions[:, first:first + count].max()) + 1
        start = first + count
    positions[:, start:] = next_position + np.arange(len(tokens) - start)
    return positions, int(positions.max(initial=-1)) + 1 - len(tokens)


RowImage = tuple[np.ndarray, Grid] | tuple[np.ndarray, Grid, int]  # patches, grid, and where its placeholders start


def vision_inputs(tokens: np.ndarray, images: Sequence[Sequence[RowImage]], cfg: VLMConfig,
                  pad: Sequence[int] | None = None) -> tuple[np.ndarray, Images | None, np.ndarray]:
    """Host-side inputs for a batch: ``tokens [B, T]`` and, per row, its images as ``(patches, grid)``
    (:func:`orchard.models.pixels.patchify`), or ``(patches, grid, start)`` with the index (in the row,
    padding excluded) of its first placeholder; ``pad`` gives each row's left padding (its positions
    start after it; padding takes position 0). Returns positions ``[3, B, T]``, the :class:`Images`
    (None without any) and each row's rotary delta ``[B]``."""
    tokens = np.asarray(tokens)
    if len(images) != tokens.shape[0]:
        raise ValueError(f"images for {len(images)} rows, tokens for {tokens.shape[0]}")
    pad = np.zeros(tokens.shape[0], np.int64) if pad is None else np.asarray(pad)
    positions = np.zeros((3, *tokens.shape), np.int32)
    deltas, patches, grids, rows = [], [], [], []
    for b, row_images in enumerate(images):
        row = tokens[b, pad[b]:]
        row_grids = [tuple(int(v) for v in image[1]) for image in row_images]
        starts = ([int(image[2]) for image in row_images] if all(len(image) > 2 for image in row_images)
                  else placeholder_starts(row, row_grids, cfg))
        positions[:, b, pad[b]:], delta = mrope_positions(row, row_grids, cfg, starts)
        deltas.append(delta)  # a token decoded at index i of the row (padding excluded) takes position i + delta
        for image, grid, first in zip(row_images, row_grids, starts, strict=True):
            patches.append(np.asarray(image[0], np.float32))
            grids.append(grid)
            rows.extend(b * tokens.shape[1] + pad[b] + first + np.arange(cfg.vision.tokens_for(grid)))
    batch = None
    if patches:
        batch = Images(jnp.asarray(np.concatenate(patches)), tuple(grids), jnp.asarray(np.asarray(rows, np.int32)))
    return positions, batch, np.asarray(deltas, np.int32)


class VisionLanguageBody(nnx.Module):
    def __init__(self, cfg: VLMConfig, rngs: nnx.Rngs) -> None:
        self.visual = VisionTower(cfg.vision, rngs)
        self.language_model = Decoder(cfg.text, rngs)


class VisionLanguageModel(Transformer):
    """``model(tokens, positions, images=...)`` -> logits; ``cfg`` is the language model's config and
    ``config`` the whole :class:`VLMConfig`. Parameter names follow transformers'
    ``Qwen3VLForConditionalGeneration`` (``model.visual...``, ``model.language_model...``, ``lm_head``)."""

    def __init__(self, cfg: VLMConfig, *, rngs: nnx.Rngs) -> None:
        if cfg.vision.out_hidden_size != cfg.text.hidden_size:
            raise ValueError(f"the vision tower's out_hidden_size {cfg.vision.out_hidden_size} must be the "
                             f"language model's hidden_size {cfg.text.hidden_size}")
        self.config, self.cfg = cfg, cfg.text
        self.model = VisionLanguageBody(cfg, rngs)
        self.lm_head = None if cfg.text.tie_word_embeddings else Linear(
            cfg.text.hidden_size, cfg.text.vocab_size, bias=False, axes=("embed", "vocab"), cfg=cfg.text, rngs=rngs)

    @property
    def decoder(self) -> Decoder:
        return self.model.language_model

    def hf_config(self) -> dict:
        return self.config.to_hf()

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None, segment_ids: jax.Array | None = None,
                 images: Images | None = None, head: bool = True) -> jax.Array:
        """Causal pass; ``positions`` ``[3, B, T]`` from :func:`vision_inputs` when there are images.
        ``head`` False: the final-normed hidden states instead of the logits."""
        b, t = tokens.shape
        if positions is None:
            if images is not None:
                raise ValueError("a prompt with images needs its multimodal positions (vision_inputs)")
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        logits, _ = self.forward(tokens, positions, segments(b, t, segment_ids), causal=True, images=images,
                                 head=head)
        return logits

    def forward(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array | Segments,
                caches: list[KVCache] | None = None, write_index: jax.Array | int = 0, causal: bool = False,
                logits_at: jax.Array | None = None, images: Images | None = None, head: bool = True,
                ) -> tuple[jax.Array, list[KVCache] | None]:
        """:meth:`Transformer.forward` with the images' features in place of their placeholder tokens."""
        x = self.decoder.embed_tokens(tokens)
        after_layer = None
        if images is not None:
            features, deepstack = self.model.visual(images.patches, images.grids)
            if features.shape[0] != images.rows.shape[0]:
                raise ValueError(f"{images.rows.shape[0]} image tokens in the prompt for {features.shape[0]} "
                                 f"image features")
            b, t, d = x.shape
            # Rows past the end (a batch's padding images) are dropped.
            x = x.reshape(b * t, d).at[images.rows].set(features.astype(x.dtype), mode="drop").reshape(b, t, d)

            def after_layer(index: int, hidden: jax.Array) -> jax.Array:
                if index >= len(deepstack):
                    return hidden
                flat = hidden.reshape(b * t, d)
                return flat.at[images.rows].add(deepstack[index].astype(hidden.dtype), mode="drop").reshape(b, t, d)
        return decode(self.decoder, self.lm_head, x, positions, mask, caches, write_index, causal, logits_at,
                      after_layer, head)

    def encode_images(self, images: Images) -> jax.Array:
        """The tower's features for the images (what replaces their placeholders), without the decoder."""
        return self.model.visual(images.patches, images.grids)[0]
