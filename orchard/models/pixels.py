"""Images to the vision tower's patches, as the Qwen2/3-VL image processor makes them.

An image is resized so both sides are multiples of ``patch x merge`` pixels with its area inside
``[min_pixels, max_pixels]`` (:func:`smart_resize`), scaled to ``[0, 1]``, normalised by the family's
mean and standard deviation, repeated over the temporal patch (a still image is a two-frame clip), and
cut into patches ordered by merge block (:func:`patchify`).

Departure from the reference: resizing uses Pillow's bicubic filter, where transformers' fast
processor uses torchvision's; an image already at its target size (what the GUI recipe's screenshots
are) is not resized at all, and its patches equal transformers' exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchard.models.vision import Grid, VisionConfig


@dataclass(frozen=True)
class ImageProcessing:
    """The processor's settings (``preprocessor_config.json``): area bounds and normalisation."""

    min_pixels: int = 64 * 32 * 32
    max_pixels: int = 16384 * 32 * 32
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @classmethod
    def from_hf(cls, hf: dict) -> ImageProcessing:
        """A transformers ``preprocessor_config.json`` (``size`` bounds, or the older ``min_pixels``)."""
        size = hf.get("size") or {}
        defaults = cls()
        return cls(min_pixels=int(size.get("shortest_edge", hf.get("min_pixels", defaults.min_pixels))),
                   max_pixels=int(size.get("longest_edge", hf.get("max_pixels", defaults.max_pixels))),
                   mean=tuple(hf.get("image_mean", defaults.mean)), std=tuple(hf.get("image_std", defaults.std)))

    def to_hf(self, cfg: VisionConfig) -> dict:
        return {"image_processor_type": "Qwen2VLImageProcessor", "size": {"shortest_edge": self.min_pixels,
                "longest_edge": self.max_pixels}, "image_mean": list(self.mean), "image_std": list(self.std),
                "patch_size": cfg.patch_size, "temporal_patch_size": cfg.temporal_patch_size,
                "merge_size": cfg.spatial_merge_size, "do_resize": True, "do_rescale": True, "do_normalize": True,
                "rescale_factor": 1 / 255, "resample": 3}


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size an image is resized to: sides rounded to multiples of ``factor``, the area kept within
    bounds, the aspect ratio as close as that allows."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of a {width}x{height} image is over 200")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def image_grid(width: int, height: int, cfg: VisionConfig, processing: ImageProcessing = ImageProcessing()) -> Grid:
    """The patch grid ``(1, rows, columns)`` of a ``width x height`` image at its processed size."""
    h, w = smart_resize(height, width, cfg.factor, processing.min_pixels, processing.max_pixels)
    return 1, h // cfg.patch_size, w // cfg.patch_size


def image_tokens(width: int, height: int, cfg: VisionConfig, processing: ImageProcessing = ImageProcessing()) -> int:
    """How many placeholder tokens a ``width x height`` image takes in a prompt (at its processed size)."""
    return cfg.tokens_for(image_grid(width, height, cfg, processing))


def patchify(image: np.ndarray, cfg: VisionConfig, processing: ImageProcessing = ImageProcessing()
             ) -> tuple[np.ndarray, Grid]:
    """``image`` (uint8 ``[H, W, 3]``) -> (patches ``[t*h*w, C*T*P*P]`` float32, its grid ``(t, h, w)``)."""
    if image.ndim != 3 or image.shape[2] != cfg.in_channels:
        raise ValueError(f"expected an [H, W, {cfg.in_channels}] image, got shape {image.shape}")
    height, width = smart_resize(image.shape[0], image.shape[1], cfg.factor, processing.min_pixels,
                                 processing.max_pixels)
    if (height, width) != image.shape[:2]:
        from PIL import Image

        image = np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BICUBIC))
    pixels = (image.astype(np.float32) / 255.0 - np.asarray(processing.mean, np.float32)) / np.asarray(
        processing.std, np.float32)
    frames = np.repeat(pixels.transpose(2, 0, 1)[None], cfg.temporal_patch_size, axis=0)  # [T, C, H, W]
    p, m, tp = cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size
    gh, gw = height // p, width // p
    blocks = frames.reshape(1, tp, cfg.in_channels, gh // m, m, p, gw // m, m, p)
    patches = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gh * gw, cfg.patch_values)
    return np.ascontiguousarray(patches, dtype=np.float32), (1, gh, gw)
