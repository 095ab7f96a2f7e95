"""OCI images: docker-archive and OCI layouts unpacked with whiteouts, cached, and hostile layers refused."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile

import pytest

from orchard.env.images import ImageError, unpack_image

CONFIG = {"architecture": "amd64", "os": "linux",
          "config": {"Env": ["PATH=/bin", "GREETING=hi=there"], "WorkingDir": "/work", "User": "1000:1000",
                     "Cmd": ["sh"]}}


def layer(*members: tuple, compress: bool = False) -> bytes:
    """A layer tarball from (name, kind, payload) members: kind is file, dir, symlink or link."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.mode = 0o755 if kind == "dir" else 0o644
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "link": tarfile.LNKTYPE}[kind]
            info.linkname = payload or ""
            tar.addfile(info)
    data = buffer.getvalue()
    return gzip.compress(data) if compress else data


def docker_archive(path, layers: list[bytes], config: dict = CONFIG) -> str:
    with tarfile.open(path, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        names = [f"{i}/layer.tar" for i in range(len(layers))]
        for name, data in zip(names, layers, strict=True):
            add(name, data)
        add("config.json", json.dumps(config).encode())
        add("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": ["t:1"], "Layers": names}]).encode())
    return str(path)


def oci_layout(directory, layers: list[bytes], config: dict = CONFIG) -> str:
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    manifest = {"schemaVersion": 2, "config": blob(json.dumps(config).encode()),
                "layers": [blob(data) for data in layers]}
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2,
                                                      "manifests": [blob(json.dumps(manifest).encode())]}))
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return str(directory)


BASE = layer(("bin", "dir", None), ("bin/tool", "file", b"#!/bin/sh\n"), ("etc", "dir", None),
             ("etc/keep", "file", b"keep"), ("etc/old", "file", b"old"), ("cache", "dir", None),
             ("cache/a", "file", b"a"), ("cache/b", "file", b"b"), ("bin/sh", "symlink", "tool"),
             ("bin/hard", "link", "bin/tool"))
TOP = layer(("etc/.wh.old", "file", b""), ("cache/.wh..wh..opq", "file", b""), ("cache/c", "file", b"c"),
            ("etc/new", "file", b"new"), compress=True)


@pytest.mark.parametrize("form", ["docker", "oci"])
def test_layers_apply_in_order_with_whiteouts(tmp_path, form):
    source = docker_archive(tmp_path / "img.tar", [BASE, TOP]) if form == "docker" else oci_layout(
        tmp_path / "img", [BASE, TOP])
    rootfs, config = unpack_image(source, str(tmp_path / "cache"))
    tree = sorted(os.path.relpath(os.path.join(d, f), rootfs) for d, _, files in os.walk(rootfs) for f in files)
    assert tree == ["bin/hard", "bin/sh", "bin/tool", "cache/c", "etc/keep", "etc/new"]  # old deleted, cache emptied
    assert os.readlink(os.path.join(rootfs, "bin/sh")) == "tool"
    assert os.stat(os.path.join(rootfs, "bin/hard")).st_ino == os.stat(os.path.join(rootfs, "bin/tool")).st_ino
    assert config.env == {"PATH": "/bin", "GREETING": "hi=there"} and config.workdir == "/work"
    assert config.user == "1000:1000" and config.cmd == ("sh",)


def test_an_image_is_unpacked_once_and_shared(tmp_path):
    source = docker_archive(tmp_path / "img.tar", [BASE])
    first, _ = unpack_image(source, str(tmp_path / "cache"))
    marker = os.path.join(first, "etc", "keep")
    mtime = os.stat(marker).st_mtime_ns
    again, _ = unpack_image(oci_layout(tmp_path / "same", [BASE]), str(tmp_path / "cache"))
    assert again == first and os.stat(marker).st_mtime_ns == mtime  # same config digest: the cached copy
    assert os.listdir(tmp_path / "cache") == [os.path.basename(os.path.dirname(first))]  # no staging left behind


@pytest.mark.parametrize("member, message", [
    (("../escape", "file", b"x"), "escapes the root"),
    (("/etc/passwd", "file", b"x"), "absolute path"),
    (("a/../../x", "file", b"x"), "escapes the root"),
])
def test_members_that_escape_the_root_are_refused(tmp_path, member, message):
    source = docker_archive(tmp_path / "img.tar", [layer(member)])
    with pytest.raises(ImageError, match=message):
        unpack_image(source, str(tmp_path / "cache"))
    assert not os.path.exists(tmp_path / "escape") and os.listdir(tmp_path / "cache") == []


def test_writing_through_a_symlink_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    hostile = layer(("link", "symlink", str(outside)), ("link/owned", "file", b"x"))
    with pytest.raises(ImageError, match="through the symlink"):
        unpack_image(docker_archive(tmp_path / "img.tar", [hostile]), str(tmp_path / "cache"))
    assert os.listdir(outside) == []
    # The same trick across layers: the symlink in one, the write in the next.
    split = [layer(("link", "symlink", str(outside))), layer(("link/owned", "file", b"x"))]
    with pytest.raises(ImageError, match="through the symlink"):
        unpack_image(docker_archive(tmp_path / "img2.tar", split), str(tmp_path / "cache"))
    assert os.listdir(outside) == []
    hard = layer(("stolen", "link", "../../etc/passwd"))
    with pytest.raises(ImageError, match="escapes the root"):
        unpack_image(docker_archive(tmp_path / "img3.tar", [hard]), str(tmp_path / "cache"))


def test_corrupt_and_unknown_images_get_clear_errors(tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(ImageError, match="no such image"):
        unpack_image(str(tmp_path / "missing.tar"), cache)
    (tmp_path / "junk.tar").write_bytes(b"this is not a tarball at all" * 100)
    with pytest.raises(ImageError, match="not a readable image tarball"):
        unpack_image(str(tmp_path / "junk.tar"), cache)
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    with pytest.raises(ImageError, match="neither an OCI layout"):
        unpack_image(str(empty), cache)
    layout = oci_layout(tmp_path / "oci", [BASE])
    [blob] = [p for p in (tmp_path / "oci" / "blobs" / "sha256").iterdir() if p.read_bytes() == BASE]
    blob.write_bytes(BASE[:-10] + b"0123456789")  # bit rot in a layer
    with pytest.raises(ImageError, match="does not match its digest"):
        unpack_image(layout, cache)
    truncated = docker_archive(tmp_path / "trunc.tar", [gzip.compress(BASE)[:40]])
    with pytest.raises(ImageError, match=r"corrupt gzip|truncated or corrupt|not a tar"):
        unpack_image(truncated, cache)
    (tmp_path / "bad-index").mkdir()
    (tmp_path / "bad-index" / "index.json").write_text('{"manifests": [{"size": 3}]}')
    with pytest.raises(ImageError, match="malformed manifest"):
        unpack_image(str(tmp_path / "bad-index"), cache)
    assert [n for n in os.listdir(cache) if not n.startswith(".")] == []  # nothing half-unpacked is cached
