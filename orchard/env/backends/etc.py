"""The ``/etc`` a sandbox on the host's root sees: an allow list of the host's, never all of it.

The host's ``/etc`` holds what a sandbox has no business reading (``shadow``, ``ssh`` host keys,
``ssl/private``, ``sudoers``, PAM and security settings, the host's name and machine id). The local
backend builds, once, a layer holding only :data:`ALLOWED` (what Debian's shells, Python, git, patch,
iproute2 and Chromium read) with a fresh ``hostname`` and ``machine-id``, marks its ``etc`` opaque,
and stacks it above the host's root in every sandbox's overlay: the sandbox sees this ``etc`` and
nothing of the host's, and can still write its own (the overlay's upper layer). The layer lives on a
tmpfs of its own, as overlayfs refuses a lower layer nested inside another (the host's root).

Each orchestrator process mounts its own layer, ``etc-layer-<pid>`` under the state dir (replicas share a
state dir, and one replica's close must not unmount what another's sandboxes stack on), and unmounts it at
close. A process killed before its close leaves its layer mounted: :func:`reap_etc_layers`, run by the next
orchestrator on the state dir and by ``LocalServer.stop``, removes the layers of processes that are gone.

A backend without root builds the same ``etc`` in a plain directory (no opaque mark, which needs
``CAP_SYS_ADMIN``), and ``sandbox_init.sh`` binds it read-only over the sandbox's ``/etc``, as read-only as
the rest of the host tree there.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import secrets
import shutil

from orchard.env.backends.procfs import start_time
from orchard.env.backends.rootfs import umount

LAYER_PREFIX = "etc-layer-"

# Top-level names of the host's /etc a sandbox gets (shell patterns).
ALLOWED = (
    # users and groups (no password hashes: those are in shadow), names and their resolution
    "passwd", "group", "nsswitch.conf", "hosts", "resolv.conf", "host.conf", "gai.conf", "networks", "protocols",
    "services", "ethertypes", "rpc", "shells", "login.defs",
    # the dynamic linker, and the alternatives Debian's /usr/bin links go through
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
    # certificates (not ssl/private), time, locale, MIME types, file magic
    "ssl", "ca-certificates", "ca-certificates.conf", "localtime", "timezone", "locale.alias", "locale.gen",
    "mime.types", "magic", "magic.mime", "os-release", "debian_version", "mtab",
    # shells, Python, git, editors, the browser and its fonts
    "bash.bashrc", "profile", "profile.d", "environment", "inputrc", "terminfo", "skel", "python3*", "gitconfig",
    "pip.conf", "vim", "perl", "iproute2", "chromium", "chromium.d", "fonts", "xdg", "X11", "dbus-1", "gtk-3.0",
    "glvnd", "xml", "sgml",
)
# Inside an allowed directory, never.
DENIED = ("ssl/private",)


def build_etc_layer(layer: str, source: str = "/etc", opaque: bool = True) -> str:
    """Fill ``layer``/etc with the allowed entries of ``source`` (links kept as links, unreadable entries
    left out), a ``hostname`` of ``sandbox`` and a random ``machine-id``; mark it opaque (``opaque``: an
    overlay's layer). Returns ``layer``."""
    etc = os.path.join(layer, "etc")
    shutil.rmtree(etc, ignore_errors=True)
    os.makedirs(etc)
    for name in sorted(os.listdir(source)):
        if not any(fnmatch.fnmatch(name, pattern) for pattern in ALLOWED):
            continue
        path, target = os.path.join(source, name), os.path.join(etc, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.copytree(path, target, symlinks=True, ignore_dangling_symlinks=True)
            else:
                shutil.copy2(path, target, follow_symlinks=False)
        except OSError:  # unreadable or vanished: left out
            continue
    for denied in DENIED:
        shutil.rmtree(os.path.join(etc, denied), ignore_errors=True)
    with open(os.path.join(etc, "hostname"), "w") as handle:
        handle.write("sandbox\n")
    with open(os.path.join(etc, "machine-id"), "w") as handle:
        handle.write(secrets.token_hex(16) + "\n")
    if opaque:
        os.setxattr(etc, "trusted.overlay.opaque", b"y")  # the host's /etc below it is not merged in
    return layer


def etc_layer_path(state_dir: str, pid: int | None = None) -> str:
    """Where the process ``pid`` (default: this one) mounts its layer under ``state_dir``."""
    return os.path.join(state_dir, f"{LAYER_PREFIX}{os.getpid() if pid is None else pid}")


def reap_etc_layers(state_dir: str) -> list[str]:
    """Unmount and remove the layers under ``state_dir`` whose process is gone (killed before its close);
    returns their paths. A layer whose pid now names another process stays (a leak, never a layer in use
    pulled from under a live orchestrator's sandboxes)."""
    reaped = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(state_dir):
            pid = entry.name.removeprefix(LAYER_PREFIX)
            if entry.name == pid or not pid.isdigit() or start_time(int(pid)) is not None:
                continue
            if os.path.ismount(entry.path):
                with contextlib.suppress(OSError):
                    umount(entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
            reaped.append(entry.path)
    return reaped

