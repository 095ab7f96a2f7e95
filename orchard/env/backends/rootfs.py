"""Build a sandbox's root with system calls, from inside its new mount namespace.

The same layout as ``sandbox_init.sh`` (which the rootless path still runs), without its sixty
short-lived processes (``mount``, ``mkdir``, ``ln``...): the zygote's fork calls
:func:`build_root` directly, which is what lets a 2-core machine start sandboxes by the hundred.

    /                 overlay: the plan's lower layer (the host's / or an image's root) below,
                      the sandbox's private writable layer above; over the host's /, the backend's
                      /etc layer between them (:mod:`orchard.env.backends.etc`: an allow list)
    hidden paths      (host root only) empty private directories (or files) over every top-level
                      entry but the system's (/work, /root, /home, /tmp, ...) and a few inside them
    runtime paths     (host root only) the agent's Python and package, bound read-only at their host
                      paths, with the package's non-agent parts hidden again (masks)
    /.orchard         (image only) the agent bundle, read-only
    /proc /dev /sys   fresh proc for the new pid namespace, a minimal /dev, read-only sysfs
    /run/orchard      the agent's socket, token and state, shared with the orchestrator

then ``pivot_root`` into it, so nothing of the host tree stays reachable.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import platform
import socket
import struct
from dataclasses import dataclass

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass
class RootPlan:
    """What a sandbox's root is made of; the backend fills it in."""

    sandbox_dir: str
    lower: str  # "/" or an image's cached root
    workdir: str
    hostname: str
    hide: tuple[str, ...] = ()  # host root only
    runtime: tuple[str, ...] = ()  # host root only
    mask: tuple[str, ...] = ()  # host root only: hidden again inside the runtime binds
    bundle: str | None = None  # image only
    etc_layer: str | None = None  # host root only: a layer whose opaque etc replaces the host's


def libc_call(result: int, what: str) -> None:
    """Raise ``OSError`` with errno when a libc call through ``LIBC`` returned non-zero."""
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    def encode(value: str | None) -> bytes | None:
        return value.encode() if value is not None else None

    libc_call(LIBC.mount(encode(source), target.encode(), encode(fstype), ctypes.c_ulong(flags), encode(data)),
          f"mount {fstype or 'bind'} on {target}")


def umount(target: str) -> None:
    """Detach ``target`` (lazily: it goes once nothing uses it)."""
    libc_call(LIBC.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def bind(source: str, target: str, read_only: bool = False, recursive: bool = False) -> None:
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _minimal_dev(root: str) -> None:
    dev = f"{root}/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=1m")
    for name in DEVICES:
        open(f"{dev}/{name}", "a").close()
        bind(f"/dev/{name}", f"{dev}/{name}")
    os.makedirs(f"{dev}/pts")
    os.makedirs(f"{dev}/shm")
    with contextlib.suppress(OSError):
        mount("devpts", f"{dev}/pts", "devpts", 0, "newinstance,ptmxmode=0666,mode=620")
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for link, target in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{link}")


def _hide(target: str, private: str, read_only: bool = False) -> None:
    """Put an empty private directory (or file) over ``target``, if there is one."""
    if os.path.isdir(target) and not os.path.islink(target):
        os.makedirs(private, exist_ok=True)
    elif os.path.isfile(target) and not os.path.islink(target):
        open(private, "a").close()
    else:
        return
    bind(private, target, read_only=read_only)


def build_root(plan: RootPlan) -> None:
    """Build the root in the calling process's (new) mount namespace and ``pivot_root`` into it."""
    sandbox, root = plan.sandbox_dir, f"{plan.sandbox_dir}/merged"
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    lower = f"{plan.etc_layer}:{plan.lower}" if plan.etc_layer else plan.lower
    mount("overlay", root, "overlay", 0, f"lowerdir={lower},upperdir={sandbox}/rw/upper,workdir={sandbox}/rw/work")
    for path in ("proc", "dev", "sys", "tmp"):
        os.makedirs(f"{root}/{path}", exist_ok=True)
    if plan.bundle:
        os.makedirs(f"{root}/.orchard", exist_ok=True)
        bind(plan.bundle, f"{root}/.orchard", read_only=True)
    for number, path in enumerate(plan.hide, 1):
        _hide(f"{root}{path}", f"{sandbox}/rw/private/{number}")
    for path in ("tmp", "var/tmp"):
        with contextlib.suppress(OSError):
            os.chmod(f"{root}/{path}", 0o1777)
    for path in plan.runtime:
        os.makedirs(f"{root}{path}", exist_ok=True)
        bind(path, f"{root}{path}", read_only=True)
    for number, path in enumerate(plan.mask, 1):
        _hide(f"{root}{path}", f"{sandbox}/rw/private/mask-{number}", read_only=True)
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _minimal_dev(root)
    try:
        mount("sysfs", f"{root}/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        with contextlib.suppress(OSError):
            bind("/sys", f"{root}/sys", read_only=True, recursive=True)
    os.makedirs(f"{root}{plan.workdir}", exist_ok=True)  # after the mounts: under /proc it cannot exist
    os.makedirs(f"{root}/run/orchard", exist_ok=True)  # after the private /run
    bind(f"{sandbox}/run", f"{root}/run/orchard")
    name = plan.hostname.encode()
    libc_call(LIBC.sethostname(name, len(name)), "sethostname")
    with contextlib.suppress(OSError):
        _loopback_up()
    os.chdir(root)
    os.makedirs(".oldroot", exist_ok=True)
    libc_call(LIBC.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b".oldroot"), "pivot_root")
    umount("/.oldroot")
    os.rmdir("/.oldroot")
    os.chdir("/")
