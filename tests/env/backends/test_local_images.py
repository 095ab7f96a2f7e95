"""Image sandboxes on the local backend: a busybox-static image with no libc and no Python runs the
injected agent bundle, keeps the image's environment, working directory and user, and shares its
unpacked layers between sandboxes; bad images get clear errors and leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator

import pytest

from orchard.env import LocalServer, SandboxClient, local_server
from orchard.env.api import TOOLS_BIN
from orchard.env.bundle import MOUNT, elf_interpreter
from orchard.env.client import ImageInvalid, ImageNotFound, InvalidRequest, IsolationUnavailable
from tests.conftest import require_root
from tests.env.imagekit import busybox_image, docker_archive, layer, oci_layout


@pytest.fixture(scope="session")
def agent_bundle(tmp_path_factory) -> str:
    """``orchard env bundle``, run as a user would (about 30 s)."""
    out = str(tmp_path_factory.mktemp("bundle") / "agent")
    subprocess.run([sys.executable, "-m", "orchard.cli", "env", "bundle", "--out", out], check=True,
                   capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("images")
    busybox_image(directory / "busybox.tar")
    # The same root as an OCI layout, with no USER (root) and no WORKDIR.
    (directory / "layout").mkdir()
    with tarfile.open(directory / "busybox.tar") as tar:
        rootfs_layer = tar.extractfile("0/layer.tar").read()
    oci_layout(directory / "layout", [rootfs_layer], {"architecture": "amd64", "os": "linux",
                                                       "config": {"Env": ["PATH=/bin"]}})
    (directory / "corrupt.tar").write_bytes(b"this is not a tarball")
    docker_archive(directory / "escape.tar", [layer(("../../outside", "file", b"x"))])
    return str(directory)


@pytest.fixture(scope="module")
def server(images: str, agent_bundle: str) -> Iterator[LocalServer]:
    require_root()
    with local_server(images_dir=images, agent_bundle=agent_bundle, reap_interval=0.2) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[SandboxClient]:
    with server.client() as sandbox_client:
        yield sandbox_client


def test_the_bundle_carries_its_own_loader_and_libraries(agent_bundle):
    with open(os.path.join(agent_bundle, "manifest.json")) as handle:
        manifest = json.load(handle)
    lib = os.listdir(os.path.join(agent_bundle, "lib"))
    assert manifest["loader"] in lib and "libc.so.6" in lib
    for program in ("agent/orchard-agent", "bin/setpriv"):
        assert elf_interpreter(os.path.join(agent_bundle, program)) == f"{MOUNT}/lib/{manifest['loader']}"


def test_a_busybox_image_without_libc_or_python_runs_the_agent(client, server):
    with client.create(image="busybox.tar") as sandbox:
        caches = os.listdir(os.path.join(server.state_dir, "image-cache"))
        rootfs = os.path.join(server.state_dir, "image-cache", caches[0], "rootfs")
        names = {name for _, _, files in os.walk(rootfs) for name in files}
        assert "busybox" in names and not any(n.startswith(("libc.so", "ld-linux", "python")) for n in names)
        assert sandbox.exec("ls /lib /usr/lib /usr/bin/python3").exit_code != 0

        # The image's user, working directory and environment; nothing of the agent's own.
        assert sandbox.exec("id -u; id -g; pwd").stdout.split() == ["1000", "1000", "/home/app"]
        env = dict(line.split("=", 1) for line in sandbox.exec("env").stdout.splitlines() if "=" in line)
        assert env["GREETING"] == "from the image" and env["PATH"] == f"{TOOLS_BIN}:/usr/bin:/bin"
        assert env["HOME"] == "/home/app"
        assert not [k for k in env if k.startswith(("LD_", "_PYI", "ORCHARD")) or k == "OLDPWD"], env

        # Files and exec, the hot path, work as in any sandbox.
        sandbox.write_file("notes.txt", b"written by the file API\n")
        assert sandbox.exec("cat notes.txt; echo made > mine; cat mine").stdout == "written by the file API\nmade\n"
        assert sandbox.read_file("/home/app/mine") == b"made\n"
        # The bundle is read-only, and the image's user cannot touch the system.
        assert sandbox.exec(f"touch {MOUNT}/x").exit_code != 0
        assert sandbox.exec("touch /bin/x").exit_code != 0
        # ... but owns the tools directory, first on its PATH.
        tool = f"printf '#!/bin/sh\\necho a tool\\n' > {TOOLS_BIN}/mytool && chmod 755 {TOOLS_BIN}/mytool && mytool"
        assert sandbox.exec(tool).stdout == "a tool\n"


def test_sandboxes_of_one_image_share_its_layers_not_their_writes(client, server):
    with client.create(image="layout") as first, client.create(image="layout") as second:
        assert first.exec("id -u; pwd").stdout.split() == ["0", "/"]  # no USER, no WORKDIR: root in /
        first.exec("echo one > /etc/motd && rm /bin/ls").check()
        assert second.exec("cat /etc/motd").exit_code != 0
        assert second.exec("ls /").exit_code == 0
        # Each root is an overlay whose lower layer is the one cached copy of the image.
        lowers = [[m.split("lowerdir=")[1].split(",")[0] for m in sandbox.exec("cat /proc/mounts").stdout.splitlines()
                   if m.startswith("overlay / ")] for sandbox in (first, second)]
        assert lowers[0] == lowers[1] and len(lowers[0]) == 1
        assert lowers[0][0].startswith(os.path.join(server.state_dir, "image-cache"))


def test_the_spec_overrides_the_images_workdir_and_environment(client):
    with client.create(image="busybox.tar", workdir="/srv/task", env={"GREETING": "from the spec"}) as sandbox:
        assert sandbox.exec("pwd; echo $GREETING").stdout.split("\n")[:2] == ["/srv/task", "from the spec"]


def test_bad_images_get_clear_errors_and_leave_nothing(client, server):
    before = {info.id for info in client.list()}
    with pytest.raises(ImageNotFound, match=r"busybox\.tar"):  # the message lists what is offered
        client.create(image="missing.tar")
    with pytest.raises(ImageInvalid, match=r"corrupt\.tar"):
        client.create(image="corrupt.tar")
    with pytest.raises(ImageInvalid, match=r"\.\."):
        client.create(image="escape.tar")
    with pytest.raises(InvalidRequest):
        client.create(image="../etc")
    with pytest.raises(ImageNotFound):  # a registry reference is for the Kubernetes backend
        client.create(image="images/busybox.tar")
    assert {info.id for info in client.list()} == before
    assert not os.path.exists(os.path.join(os.path.dirname(server.state_dir), "outside"))


def test_an_orchestrator_without_the_bundle_says_how_to_build_it(images):
    require_root()
    with (local_server(images_dir=images) as no_bundle, no_bundle.client() as plain,
          pytest.raises(IsolationUnavailable, match="orchard env bundle")):
        plain.create(image="busybox.tar")


def test_forks_of_an_image_sandbox_keep_its_user_workdir_and_env(client):
    with client.create(image="busybox.tar") as source:
        source.exec("echo prepared > state").check()
        forks = source.fork(2)
        try:
            for fork in forks:
                out = fork.exec("id -u; pwd; echo $GREETING; cat state").stdout
                assert out.split("\n")[:4] == ["1000", "/home/app", "from the image", "prepared"]
        finally:
            for fork in forks:
                fork.delete()
