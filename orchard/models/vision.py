"""The Qwen3-VL vision tower in Flax NNX: patch embedding, learned positions, 2-D rotary blocks, the patch
merger into the language model's width, and DeepStack's extra mergers.

The input is what the family's image processor makes (:func:`orchard.models.pixels.patchify`): one row
per patch of ``C x temporal_patch x P x P`` values, the patches of each image ordered by merge block (the
``m x m`` patches a merger fuses are consecutive). ``grids`` gives each image's ``(t, h, w)`` in patches;
it is static (Python ints), so the per-image tables below are built with NumPy on the host and a jitted
caller compiles once per image size.

Departures from the reference: none in the arithmetic. Attention runs over all images at once with a
block-diagonal mask (each frame sees only itself), where transformers loops over images; the result is
the same. Names follow the HF checkpoint (``model.visual.blocks.N.attn.qkv``...), so the loader in
:mod:`orchard.models.weights` reads it like the text families; the patch embedding keeps HF's
``Conv3d`` weight ``[D, C, T, P, P]`` as is, applied as one matrix product.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard.models.params import normal_param

Grid = tuple[int, int, int]  # (frames, patch rows, patch columns) of one image

ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
}


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's shape (transformers' ``Qwen3VLVisionConfig``)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = ()
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10_000.0  # the 2-D rotary embedding's base
    dtype: str = "float32"
    param_dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_values(self) -> int:
        """Values per patch row: ``C x temporal_patch x P x P``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def factor(self) -> int:
        """Image sides must be multiples of this many pixels: a patch times the merge size."""
        return self.patch_size * self.spatial_merge_size

    def tokens_for(self, grid: Grid) -> int:
        """Language-model tokens (placeholders) of one image: its patches over the merge block."""
        t, h, w = grid
        return t * h * w // self.spatial_merge_size ** 2

    def replace(self, **changes) -> VisionConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> VisionConfig:
        if hf.get("hidden_act", "gelu_pytorch_tanh") not in ACTIVATIONS:
            raise ValueError(f"unsupported vision activation {hf['hidden_act']!r}: one of {', '.join(ACTIVATIONS)}")
        fields = {f.name: hf[f.name] for f in dataclasses.fields(cls) if f.name in hf}
        fields["deepstack_visual_indexes"] = tuple(hf.get("deepstack_visual_indexes") or ())
        fields["rope_theta"] = float((hf.get("rope_parameters") or {}).get("rope_theta", 10_000.0))
        return cls(**{**fields, **overrides})

    def to_hf(self) -> dict:
        skip = ("dtype", "param_dtype", "rope_theta")
        hf = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        hf.update(model_type="qwen3_vl_vision", deepstack_visual_indexes=list(self.deepstack_visual_indexes),
                  rope_parameters={"rope_type": "axial", "rope_theta": self.rope_theta})
        return hf


class Dense(nnx.Module):
    """A linear layer with a bias (every vision linear has one); kernel ``[in, out]``."""

    def __init__(self, d_in: int, d_out: int, axes: tuple[str | None, str | None], cfg: VisionConfig,
                 rngs: nnx.Rngs) -> None:
        self.kernel = normal_param(rngs, (d_in, d_out), cfg.param_dtype, axes)
        self.bias = nnx.Param(jnp.zeros((d_out,), cfg.param_dtype), logical_axes=(axes[1],))
        self.dtype = cfg.dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.kernel[...].astype(self.dtype) + self.bias[...].astype(self.dtype)


class LayerNorm(nnx.Module):
    def __init__(self, dim: int, cfg: VisionConfig, eps: float = 1e-6) -> None:
        self.weight = nnx.Param(jnp.ones((dim,), cfg.param_dtype), logical_axes=(None,))
        self.bias = nnx.Param(jnp.zeros((dim,), cfg.param_dtype), logical_axes=(None,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (normed * self.weight[...] + self.bias[...]).astype(x.dtype)


class PatchEmbed(nnx.Module):
    """HF's ``Conv3d`` with stride = kernel, as one matrix product over flattened patches."""

    def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs) -> None:
        shape = (cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nnx.Module()
        self.proj.weight = normal_param(rngs, shape, cfg.param_dtype, ("embed", None, None, None, None))
        self.proj.bias = nnx.Param(jnp.zeros((cfg.hidden_size,), cfg.param_dtype), logical_axes=("embed",))
        self.dtype = cfg.dtype

    def __call__(self, patches: jax.Array) -> jax.Array:
        weight = self.proj.weight[...].astype(self.dtype)
        return patches.astype(self.dtype) @ weight.reshape(weight.shape[0], -1).T + self.proj.bias[...].astype(self.dtype)


class VisionAttention(nnx.Module):
    def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs) -> None:
        self.qkv = Dense(cfg.hidden_size, 3 * cfg.hidden_size, ("embed", "heads"), cfg, rngs)
        self.proj = Dense(cfg.hidden_size, cfg.hidden_size, ("heads", "embed"), cfg, rngs)
        self.cfg = cfg

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
        """x ``[N, D]``; cos and sin ``[N, Dh]``; mask ``[N, N]`` (True: may attend)."""
        n, heads = x.shape[0], self.cfg.num_heads
        q, k, v = jnp.moveaxis(self.qkv(x).reshape(n, 3, heads, -1), 1, 0)  # each [N, H, Dh]
        q, k = (_rotate(t, cos, sin) for t in (q, k))
        scores = jnp.einsum("nhd,mhd->hnm", q, k).astype(jnp.float32) / np.sqrt(q.shape[-1])
        scores = jnp.where(mask[None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return self.proj(jnp.einsum("hnm,mhd->nhd", weights, v).reshape(n, -1))


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding in fp32, half-split layout; x ``[N, H, Dh]``, cos/sin ``[N, Dh]``."""
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    return (x32 * cos[:, None] + rotated * sin[:, None]).astype(x.dtype)


class VisionMLP(nnx.Module):
    def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs) -> None:
        self.linear_fc1 = Dense(cfg.hidden_size, cfg.intermediate_size, ("embed", "mlp"), cfg, rngs)
        self.linear_fc2 = Dense(cfg.intermediate_size, cfg.hidden_size, ("mlp", "embed"), cfg, rngs)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nnx.Module):
    def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs) -> None:
        self.norm1 = LayerNorm(cfg.hidden_size, cfg)
        self.attn = VisionAttention(cfg, rngs)
        self.norm2 = LayerNorm(cfg.hidden_size, cfg)
        self.mlp = VisionMLP(cfg, rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
    """Fuses each merge block of ``m x m`` patches into one language-model token. The main merger
    normalises each patch first; DeepStack's (``after_shuffle``) normalise the fused vector."""

    def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs, after_shuffle: bool = False) -> None:
        width = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.norm = LayerNorm(width if after_shuffle else cfg.hidden_size, cfg)
        self.linear_fc1 = Dense(width, width, ("mlp", "mlp"), cfg, rngs)
        self.linear_fc2 = Dense(width, cfg.out_hidden_size, ("mlp", "embed"), cfg, rngs)
        self.after_shuffle, self.width = after_shuffle, width

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.norm(x.reshape(-1, self.width)) if self.after_shuffle else self.norm(x).reshape(-1, self.width)
        return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=False))


class VisionTower(nnx.Module):
    """``tower(patches, grids)`` -> (tokens ``[sum(tokens_for(g)), out_hidden]``, DeepStack features, one
    array of the same shape per index in ``deepstack_visual_indexes``)."""

    def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs) -> None:
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg, rngs)
        self.pos_embed = nnx.Module()
        self.pos_embed.weight = normal_param(rngs, (cfg.num_position_embeddings, cfg.hidden_size), cfg.param_dtype,
                                       (None, "embed"))
        self.blocks = nnx.List([VisionBlock(cfg, rngs) for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg, rngs)
        self.deepstack_merger_list = nnx.List(
            [PatchMerger(cfg, rngs, after_shuffle=True) for _ in cfg.deepstack_visual_indexes])

    def __call__(self, patches: jax.Array, grids: Sequence[Grid]) -> tuple[jax.Array, list[jax.Array]]:
        cfg = self.cfg
        grids = [tuple(int(v) for v in g) for g in grids]
        if patches.shape != (sum(t * h * w for t, h, w in grids), cfg.patch_values):
            raise ValueError(f"patches {patches.shape} do not match grids {grids} "
                             f"({cfg.patch_values} values per patch)")
        x = self.patch_embed(patches)
        index, weight = position_table(grids, cfg)
        table = self.pos_embed.weight[...].astype(jnp.float32)
        x = (x + jnp.einsum("knd,kn->nd", table[index], jnp.asarray(weight)).astype(x.dtype)).astype(x.dtype)
        angles = jnp.asarray(rotary_angles(grids, cfg))  # [N, Dh/2]
        emb = jnp.concatenate([angles, angles], axis=-1)
        cos, sin = jnp.cos(emb), jnp.sin(emb)
        frames = np.repeat(np.arange(sum(t for t, _, _ in grids)), [h * w for t, h, w in grids for _ in range(t)])
        mask = jnp.asarray(frames[:, None] == frames[None, :])
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, mask)
            if i in cfg.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[cfg.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deepstack


def _merge_order(t: int, h: int, w: int, m: int) -> np.ndarray:
    """Row-major patch indices ``(frame, row, col)`` reordered by merge block, the order of the rows."""
    grid = np.arange(t * h * w).reshape(t, h // m, m, w // m, m)
    return grid.transpose(0, 1, 3, 2, 4).reshape(-1)


def position_table(grids: Sequence[Grid], cfg: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
    """The learned position embedding bilinearly resized to each image's grid: for every patch (in row
    order), the 4 table rows ``[4, N]`` and their weights ``[4, N]`` (float32, as transformers computes)."""
    side = int(cfg.num_position_embeddings ** 0.5)
    indices, weights = [], []
    for t, h, w in grids:
        # Corners aligned: patch i of n sits at i * (side - 1) / (n - 1) on the table (transformers' closed form).
        rows = np.arange(h, dtype=np.float32) * np.float32(side - 1) / np.float32(max(h - 1, 1))
        cols = np.arange(w, dtype=np.float32) * np.float32(side - 1) / np.float32(max(w - 1, 1))
        r0, c0 = rows.astype(np.int64), cols.astype(np.int64)
        r1, c1 = np.minimum(r0 + 1, side - 1), np.minimum(c0 + 1, side - 1)
        dr, dc = (rows - r0).astype(np.float32), (cols - c0).astype(np.float32)
        corners = [(r0, c0, 1 - dr, 1 - dc), (r0, c1, 1 - dr, dc), (r1, c0, dr, 1 - dc), (r1, c1, dr, dc)]
        index = np.stack([(r[:, None] * side + c[None, :]).reshape(-1) for r, c, _, _ in corners])  # [4, h*w]
        weight = np.stack([(a[:, None] * b[None, :]).reshape(-1) for _, _, a, b in corners]).astype(np.float32)
        order = _merge_order(t, h, w, cfg.spatial_merge_size) % (h * w)  # every frame shares the table
        indices.append(index[:, order])
        weights.append(weight[:, order])
    return np.concatenate(indices, axis=1), np.concatenate(weights, axis=1)


def rotary_angles(grids: Sequence[Grid], cfg: VisionConfig) -> np.ndarray:
    """Each patch's 2-D rotary angles ``[N, Dh/2]``: its row's frequencies, then its column's."""
    dim = cfg.head_dim // 2
    inv_freq = (1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))).astype(np.float32)
    out = []
    for t, h, w in grids:
        order = _merge_order(t, h, w, cfg.spatial_merge_size) % (h * w)
        rows, cols = order // w, order % w
        out.append(np.concatenate([np.outer(rows, inv_freq), np.outer(cols, inv_freq)], axis=1))
    return np.concatenate(out).astype(np.float32)
