"""Isolation of the local backend, checked from inside real sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile

import httpx
import pytest

from orchard.env import PathOutsideSandbox
from orchard.env.api import TOOLS_BIN, SandboxSpec
from orchard.env.backends.base import BackendError
from orchard.env.backends.local import LocalBackend
from orchard.env.client import Unsupported
from tests.conftest import require_root, wait_until


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


def test_a_tool_written_into_the_tools_directory_runs_by_name_and_stays_in_the_sandbox(sandbox):
    assert sandbox.exec("echo $PATH").stdout.split(":")[0] == TOOLS_BIN
    sandbox.write_file(f"{TOOLS_BIN}/orchard-test-tool", b"#!/bin/sh\necho from the tools directory\n", mode=0o755)
    assert sandbox.exec("orchard-test-tool").check().stdout == "from the tools directory\n"
    assert not os.path.exists(f"{TOOLS_BIN}/orchard-test-tool")  # the sandbox's own writable layer


def test_no_network_in_none_mode(sandbox, orchestrator):
    port = orchestrator.base_url.rsplit(":", 1)[1]
    links = sandbox.exec("ls /sys/class/net").stdout.split()
    assert links == ["lo"]
    probe = sandbox.exec(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"")
    assert probe.exit_code != 0 and "ConnectionRefused" in probe.stderr


def test_egress_filtering_is_refused_as_unsupported_here(client):
    before = {info.id for info in client.list()}
    for spec in ({"egress": ["10.0.0.0/8"]}, {"dns": True}):
        with pytest.raises(Unsupported, match="kubernetes backend"):
            client.create(**spec)
    assert {info.id for info in client.list()} == before


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


def test_fork_bomb_is_stopped_by_the_pids_limit(client, orchestrator):
    """A fork bomb in a sandbox of 64 pids is contained: the sandbox's pids cgroup refuses its forks and
    never holds more than 64 tasks, the command ends at its time-out with the whole bomb killed (it is the
    command's process group), the same sandbox runs the next command, and the host still starts processes.

    The bomb starts in a subshell, ``(bomb)``, so that the top-level shell has made its last fork before
    any bomb process exists; it then waits in ``exec sleep`` until the time-out. Started as ``bomb; ...``,
    the top-level shell forks both halves of the first pipeline itself: on a loaded machine the first
    half's descendants can take every pid before the second fork, and the shell exits 2 ("Cannot fork")
    at once, leaving behind a bomb that may hold all 64 pids and refuse the sandbox's next command (2 of 8
    runs beside three busy loops on 2 cores; this form: 8 of 8 timed out and cleaned up)."""
    cgroups = LocalBackend(orchestrator.state_dir).cgroups
    assert cgroups.available  # the limit is the cgroup's: RLIMIT_NPROC, the fallback, does not bind root
    with client.create(pids=64) as sb:
        paths = cgroups.paths(sb.id)
        limit = paths.get("pids", paths.get("unified"))  # cgroup v1's pids controller, or v2's one group

        def read(name: str) -> str:
            with open(os.path.join(limit, name)) as handle:
                return handle.read()

        assert read("pids.max").strip() == "64"
        bomb = sb.exec("bomb() { bomb | bomb & }; (bomb); exec sleep 1000", timeout=3)
        assert bomb.timed_out
        assert "fork" in bomb.stderr.lower()  # forks were refused ("Cannot fork", or bash's "fork: ...")
        assert int(dict(line.split() for line in read("pids.events").splitlines())["max"]) > 0  # by this limit
        if os.path.exists(os.path.join(limit, "pids.peak")):  # where the kernel keeps the high-water mark
            assert int(read("pids.peak")) <= 64
        assert sb.exec("echo alive").check().stdout == "alive\n"
    assert subprocess.run(["true"]).returncode == 0  # the host still forks


def test_memory_hog_is_killed_but_the_agent_survives(client):
    with client.create(memory="128Mi") as sb:
        hog = sb.exec("python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'", timeout=60)
        assert hog.exit_code in (-9, 137) and hog.stdout == ""
        assert sb.exec("echo alive").check().stdout == "alive\n"


def test_under_memory_pressure_commands_die_first_and_every_agent_survives(tmp_path):
    """Host-wide pressure, without endangering this machine: a memory limit on the cgroup that holds
    every sandbox of one orchestrator (the kernel picks the OOM victim by the same ``oom_score_adj``
    rule as for the whole host). Three sandboxes, each allowed 1 GiB, together ask for 750 MiB of a
    400 MiB parent: commands are killed until the rest fit, and no agent is."""
    require_root()
    from concurrent.futures import ThreadPoolExecutor

    from orchard.env.local import local_server

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    cgroups = LocalBackend(str(state_dir)).cgroups
    limit_file = ("memory.max" if cgroups.version == 2 else "memory.limit_in_bytes")
    base = next(iter(cgroups._bases().values()))
    os.makedirs(base, exist_ok=True)
    if cgroups.version == 2:
        with open(os.path.join(base, "cgroup.subtree_control"), "w") as handle:
            handle.write("+memory +pids +cpu")
    with open(os.path.join(base, limit_file), "w") as handle:
        handle.write(str(400 << 20))
    hog = ("python3 -c 'import time\nchunks = [bytearray(10 << 20) for _ in range(25)]\n"
           "time.sleep(3)\nprint(len(chunks))'")
    try:
        with local_server(state_dir=str(state_dir)) as server:
            client = server.client()
            sandboxes = [client.create(memory="1Gi") for _ in range(3)]
            # Commands are the OOM killer's first choice; the agent (their parent) is never raised,
            # and is lowered to -900 where root has CAP_SYS_RESOURCE (not on the CI machines).
            scores = [sb.exec("cat /proc/self/oom_score_adj /proc/$PPID/oom_score_adj").check().stdout.split()
                      for sb in sandboxes]
            assert all(command == "1000" and int(agent) <= 0 for command, agent in scores)
            agents = [sb.exec("echo $PPID").check().stdout for sb in sandboxes]
            with ThreadPoolExecutor(3) as pool:
                results = list(pool.map(lambda sb: sb.exec(hog, timeout=60), sandboxes))
            killed = [r for r in results if r.exit_code in (-9, 137)]
            assert 1 <= len(killed) <= 2 and all(r.exit_code == 0 for r in results if r not in killed)
            for sb in sandboxes:  # every agent answers, and none was restarted
                assert sb.exec("echo alive").check().stdout == "alive\n"
            assert [sb.exec("echo $PPID").check().stdout for sb in sandboxes] == agents
            for sb in sandboxes:
                sb.delete()
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(base)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_isolation_none_confines_the_file_api(client, orchestrator):
    with client.create(isolation="none") as sb:
        assert orchestrator.api_key not in sb.exec("env").stdout  # the orchestrator's secrets stay out
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


class DirectSandbox:
    """A sandbox made by a LocalBackend alone (no orchestrator), driven over its agent socket."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    async def start(self, spec: SandboxSpec) -> DirectSandbox:
        self.handle = await self.backend.create(secrets.token_hex(8), spec)
        socket_path = self.handle.agent_url.removeprefix("unix://")
        self.http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=socket_path), base_url="http://agent",
                                      headers={"Authorization": f"Bearer {self.handle.agent_token}"}, timeout=60)
        for _ in range(3000):
            try:
                if (await self.http.get("/health")).status_code == 200:
                    return self
            except httpx.TransportError:
                assert await self.backend.failure(self.handle) is None
            await asyncio.sleep(0.01)
        raise AssertionError("agent never became healthy")

    async def exec(self, command: str) -> dict:
        return (await self.http.post("/exec", json={"command": command, "timeout": 60})).json()

    async def close(self) -> None:
        await self.http.aclose()
        await self.backend.delete(self.handle)


@pytest.fixture
def short_state_dir():
    """A state dir with a short path, so that agent socket paths fit in sun_path for httpx."""
    path = tempfile.mkdtemp(prefix="orch-", dir="/tmp")
    yield path
    with open("/proc/mounts") as handle:
        left = [line.split()[1] for line in handle if line.split()[1].startswith(path + "/")]
    for mount_point in left:  # not left behind for the next run, and not passed over either
        subprocess.run(["umount", "-l", mount_point], check=False)
    shutil.rmtree(path, ignore_errors=True)
    assert not left, f"the backend's close left mounted: {left}"


@pytest.fixture
def rootless_backend(short_state_dir):
    """The user-namespace path, as a user without root would get it (run here as root)."""
    require_root()
    backend = LocalBackend(short_state_dir)
    backend.rootful, backend._userns = False, True
    yield backend
    asyncio.run(backend.close())


async def test_rootless_sandboxes_are_isolated(rootless_backend):
    secret = f"/root/orchard-rootless-{secrets.token_hex(6)}"
    with open(secret, "w") as handle:
        handle.write("secret")
    sb = await DirectSandbox(rootless_backend).start(SandboxSpec())
    try:
        assert (await sb.exec("cat /proc/self/uid_map"))["stdout"].split() == ["0", "0", "1"]  # a user namespace
        assert int((await sb.exec("ps -e --no-headers | wc -l"))["stdout"]) <= 4  # agent, sh, ps, wc
        assert (await sb.exec(f"cat {secret}"))["exit_code"] != 0
        # The allow-listed /etc, not the host's: no password hashes, a user table, the sandbox's own name.
        etc = (await sb.exec("ls -A /etc; cat /etc/hostname"))["stdout"].split()
        assert "passwd" in etc and "shadow" not in etc and "sudoers" not in etc and etc[-1] == "sandbox"
        assert (await sb.exec("touch /etc/orchard-rootless"))["exit_code"] != 0  # read-only, as the host tree
        assert os.path.basename(secret) not in (await sb.exec("ls -A /root /home"))["stdout"]
        assert (await sb.exec("echo data > /workspace/f && cat /workspace/f"))["stdout"] == "data\n"
        assert (await sb.exec("touch /usr/orchard-rootless"))["exit_code"] != 0  # host tree is read-only here
        assert (await sb.exec("mount -t tmpfs none /mnt"))["exit_code"] != 0
        assert (await sb.exec("ls /sys/class/net"))["stdout"].split() == ["lo"]
        status = (await sb.exec("grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"))["stdout"].split()
        assert status == ["NoNewPrivs:", "1", "Seccomp:", "2"]  # setpriv --no-new-privs, the agent's --confine
        assert (await sb.exec("unshare -U true"))["exit_code"] != 0
    finally:
        await sb.close()
        os.unlink(secret)
    assert not os.path.exists(sb.handle.data["dir"])


async def test_rlimits_bound_memory_where_cgroups_are_unavailable(short_state_dir):
    require_root()
    backend = LocalBackend(short_state_dir)
    backend.cgroups.available = False
    sb = await DirectSandbox(backend).start(SandboxSpec(memory="256Mi", pids=300))
    try:
        hog = await sb.exec("python3 -c 'x = bytearray(512 * 1024 * 1024)'")
        assert hog["exit_code"] == 1 and "MemoryError" in hog["stderr"]
        assert (await sb.exec("ulimit -v"))["stdout"].strip() == str(256 * 1024)
        assert (await sb.exec("echo alive"))["stdout"] == "alive\n"
    finally:
        await sb.close()
        await backend.close()  # unmounts its /etc layer: the state dir's removal left it mounted before


def test_the_agent_reaps_orphans_as_pid_1(sandbox):
    sandbox.exec("for i in 1 2 3 4 5; do (sleep 0.05 &) ; done").check()

    def no_zombies() -> bool:
        states = sandbox.exec("ps -eo stat --no-headers").stdout.split()
        return not any(state.startswith("Z") for state in states)

    wait_until(no_zombies, what="orphans to be reaped")


def test_a_disk_quota_is_a_clear_error_and_spares_the_others(client):
    from orchard.env.client import NoSpace

    with client.create(disk="16Mi") as small, client.create() as other:
        full = small.exec("dd if=/dev/zero of=big bs=1M count=64")
        assert full.exit_code != 0 and "No space left on device" in full.stderr
        with pytest.raises(NoSpace):
            small.write_file("more.bin", b"x" * (32 << 20))
        assert small.exec("dd if=/dev/zero of=/tmp/big bs=1M count=64").exit_code != 0  # /tmp counts too
        small.exec("rm -f big /tmp/big more.bin").check()  # freeing space makes it usable again
        assert small.exec("echo ok > f && cat f").stdout == "ok\n"
        assert other.exec("dd if=/dev/zero of=big bs=1M count=32 2>/dev/null && echo done").stdout == "done\n"


def test_a_frozen_sandbox_makes_no_progress_until_thawed(client, orchestrator):
    """What snapshots rely on: the cgroup freezer (v1 or v2) holds every process still."""
    import glob
    import time

    cgroups = LocalBackend(orchestrator.state_dir).cgroups
    with client.create() as sb:
        sb.start_process("while true; do date +%s%N > /tmp/tick; done")
        [tick] = wait_until(lambda: glob.glob(os.path.join(orchestrator.state_dir, "sandboxes", sb.id, "rw",
                                                            "private", "*", "tick")), what="the first tick")

        def read_tick() -> str:
            with open(tick) as handle:
                return handle.read()

        with cgroups.frozen(sb.id) as frozen:
            assert frozen
            first = read_tick()
            time.sleep(0.2)
            assert read_tick() == first  # nothing ran meanwhile
        wait_until(lambda: read_tick() not in ("", first), what="the loop to run again")
