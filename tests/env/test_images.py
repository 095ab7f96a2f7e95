"""OCI images: docker-archive and OCI layouts unpacked with whiteouts, cached, and hostile layers refused."""

from __future__ import annotations

import gzip
import os
import tarfile

import pytest

from orchard.env.images import ImageError, ImageUser, resolve_user, unpack_image
from tests.env.imagekit import docker_archive, layer, oci_layout

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


def test_resolve_user_reads_the_images_own_passwd_and_group(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:App:/home/app:/bin/sh\n")
    (tmp_path / "etc" / "group").write_text("root:x:0:\nstaff:x:50:app\n")
    root = str(tmp_path)
    assert resolve_user(root, "") == ImageUser(0, 0, "/root")
    assert resolve_user(root, "app") == ImageUser(1000, 1001, "/home/app")
    assert resolve_user(root, "1000") == ImageUser(1000, 1001, "/home/app")
    assert resolve_user(root, "app:staff") == ImageUser(1000, 50, "/home/app")
    assert resolve_user(root, "4242:77") == ImageUser(4242, 77, "/")  # numeric ids need no entry
    with pytest.raises(ImageError, match="'ghost' is not in its /etc/passwd"):
        resolve_user(root, "ghost")
    with pytest.raises(ImageError, match="'wheel' is not in its /etc/group"):
        resolve_user(root, "app:wheel")


def test_resolve_user_never_follows_a_symlink_out_of_the_root(tmp_path):
    outside = tmp_path / "host-passwd"
    outside.write_text("app:x:0:0:host root:/root:/bin/sh\n")
    (tmp_path / "root" / "etc").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "passwd").symlink_to(outside)
    with pytest.raises(ImageError, match="not in its /etc/passwd"):
        resolve_user(str(tmp_path / "root"), "app")
