"""OCI images on disk: read a ``docker save`` / ``podman save`` tarball or an OCI layout, and unpack
its layers into a cached, read-only root filesystem keyed by digest.

Two input forms:

* a **docker-archive** tarball (``docker save``, ``podman save``): ``manifest.json`` names the
  config and the layer tarballs (plain or gzip);
* an **OCI image layout** (``oci-layout`` + ``index.json`` + ``blobs/sha256/``), as a directory or
  a tarball of one (``podman save --format oci-archive``, ``skopeo copy oci:``). Blobs are checked
  against their digests.

Layers are applied in order with the OCI whiteout rules: ``.wh.NAME`` deletes ``NAME`` from the
layers below, ``.wh..wh..opq`` empties its directory first. Extraction is done member by member,
and a member is refused (the whole image fails with :class:`ImageError`) if its path is absolute,
has a ``..`` component, or would be written through a symlink that an earlier member placed, and
if a hard link points outside the root. Device nodes are skipped (sandboxes get their own
``/dev``); ownership is kept when running as root; set-uid bits are dropped.

The root filesystem lands in ``<cache>/<config digest>/rootfs`` and is written once: a second
unpack of the same image (or of another image with the same config) returns the cached copy, and
several sandboxes share it as the lower layer of their own overlay.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

OPAQUE = ".wh..wh..opq"
WHITEOUT = ".wh."


class ImageError(ValueError):
    """An image that cannot be used: unreadable, corrupt, or with a layer that escapes its root."""


@dataclass(frozen=True)
class ImageConfig:
    """What a sandbox keeps from the image's config: environment, working directory, user, entry."""

    digest: str
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


@dataclass
class Image:
    config: ImageConfig
    layers: list[str]  # layer blobs, in order: digests (OCI layout) or paths (docker-archive)
    source: str


class _Blobs:
    """Blob access for a directory or a tarball, by path inside it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tar: tarfile.TarFile | None = None
        if os.path.isfile(path):
            try:
                self.tar = tarfile.open(path)  # noqa: SIM115 (closed by close())
            except (tarfile.TarError, OSError) as exc:
                raise ImageError(f"{path}: not a readable image tarball ({exc})") from exc
        elif not os.path.isdir(path):
            raise ImageError(f"{path}: no such image (expected a tarball or an OCI layout directory)")

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()

    def exists(self, name: str) -> bool:
        if self.tar is not None:
            try:
                self.tar.getmember(name)
                return True
            except KeyError:
                return False
        return os.path.isfile(os.path.join(self.path, name))

    def open(self, name: str) -> IO[bytes]:
        if os.path.isabs(name) or ".." in name.split("/"):
            raise ImageError(f"{self.path}: blob path {name!r} escapes the image")
        try:
            if self.tar is not None:
                handle = self.tar.extractfile(name)
                if handle is None:
                    raise KeyError(name)
                return handle
            return open(os.path.join(self.path, name), "rb")
        except (KeyError, FileNotFoundError) as exc:
            raise ImageError(f"{self.path}: the image names {name!r}, which it does not contain") from exc

    def json(self, name: str) -> dict:
        try:
            with self.open(name) as handle:
                return json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ImageError(f"{self.path}: {name} is not valid JSON ({exc})") from exc


def _config(raw: dict, digest: str) -> ImageConfig:
    inner = raw.get("config") or raw.get("Config") or {}
    env = {}
    for item in inner.get("Env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    return ImageConfig(digest=digest, env=env, workdir=inner.get("WorkingDir") or "/", user=inner.get("User") or "",
                       entrypoint=tuple(inner.get("Entrypoint") or ()), cmd=tuple(inner.get("Cmd") or ()))


def _digest_path(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    if algorithm != "sha256" or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
        raise ImageError(f"unsupported or malformed digest {digest!r}")
    return f"blobs/sha256/{value}"


def _verified(blobs: _Blobs, digest: str) -> bytes:
    with blobs.open(_digest_path(digest)) as handle:
        data = handle.read()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ImageError(f"{blobs.path}: blob {digest} does not match its digest (corrupt image)")
    return data


def load_image(path: str) -> tuple[Image, _Blobs]:
    """Read an image's manifest and config from a docker-archive or an OCI layout (dir or tar)."""
    blobs = _Blobs(path)
    try:
        return _load(blobs, path), blobs
    except BaseException:
        blobs.close()
        raise


def _load(blobs: _Blobs, path: str) -> Image:
    try:
        return _read_manifest(blobs, path)
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ImageError(f"{path}: malformed manifest or index ({type(exc).__name__}: {exc})") from exc


def _read_manifest(blobs: _Blobs, path: str) -> Image:
    if blobs.exists("index.json"):
        index = blobs.json("index.json")
        manifests = index.get("manifests") or []
        if not manifests:
            raise ImageError(f"{path}: index.json lists no manifest")
        manifest = json.loads(_verified(blobs, manifests[0]["digest"]))
        if "manifests" in manifest:  # an index of platforms: take the first
            manifest = json.loads(_verified(blobs, manifest["manifests"][0]["digest"]))
        config_digest = manifest["config"]["digest"]
        config = _config(json.loads(_verified(blobs, config_digest)), config_digest)
        layers = [layer["digest"] for layer in manifest.get("layers", [])]
        return Image(config, layers, path)
    if blobs.exists("manifest.json"):
        entries = blobs.json("manifest.json")
        if not isinstance(entries, list) or not entries or "Layers" not in entries[0]:
            raise ImageError(f"{path}: manifest.json is not a docker-archive manifest")
        entry = entries[0]
        with blobs.open(entry["Config"]) as handle:
            raw = handle.read()
        config = _config(json.loads(raw), "sha256:" + hashlib.sha256(raw).hexdigest())
        return Image(config, list(entry["Layers"]), path)
    raise ImageError(f"{path}: neither an OCI layout (index.json) nor a docker-archive (manifest.json)")


def _open_layer(blobs: _Blobs, layer: str) -> tarfile.TarFile:
    data = _verified(blobs, layer) if layer.startswith("sha256:") else blobs.open(layer).read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ImageError(f"layer {layer}: corrupt gzip ({exc})") from exc
    try:
        return tarfile.open(fileobj=io.BytesIO(data))
    except tarfile.TarError as exc:
        raise ImageError(f"layer {layer}: not a tar archive ({exc})") from exc


def _safe_parts(name: str, layer: str) -> list[str]:
    name = name.removeprefix("./")
    if name.startswith("/") or name == "..":
        raise ImageError(f"layer {layer}: member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"layer {layer}: member {name!r} escapes the root with '..'")
    return parts


def _check_no_symlink(root: str, parts: list[str], layer: str, name: str) -> None:
    """No directory on the way to a member may be a symlink: writing through one could land
    anywhere on the host."""
    current = root
    for part in parts[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise ImageError(f"layer {layer}: member {name!r} would be written through the symlink "
                             f"{os.path.relpath(current, root)!r}")


def _remove(path: str) -> None:
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    else:
        shutil.rmtree(path)


def _members(tar: tarfile.TarFile, layer: str) -> Iterator[tarfile.TarInfo]:
    try:
        yield from tar
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ImageError(f"layer {layer}: truncated or corrupt ({exc})") from exc


def apply_layer(tar: tarfile.TarFile, root: str, layer: str = "layer") -> None:
    """Apply one layer onto ``root``: whiteouts first within each directory's members, then files."""
    is_root = os.geteuid() == 0
    for member in _members(tar, layer):
        parts = _safe_parts(member.name, layer)
        if not parts:
            continue
        _check_no_symlink(root, parts, layer, member.name)
        base = parts[-1]
        parent = os.path.join(root, *parts[:-1])
        if base == OPAQUE:
            if os.path.isdir(parent):
                for child in os.listdir(parent):
                    _remove(os.path.join(parent, child))
            continue
        if base.startswith(WHITEOUT):
            _remove(os.path.join(parent, base[len(WHITEOUT):]))
            continue
        target = os.path.join(parent, base)
        os.makedirs(parent, exist_ok=True)
        if member.isdir():
            if os.path.lexists(target) and not os.path.isdir(target):
                _remove(target)
            os.makedirs(target, exist_ok=True)
        elif member.issym():
            if os.path.lexists(target):
                _remove(target)
            os.symlink(member.linkname, target)
        elif member.islnk():
            source_parts = _safe_parts(member.linkname, layer)
            _check_no_symlink(root, [*source_parts, "x"], layer, member.linkname)
            source = os.path.join(root, *source_parts)
            if os.path.islink(source) or not os.path.isfile(source):
                raise ImageError(f"layer {layer}: hard link {member.name!r} -> {member.linkname!r} has no target "
                                 "inside the image")
            if os.path.lexists(target):
                _remove(target)
            os.link(source, target)
        elif member.isfile():
            if os.path.lexists(target):
                _remove(target)
            with tar.extractfile(member) as data, open(target, "wb") as out:  # type: ignore[union-attr]
                shutil.copyfileobj(data, out)
        else:
            continue  # devices and fifos: the sandbox brings its own /dev
        if not member.issym():
            os.chmod(target, stat.S_IMODE(member.mode) & ~(stat.S_ISUID | stat.S_ISGID))
        if is_root:
            os.lchown(target, member.uid, member.gid)


def unpack_image(path: str, cache_dir: str) -> tuple[str, ImageConfig]:
    """The cached root filesystem of the image at ``path`` (unpacked on first use) and its config."""
    image, blobs = load_image(path)
    try:
        return _unpack(image, blobs, cache_dir)
    finally:
        blobs.close()


def _unpack(image: Image, blobs: _Blobs, cache_dir: str) -> tuple[str, ImageConfig]:
    key = image.config.digest.removeprefix("sha256:")
    final = os.path.join(cache_dir, key)
    rootfs = os.path.join(final, "rootfs")
    if os.path.isdir(rootfs):
        return rootfs, image.config
    os.makedirs(cache_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=cache_dir)
    try:
        os.makedirs(os.path.join(staging, "rootfs"))
        for layer in image.layers:
            with _open_layer(blobs, layer) as tar:
                apply_layer(tar, os.path.join(staging, "rootfs"), layer)
        with open(os.path.join(staging, "config.json"), "w") as handle:
            json.dump(image.config.__dict__, handle)
        try:
            os.rename(staging, final)  # atomic: a concurrent unpack of the same image loses the race
        except OSError:
            if not os.path.isdir(rootfs):
                raise
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return rootfs, image.config


@dataclass(frozen=True)
class ImageUser:
    uid: int
    gid: int
    home: str


def _read_inside(rootfs: str, path: str) -> str:
    """A text file of the root filesystem, or "" if absent or if it resolves outside the root (a
    symlink of the image is never followed out of it)."""
    full = os.path.realpath(os.path.join(rootfs, path.lstrip("/")))
    if not full.startswith(os.path.realpath(rootfs) + os.sep) or not os.path.isfile(full):
        return ""
    with open(full, errors="replace") as handle:
        return handle.read()


def resolve_user(rootfs: str, user: str) -> ImageUser:
    """The numeric user that an image's ``USER`` (``name``, ``uid``, ``name:group``, ``uid:gid``)
    names, looked up in the image's own ``/etc/passwd`` and ``/etc/group``, as Docker does. An empty
    ``USER`` is root."""
    name, _, group = (user or "0").partition(":")
    passwd = [line.split(":") for line in _read_inside(rootfs, "/etc/passwd").splitlines() if line.count(":") >= 6]
    entry = next((e for e in passwd if e[0] == name or (name.isdigit() and e[2] == name)), None)
    if entry is None and not name.isdigit():
        raise ImageError(f"the image's user {name!r} is not in its /etc/passwd")
    uid = int(entry[2]) if entry else int(name)
    gid = int(entry[3]) if entry else uid
    home = entry[5] if entry else ("/root" if uid == 0 else "/")
    if group:
        groups = [line.split(":") for line in _read_inside(rootfs, "/etc/group").splitlines() if line.count(":") >= 3]
        match = next((g for g in groups if g[0] == group), None)
        if match is None and not group.isdigit():
            raise ImageError(f"the image's group {group!r} is not in its /etc/group")
        gid = int(match[2]) if match else int(group)
    return ImageUser(uid, gid, home or "/")
