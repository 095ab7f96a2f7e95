"""Isolation of the local backend, checked from inside real sandboxes."""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest

from orchard.env import PathOutsideSandbox
from orchard.env.api import SandboxSpec
from orchard.env.backends.base import BackendError
from orchard.env.backends.local import LocalBackend


def test_host_processes_are_invisible(sandbox):
    result = sandbox.exec("ps -eo pid,comm --no-headers").check()
    commands = [line.split()[1] for line in result.stdout.splitlines()]
    assert "python" in commands[0] and len(commands) <= 3  # the agent (PID 1), sh and ps
    assert all(int(line.split()[0]) < 100 for line in result.stdout.splitlines())
    assert str(os.getpid()) not in sandbox.exec("ls /proc").stdout.split()


def test_host_secrets_are_invisible(orchestrator, client):
    marker = secrets.token_hex(8)
    home_secret = f"/root/orchard-secret-{marker}"
    state_secret = os.path.join(orchestrator.state_dir, f"secret-{marker}")
    for path in (home_secret, state_secret):
        with open(path, "w") as handle:
            handle.write(marker)
    try:
        with client.create() as sb:
            assert not sb.exec(f"cat {home_secret}").ok
            assert not sb.exec(f"cat {state_secret}").ok
            assert sb.exec(f"ls -A {orchestrator.state_dir} 2>/dev/null | wc -l").stdout.strip() == "0"
            found = sb.exec(f"grep -rl {marker} /root /home /tmp /run 2>/dev/null; "
                            f"grep -l {orchestrator.api_key} /proc/*/environ 2>/dev/null; env").stdout
            assert marker not in found and orchestrator.api_key not in found
            assert "ORCHARD" not in found
    finally:
        for path in (home_secret, state_secret):
            os.unlink(path)


def test_host_files_cannot_be_changed(sandbox):
    marker = secrets.token_hex(8)
    result = sandbox.exec(f"echo pwned > /etc/orchard-{marker} && rm -f /usr/bin/patch && cat /etc/orchard-{marker}")
    assert result.check().stdout == "pwned\n"  # the sandbox's own writable layer
    assert not os.path.exists(f"/etc/orchard-{marker}")
    assert os.path.exists("/usr/bin/patch")


def test_no_network_in_none_mode(sandbox, orchestrator):
    port = orchestrator.base_url.rsplit(":", 1)[1]
    links = sandbox.exec("ls /sys/class/net").stdout.split()
    assert links == ["lo"]
    probe = sandbox.exec(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"")
    assert probe.exit_code != 0 and "ConnectionRefused" in probe.stderr


def test_host_network_mode_reaches_local_servers(client, orchestrator):
    with client.create(network="host") as sb:
        probe = sb.exec(f"python3 -c \"import urllib.request as u; print(u.urlopen('{orchestrator.base_url}/health').status)\"")
        assert probe.check().stdout.strip() == "200"


def test_sandboxes_cannot_see_each_other(client):
    marker = secrets.token_hex(8)
    with client.create() as first, client.create() as second:
        first.write_file(f"/workspace/{marker}", b"private")
        first.exec(f"echo private > /tmp/{marker}").check()
        assert second.exec("ls /workspace /tmp").stdout.count(marker) == 0
        found = second.exec(f"find / -xdev -name '{marker}' 2>/dev/null").stdout
        assert marker not in found


def test_refused_file_operations_are_client_errors(sandbox):
    from orchard.env.client import PermissionDenied

    with pytest.raises(PermissionDenied):
        sandbox.remove("/proc")  # a mount point: EBUSY inside the sandbox
    with pytest.raises(PermissionDenied):
        sandbox.write_file("/sys/orchard.txt", b"x")  # read-only sysfs: EROFS


def test_capabilities_are_dropped(sandbox):
    assert not sandbox.exec("mount -t tmpfs none /mnt").ok
    assert not sandbox.exec("mknod /tmp/disk b 8 0").ok
    assert sandbox.exec("touch /tmp/owned && chown 1000:1000 /tmp/owned").ok  # ordinary root work still fine


def test_fork_bomb_is_stopped_by_the_pids_limit(client):
    with client.create(pids=64) as sb:
        bomb = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 1000", timeout=3)
        assert bomb.timed_out
        assert "fork" in bomb.stderr.lower()  # forks were refused
        assert sb.exec("echo alive").check().stdout == "alive\n"


def test_memory_hog_is_killed_but_the_agent_survives(client):
    with client.create(memory="128Mi") as sb:
        hog = sb.exec("python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'", timeout=60)
        assert hog.exit_code in (-9, 137) and hog.stdout == ""
        assert sb.exec("echo alive").check().stdout == "alive\n"


def test_isolation_none_confines_the_file_api(client):
    with client.create(isolation="none") as sb:
        sb.write_file("/workspace/a.txt", b"hello")
        assert sb.exec("cat a.txt").check().stdout == "hello"
        with pytest.raises(PathOutsideSandbox):
            sb.read_file("/../../../../etc/passwd")
        sb.exec("ln -s /etc link").check()
        with pytest.raises(PathOutsideSandbox):
            sb.read_file("/workspace/link/passwd")


def test_without_root_or_user_namespaces_isolation_is_refused(tmp_path):
    backend = LocalBackend(str(tmp_path / "state"))
    backend.rootful, backend._userns = False, False
    with pytest.raises(BackendError) as error:
        asyncio.run(backend.create("abc", SandboxSpec()))
    assert error.value.code == "isolation_unavailable" and "isolation='none'" in error.value.detail
