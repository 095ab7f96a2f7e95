"""Build OCI images for tests: layers, docker-archive tarballs, OCI layouts, and a busybox-static image."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile

CONFIG = {"architecture": "amd64", "os": "linux",
          "config": {"Env": ["PATH=/bin", "GREETING=hi=there"], "WorkingDir": "/work", "User": "1000:1000",
                     "Cmd": ["sh"]}}


def layer(*members: tuple, compress: bool = False) -> bytes:
    """A layer tarball from (name, kind, payload[, owner uid]) members: kind is file, exe, dir, symlink
    or link."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, payload, *owner in members:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = owner[0] if owner else 0
            info.mode = 0o755 if kind in ("dir", "exe") else 0o644
            if kind in ("file", "exe"):
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


BUSYBOX_USER = {"Env": ["PATH=/usr/bin:/bin", "GREETING=from the image"], "WorkingDir": "/home/app",
                "User": "app"}


def busybox_image(path, config: dict | None = None) -> str:
    """A docker-archive image with Debian's static busybox and nothing else: no libc, no Python.
    Its default config runs commands as ``app`` (uid 1000) in ``/home/app``."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise RuntimeError("busybox is not installed (apt-get install busybox-static)")
    with open(busybox, "rb") as handle:
        binary = handle.read()
    listing = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    applets = [("bin/" + name, "symlink", "busybox") for name in listing if name != "busybox"]
    files = layer(("bin", "dir", None), ("bin/busybox", "exe", binary), *applets, ("etc", "dir", None),
                  ("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"),
                  ("etc/group", "file", b"root:x:0:\napp:x:1000:\n"), ("home", "dir", None),
                  ("home/app", "dir", None, 1000), ("root", "dir", None))
    image = {"architecture": "amd64", "os": "linux", "config": config or BUSYBOX_USER}
    return docker_archive(path, [files], image)
