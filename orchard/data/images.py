"""Images in trajectories: kept once each, by content hash, beside the JSON lines, never inside them.

A message carries its images as :class:`ImageRef` (the SHA-256 of the encoded bytes, the media
type and the size in pixels). The bytes live in an :class:`ImageStore`, a directory laid out as
``<root>/<hash[:2]>/<hash>.<ext>`` (a workdir's ``images/``): a screenshot that repeats (an
unchanged page) is stored once, and a trajectory file stays small enough to read line by line.

:func:`recent_images` is the context window over images: the paper trains with only the latest
``k = 1`` screenshot in the context, the earlier ones dropped from the prompt (their messages stay).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import struct
import tempfile
import weakref
from collections.abc import Sequence
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

MEDIA_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp"}
_PILLOW_MEDIA = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
MAX_PIXELS = 40_000_000  # larger images are refused before decoding (a small PNG can decode to gigabytes)


class ImageRef(BaseModel):
    """An image by content: ``sha256`` of its bytes, its ``media_type``, ``width`` x ``height`` pixels."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str
    media_type: str = "image/png"
    width: int
    height: int


def png_size(data: bytes) -> tuple[int, int]:
    """The width and height of a PNG, from its header; ``ValueError`` for anything else."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG image")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _pillow_image(data: bytes):
    from PIL import Image  # Pillow comes with the training stack, not with Orchard Env

    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > MAX_PIXELS:
            raise ValueError(f"{image.width}x{image.height} pixels is more than the {MAX_PIXELS:,} allowed")
        image.load()
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ValueError(f"not a readable image ({exc})") from None
    return image


def image_info(data: bytes) -> tuple[str, int, int]:
    """``(media_type, width, height)`` of PNG, JPEG or WebP bytes; ``ValueError`` for anything else
    (other formats, corrupt or truncated files, decompression bombs)."""
    with _pillow_image(data) as image:
        media_type = _PILLOW_MEDIA.get(image.format or "")
        if media_type is None:
            raise ValueError(f"unsupported image format {image.format!r}: PNG, JPEG or WebP")
        return media_type, image.width, image.height


def decode_rgb(data: bytes) -> np.ndarray:
    """Image bytes decoded to RGB, uint8 ``[height, width, 3]`` (what a vision model's processor takes);
    ``ValueError`` as :func:`image_info`."""
    with _pillow_image(data) as image:
        return np.asarray(image.convert("RGB"))


class ImageStore:
    """A directory of images by content hash (see the module docstring). Writes are atomic: a
    reader never sees a half-written file, and two writers of the same image are harmless."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)
        os.makedirs(self.root, exist_ok=True)

    @classmethod
    def temporary(cls, prefix: str = "orchard-images-") -> ImageStore:
        """A store in a fresh temporary directory that is removed with the store (when it is collected,
        or when the interpreter exits): for images no one keeps after the objects that hold them."""
        store = cls(tempfile.mkdtemp(prefix=prefix))
        weakref.finalize(store, shutil.rmtree, store.root, ignore_errors=True)
        return store

    def path(self, ref: ImageRef) -> str:
        return os.path.join(self.root, ref.sha256[:2], f"{ref.sha256}.{MEDIA_EXTENSIONS[ref.media_type]}")

    def find(self, sha256: str) -> str | None:
        """The stored file of the image with this hash, whatever its type (``None``: not here)."""
        for extension in MEDIA_EXTENSIONS.values():
            path = os.path.join(self.root, sha256[:2], f"{sha256}.{extension}")
            if os.path.exists(path):
                return path
        return None

    def put_png(self, data: bytes) -> ImageRef:
        """Store a PNG (its size read from the header alone: the screenshot path decodes nothing)."""
        width, height = png_size(data)
        return self._put(data, ImageRef(sha256=hashlib.sha256(data).hexdigest(), width=width, height=height))

    def put(self, data: bytes) -> ImageRef:
        """Store PNG, JPEG or WebP bytes as they are (``ValueError`` for anything else, see :func:`image_info`)."""
        media_type, width, height = image_info(data)
        return self._put(data, ImageRef(sha256=hashlib.sha256(data).hexdigest(), media_type=media_type,
                                        width=width, height=height))

    def _put(self, data: bytes, ref: ImageRef) -> ImageRef:
        target = self.path(ref)
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".part-")
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, target)
        return ref

    def pixels(self, ref: ImageRef) -> np.ndarray:
        """The image decoded to RGB, uint8 ``[height, width, 3]`` (:func:`decode_rgb`)."""
        return decode_rgb(self.read(ref))

    def read(self, ref: ImageRef) -> bytes:
        """The image's bytes, checked against its hash."""
        with open(self.path(ref), "rb") as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ValueError(f"image {self.path(ref)} does not match its hash (changed on disk)")
        return data


class _HasImages(Protocol):
    images: list[ImageRef]


def recent_images(messages: Sequence[_HasImages], k: int | None) -> set[int]:
    """The indices of the messages whose images stay in the context: the last ``k`` messages that
    carry any (``None``: all of them; ``0``: none)."""
    carrying = [index for index, message in enumerate(messages) if message.images]
    if k is None:
        return set(carrying)
    return set(carrying[len(carrying) - k:]) if k > 0 else set()
