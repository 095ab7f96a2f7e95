"""Images by content hash: stored once, checked on read, and the context window over them."""

from __future__ import annotations

import gc
import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from orchard.data.images import MAX_PIXELS, ImageStore, decode_rgb, png_size, recent_images
from orchard.data.trajectory import Message


def png(color: tuple[int, int, int], size=(7, 5), kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=kind)
    return out.getvalue()


def test_any_supported_image_is_stored_with_its_type_and_found_by_hash(tmp_path):
    store = ImageStore(tmp_path)
    jpeg = store.put(png((0, 128, 0), (16, 8), "JPEG"))
    assert (jpeg.media_type, jpeg.width, jpeg.height) == ("image/jpeg", 16, 8)
    assert store.find(jpeg.sha256).endswith(".jpg") and store.find("0" * 64) is None
    assert store.pixels(jpeg).shape == (8, 16, 3) and abs(int(store.pixels(jpeg)[4, 8, 1]) - 128) < 8
    assert store.put(png((1, 2, 3))).media_type == "image/png"
    with pytest.raises(ValueError, match="unsupported image format 'GIF'"):
        store.put(png((1, 2, 3), kind="GIF"))
    with pytest.raises(ValueError, match="not a readable image"):
        store.put(png((1, 2, 3))[:40])  # truncated


def test_a_temporary_store_is_removed_with_the_store():
    store = ImageStore.temporary()
    root, ref = store.root, store.put(png((9, 9, 9)))
    assert os.path.basename(root).startswith("orchard-images-") and store.read(ref)
    del store
    gc.collect()
    assert not os.path.exists(root)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_a_decompression_bomb_is_refused_before_it_is_decoded():
    side = int(MAX_PIXELS**0.5) + 1
    rows = zlib.compress(b"\x00" * (1 + side) * 64)  # a few rows would do: the header alone must be refused
    bomb = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)) + \
        _chunk(b"IDAT", rows) + _chunk(b"IEND", b"")
    with pytest.raises(ValueError, match="pixels is more than"):
        decode_rgb(bomb)
    assert decode_rgb(png((9, 8, 7))).dtype == np.uint8


def test_an_image_is_stored_once_by_its_hash_and_checked_when_read(tmp_path):
    store = ImageStore(tmp_path)
    red = store.put_png(png((255, 0, 0)))
    assert store.put_png(png((255, 0, 0))) == red and (red.width, red.height) == (7, 5)
    assert store.read(red) == png((255, 0, 0))
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].name == f"{red.sha256}.png"
    files[0].write_bytes(png((0, 0, 255)))
    with pytest.raises(ValueError, match="does not match its hash"):
        store.read(red)
    with pytest.raises(ValueError, match="not a PNG"):
        store.put_png(b"GIF89a...")
    assert png_size(png((1, 2, 3), (31, 9))) == (31, 9)


def test_only_the_last_k_messages_with_images_stay_in_context(tmp_path):
    store = ImageStore(tmp_path)
    shot = store.put_png(png((0, 0, 0)))
    messages = [Message(role="system"), Message(role="user", images=[shot]), Message(role="assistant"),
                Message(role="user", images=[shot]), Message(role="tool"), Message(role="user", images=[shot])]
    assert recent_images(messages, 1) == {5}
    assert recent_images(messages, 2) == {3, 5}
    assert recent_images(messages, None) == {1, 3, 5}
    assert recent_images(messages, 0) == set()
    assert Message.model_validate_json(messages[1].model_dump_json()).images == [shot]
