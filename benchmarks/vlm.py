"""Orchard's Qwen3-VL against transformers' on the same weights, one run, CPU, fp32.

A small random ``Qwen3VLForConditionalGeneration`` (a 4-block vision tower of width 256 over 16-pixel
patches merged 2x2, DeepStack after blocks 1 and 2; a 4-layer text model of width 512) is built with
transformers and saved; Orchard loads the same safetensors. Measured, best of ``repeats`` after an
untimed call (JAX compiles on it):

* ``images_per_s``: the vision tower (patches to merged features, DeepStack's included) over a batch
  of ``images`` screenshots of ``image_size`` (a 224 x 160 screenshot is 140 patches, 35 tokens);
* ``prefill_tokens_per_s``: one prompt of ``prompt_tokens`` tokens holding one image, through the
  whole model to the last position's logits (the rollout's first step).

The two are first checked to agree (the logits' largest difference is reported). Needs torch and
transformers (``pip install -e .[bench]``).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.sampler import best_rate
from orchard.results import markdown_table

IMAGE, START, END, VIDEO = 4000, 4001, 4002, 4003
TEXT = {"vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 8, 8],
                            "mrope_interleaved": True}}
VISION = {"depth": 4, "hidden_size": 256, "intermediate_size": 1024, "num_heads": 4, "patch_size": 16,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 512, "num_position_embeddings": 256,
          "deepstack_visual_indexes": [1, 2]}


@dataclass(frozen=True)
class VLMBenchConfig:
    images: int = 8
    image_size: tuple[int, int] = (224, 160)  # height, width: a GUI screenshot
    prompt_tokens: int = 1024
    repeats: int = 5


def build_checkpoint(directory: str) -> None:
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    torch.manual_seed(0)
    config = transformers.Qwen3VLConfig(text_config=TEXT, vision_config=VISION, image_token_id=IMAGE,
                                        vision_start_token_id=START, vision_end_token_id=END, video_token_id=VIDEO)
    transformers.Qwen3VLForConditionalGeneration(config).save_pretrained(directory)
    Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                             image_std=[0.5] * 3, size={"shortest_edge": 4096, "longest_edge": 1 << 24}
                             ).save_pretrained(directory)


def inputs(cfg: VLMBenchConfig) -> tuple[np.ndarray, list[int]]:
    """The images (uint8) and a prompt of ``prompt_tokens`` ids with the first image's placeholders."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (cfg.images, *cfg.image_size, 3), dtype=np.uint8)
    tokens = (cfg.image_size[0] // 32) * (cfg.image_size[1] // 32)
    text = rng.integers(0, IMAGE, cfg.prompt_tokens - tokens - 2).tolist()
    half = len(text) // 2
    return images, [*text[:half], START, *[IMAGE] * tokens, END, *text[half:]]


def orchard_side(directory: str, cfg: VLMBenchConfig) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from orchard.models import from_pretrained
    from orchard.models.pixels import patchify
    from orchard.models.transformer import causal_mask
    from orchard.models.vlm import Images, vision_inputs

    model = from_pretrained(directory, dtype="float32")
    images, prompt = inputs(cfg)
    processed = [patchify(image, model.config.vision, model.config.processing) for image in images]
    grid = processed[0][1]
    patches = jnp.asarray(np.concatenate([p for p, _ in processed]))
    batch = Images(patches, (grid,) * len(images), jnp.zeros(0, jnp.int32))
    encode = nnx.jit(lambda m, b: m.encode_images(b))

    def run_vision() -> int:
        jax.block_until_ready(encode(model, batch))
        return len(images)

    tokens = np.asarray([prompt], np.int32)
    positions, one, _ = vision_inputs(tokens, [[processed[0]]], model.config)
    length = tokens.shape[1]
    prefill = nnx.jit(lambda m, t, p, im: m.forward(t, p, causal_mask(1, length), causal=True,
                                                     logits_at=jnp.asarray([length - 1]), images=im)[0])
    arrays = (jnp.asarray(tokens), jnp.asarray(positions), one)

    def run_prefill() -> int:
        jax.block_until_ready(prefill(model, *arrays))
        return length

    logits = np.asarray(prefill(model, *arrays))[0, -1]
    return {"images_per_s": best_rate(run_vision, cfg.repeats), "prefill_tokens_per_s": best_rate(run_prefill, cfg.repeats),
            "last_logits": logits, "devices": str(jax.devices())}


def hf_side(directory: str, cfg: VLMBenchConfig) -> dict[str, Any]:
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = Qwen2VLImageProcessorPil.from_pretrained(directory)
    images, prompt = inputs(cfg)
    processed = processor(images=list(images), return_tensors="pt")
    pixels, grids = processed["pixel_values"], processed["image_grid_thw"]

    def run_vision() -> int:
        with torch.no_grad():
            model.model.visual(pixels, grid_thw=grids)
        return len(images)

    ids = torch.tensor([prompt])
    per_image = pixels.shape[0] // len(images)
    kwargs = {"input_ids": ids, "pixel_values": pixels[:per_image], "image_grid_thw": grids[:1],
              "mm_token_type_ids": (ids == IMAGE).int(), "logits_to_keep": 1}

    def run_prefill() -> int:
        with torch.no_grad():
            model(**kwargs)
        return len(prompt)

    with torch.no_grad():
        logits = model(**kwargs).logits[0, -1].float().numpy()
    return {"images_per_s": best_rate(run_vision, cfg.repeats), "prefill_tokens_per_s": best_rate(run_prefill, cfg.repeats),
            "last_logits": logits, "torch_threads": torch.get_num_threads(), "versions": {
                "torch": torch.__version__, "transformers": transformers.__version__}}


def run_benchmark(cfg: VLMBenchConfig, command: str = "") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="orchard-vlm-bench-") as directory:
        build_checkpoint(directory)
        ours, theirs = orchard_side(directory, cfg), hf_side(directory, cfg)
    difference = float(np.max(np.abs(ours.pop("last_logits") - theirs.pop("last_logits"))))
    metrics = ("images_per_s", "prefill_tokens_per_s")
    return {"benchmark": "vlm_bench", "config": asdict(cfg), "command": command,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "model": {"text": TEXT, "vision": VISION}, "orchard": ours, "transformers": theirs,
            "max_logit_difference": difference, "ratios": {m: round(ours[m] / theirs[m], 2) for m in metrics}}


def render_markdown(summary: dict[str, Any]) -> str:
    cfg, ours, theirs = summary["config"], summary["orchard"], summary["transformers"]
    height, width = cfg["image_size"]
    return "\n".join([
        "## Vision-language model (`experiments/vlm_bench/run.py`)",
        "",
        f"A small random Qwen3-VL (vision: 4 blocks of width 256, 16-pixel patches merged 2x2, DeepStack; text: 4 "
        f"layers of width 512), the same safetensors in Orchard (JAX) and transformers "
        f"{theirs['versions']['transformers']} (torch {theirs['versions']['torch']}, {theirs['torch_threads']} "
        f"threads), fp32 on {summary['machine']['cpus']} CPUs; best of {cfg['repeats']}. Command: "
        f"`{summary['command']}`. Largest difference of the last position's logits: "
        f"{summary['max_logit_difference']:.1e}.",
        "",
        markdown_table(["", "Orchard", "transformers", "ratio"], [
            [f"vision tower, {cfg['images']} screenshots of {width} x {height} (images/s)", f"{ours['images_per_s']:.1f}",
             f"{theirs['images_per_s']:.1f}", f"{summary['ratios']['images_per_s']:.2f}x"],
            [f"prefill, {cfg['prompt_tokens']} tokens with one image (tokens/s)", f"{ours['prefill_tokens_per_s']:.0f}",
             f"{theirs['prefill_tokens_per_s']:.0f}", f"{summary['ratios']['prefill_tokens_per_s']:.2f}x"],
        ]),
    ])
