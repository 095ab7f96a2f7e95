"""Images by content hash: stored once, checked on read, and the context window over them."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from orchard.data.images import ImageStore, png_size, recent_images
from orchard.data.trajectory import Message


def png(color: tuple[int, int, int], size=(7, 5)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


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
