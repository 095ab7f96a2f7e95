"""What a local sandbox's occupant can neither see nor do (needs root: a real orchestrator).

The red team's in-sandbox attacks at the environment level: the host's checkout, workdirs and
caches are out of sight, and the calls a container runtime refuses are refused (no_new_privs and
the seccomp filter of :mod:`orchard.env.agent.confine`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

import orchard
from orchard.env.agent.confine import build_filter
from orchard.env.backends.etc import LAYER_PREFIX, etc_layer_path
from orchard.env.backends.local import host_view
from orchard.env.local import local_server
from tests.conftest import require_root

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(orchard.__file__)))
PACKAGE = os.path.dirname(os.path.abspath(orchard.__file__))


def syscall_number(name: str) -> int:
    import pyseccomp

    return pyseccomp.resolve_syscall(pyseccomp.system_arch(), name)


def raw_syscall(sandbox, name: str, *args: int) -> str:
    """Call ``name`` with ``args`` (as unsigned longs) in the sandbox through libc's syscall(); its ``errno``
    name, or ``ok``."""
    code = ("import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); "
            f"r = libc.syscall({syscall_number(name)}, *map(ctypes.c_ulong, {list(args) or [0]})); "
            "print('ok' if r >= 0 else errno.errorcode[ctypes.get_errno()])")
    result = sandbox.exec(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


def test_every_process_has_no_new_privs_and_the_filter(sandbox):
    status = sandbox.exec("grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status").stdout.split()
    assert status == ["NoNewPrivs:", "1", "Seccomp:", "2"]  # 2: a filter is loaded


@pytest.mark.parametrize("command", ["unshare -U true", "unshare -m true", "mount -t tmpfs none /mnt", "umount /proc"])
def test_namespace_and_mount_commands_are_refused(sandbox, command):
    result = sandbox.exec(command)
    assert result.exit_code != 0
    said = result.stderr.lower()  # util-linux words EPERM its own way per tool
    assert any(words in said for words in ("not permitted", "permission denied", "must be superuser")), said


@pytest.mark.parametrize(("name", "args"), [("keyctl", (0, 0)), ("add_key", (0, 0, 0, 0, 0)), ("bpf", (0, 0, 0)),
                                            ("init_module", (0, 0, 0)), ("finit_module", (0, 0, 0)),
                                            ("delete_module", (0, 0)), ("kexec_load", (0, 0, 0, 0)),
                                            ("reboot", (0, 0, 0, 0)), ("setns", (0, 0)), ("unshare", (0x10000000,)),
                                            ("perf_event_open", (0, 0, 0, 0, 0)), ("userfaultfd", (0,)),
                                            ("process_vm_readv", (1, 0, 0, 0, 0, 0)), ("pidfd_getfd", (0, 0, 0)),
                                            ("sethostname", (0, 0)), ("io_uring_setup", (1, 0))])
def test_kernel_calls_are_refused_with_eperm(sandbox, name, args):
    assert raw_syscall(sandbox, name, *args) == "EPERM"


def test_clone_into_a_new_user_namespace_is_refused_and_plain_forks_work(sandbox):
    assert raw_syscall(sandbox, "clone", 0x10000000 | 17, 0, 0, 0, 0) == "EPERM"  # CLONE_NEWUSER | SIGCHLD
    assert sandbox.exec("sh -c 'echo forked' & wait").stdout.strip() == "forked"  # clone without namespace flags


def test_a_call_off_the_allow_list_is_not_implemented_and_vsock_is_refused(sandbox):
    """The filter is an allow list: personality(READ_IMPLIES_EXEC), which the host runs, is not on it and
    fails as a call this kernel lacked would (ENOSYS, so that libc falls back), while a query of the
    personality is allowed; clone3 is refused the same way; a socket to the hypervisor (AF_VSOCK) is EPERM."""
    read_implies_exec, query = 0x0400000, 0xFFFFFFFF
    on_the_host = subprocess.run([sys.executable, "-c", (
        "import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); "
        f"print('ok' if libc.syscall({syscall_number('personality')}, {read_implies_exec}) >= 0 "
        "else errno.errorcode[ctypes.get_errno()])")], capture_output=True, text=True, check=True)
    assert on_the_host.stdout.strip() == "ok"
    assert raw_syscall(sandbox, "personality", read_implies_exec) == "ENOSYS"
    assert raw_syscall(sandbox, "personality", query) == "ok"
    assert raw_syscall(sandbox, "clone3", 0, 0) == "ENOSYS"
    assert raw_syscall(sandbox, "socket", 40, 1, 0) == "EPERM"  # AF_VSOCK, SOCK_STREAM
    assert raw_syscall(sandbox, "socket", 1, 1, 0) == "ok"  # AF_UNIX


def test_the_filter_builds_here():
    assert build_filter() is not None  # libseccomp is on this machine: the tests above ran confined


def test_the_host_checkout_workdirs_and_caches_are_out_of_sight(sandbox, tmp_path):
    (tmp_path / "instances.jsonl").write_text('{"patch": "the gold patch"}\n')
    hidden = [str(tmp_path), os.path.join(CHECKOUT, "runs"), os.path.join(CHECKOUT, "tests"),
              os.path.join(CHECKOUT, "configs"), os.path.join(PACKAGE, "tasks", "swe", "repos"),
              os.path.join(PACKAGE, "recipes"), os.path.expanduser("~/.cache"), "/tmp", "/home", "/srv"]
    runtime = host_view().runtime
    for path in hidden:  # each is absent, or an empty private directory but for the way to a runtime bind
        listed = set(sandbox.exec(f"ls -A {shlex.quote(path)} 2>/dev/null").stdout.split())
        on_the_way = {r[len(path) + 1:].split("/")[0] for r in runtime if r.startswith(path + "/")}
        assert listed <= on_the_way, (path, listed)
    found = sandbox.exec(f"find {shlex.quote(CHECKOUT)} / -xdev -name instances.jsonl 2>/dev/null | head -3")
    assert found.stdout.strip() == ""


def test_the_agent_s_python_and_package_are_there(sandbox):
    result = sandbox.exec(f"{shlex.quote(sys.executable)} -c 'import orchard.env.agent.confine, pytest; print(1)'")
    assert result.ok and result.stdout.strip() == "1", result.stderr
    blocked = sandbox.exec(f"{shlex.quote(sys.executable)} -c 'import orchard.tasks.swe.task'")
    assert not blocked.ok and "ModuleNotFoundError" in blocked.stderr


def test_the_view_hides_every_top_level_entry_but_the_system_s(tmp_path):
    for name in ("usr", "etc", "work", "data"):
        (tmp_path / name).mkdir()
    (tmp_path / "secret.json").write_text("{}")
    view = host_view(("/etc/orchard-secrets",), root=str(tmp_path))
    assert {"/work", "/data", "/secret.json", "/etc/orchard-secrets"} <= set(view.hide)
    assert "/usr" not in view.hide and "/etc" not in view.hide
    assert PACKAGE in view.runtime and CHECKOUT not in view.runtime
    assert os.path.join(PACKAGE, "tasks") in view.mask and os.path.join(PACKAGE, "env") not in view.mask


def test_etc_is_an_allow_list_of_the_host_s_and_the_sandbox_s_own_to_write(client, sandbox):
    """No shadow, no ssh host keys, no private TLS keys, no PAM, no host name or machine id; what Debian's
    tools read is there; a write to /etc stays in its sandbox."""
    host = {name for name in ("shadow", "gshadow", "ssh", "sudoers", "pam.d", "security") if os.path.exists(f"/etc/{name}")}
    assert host, "this host has none of the files the test looks for"
    listed = set(sandbox.exec("ls -A /etc").stdout.split())
    assert not listed & host, listed & host
    assert {"passwd", "group", "hosts", "resolv.conf", "nsswitch.conf", "ld.so.cache", "ssl"} <= listed
    assert sandbox.exec("ls /etc/ssl/private 2>&1").exit_code != 0
    assert sandbox.exec("cat /etc/hostname").stdout.strip() == "sandbox"
    with open("/etc/machine-id") as handle:
        assert sandbox.exec("cat /etc/machine-id").stdout.strip() != handle.read().strip()
    assert sandbox.exec("id -un && git --version && python3 -c 'import ssl; ssl.create_default_context()'").ok
    assert sandbox.exec("echo mine > /etc/orchard-note && cat /etc/orchard-note").stdout.strip() == "mine"
    assert not os.path.exists("/etc/orchard-note")
    with client.create(memory="256Mi") as other:
        assert other.exec("cat /etc/orchard-note").exit_code != 0


def test_each_orchestrator_mounts_its_own_etc_and_a_killed_one_s_is_reaped(tmp_path):
    """Replicas share a state dir: each process stacks its own layer, so one's close cannot leave another's
    sandboxes over the host's /etc. A killed process's layer stays mounted until the next orchestrator on the
    state dir starts a sandbox, or ``LocalServer.stop`` runs; then it is gone."""
    require_root()
    state_dir = str(tmp_path / "state")
    first = local_server(state_dir=state_dir)
    with first.client() as client, client.create(heartbeat=False) as sandbox:  # deleted: the kill leaks no sandbox
        assert sandbox.exec("cat /etc/hostname").stdout == "sandbox\n"
    first_layer = etc_layer_path(state_dir, first.process.pid)
    assert os.path.ismount(first_layer)
    first.kill()
    assert os.path.ismount(first_layer)  # as a crash leaves it
    second = local_server(state_dir=state_dir, api_key=first.api_key)
    try:
        with second.client() as client, client.create(heartbeat=False) as sandbox:
            assert sandbox.exec("cat /etc/hostname").stdout == "sandbox\n"
        assert not os.path.exists(first_layer) and os.path.ismount(etc_layer_path(state_dir, second.process.pid))
        second.kill()
    finally:
        second.stop()
    assert not [name for name in os.listdir(state_dir) if name.startswith(LAYER_PREFIX)]
    with open("/proc/self/mountinfo") as mounts:
        assert state_dir not in mounts.read()


def test_a_layer_unmounted_from_outside_is_mounted_again_for_the_next_sandbox(tmp_path):
    """A host's clean-up that unmounts a running orchestrator's layer (as ``umount -l`` of every etc-layer once
    did to a three-hour run) must not fail every sandbox after it: the next one mounts the layer again."""
    require_root()
    state_dir = str(tmp_path / "state")
    server = local_server(state_dir=state_dir)
    try:
        with server.client() as client:
            with client.create(heartbeat=False) as sandbox:
                assert sandbox.exec("cat /etc/hostname").stdout == "sandbox\n"
            layer = etc_layer_path(state_dir, server.process.pid)
            subprocess.run(["umount", "-l", layer], check=True)
            with client.create(heartbeat=False) as sandbox:
                assert sandbox.exec("cat /etc/hostname").stdout == "sandbox\n"
            assert os.path.ismount(layer)
    finally:
        server.stop()


def test_another_sandbox_s_workspace_is_out_of_reach(client, sandbox):
    with client.create(memory="256Mi") as other:
        other.write_file("/workspace/secret.txt", "the other sandbox's answer\n")
        assert sandbox.exec("cat /workspace/secret.txt").exit_code != 0
        search = sandbox.exec("grep -rl \"the other sandbox's answer\" /workspace /run /var /opt 2>/dev/null | head -1")
        assert search.stdout.strip() == ""


def test_the_orchestrator_and_the_host_loopback_are_unreachable(client, orchestrator):
    port = int(orchestrator.base_url.rsplit(":", 1)[1])
    code = ("import socket, sys\n"
            "for host in ('127.0.0.1', '::1'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=2).close(); print('reached', host)\n"
            "    except OSError as e:\n"
            "        print('refused', host)\n")
    with client.create(memory="256Mi", network="none") as isolated:
        result = isolated.exec(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    assert result.ok and "reached" not in result.stdout and result.stdout.count("refused") == 2
