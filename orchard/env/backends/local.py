"""The local backend: each sandbox is the agent in its own Linux namespaces on this machine.

Layout of one sandbox under ``<state_dir>/sandboxes/<id>/``::

    rw/                    everything the sandbox writes (a tmpfs of ``disk`` bytes if the spec sets it):
      upper/ work/         the overlay's writable layer, over the host's / or an image (merged/)
      private/N            empty directories that hide host paths (/root, /home, /tmp, ...)
    run/                   agent.sock, token (deleted once read), env.json, state/ -> /run/orchard
    root.json              image, workdir and command environment (what a snapshot carries)
    launcher.json          pid and start time of the launcher, to recover after a restart
    agent.log              the agent's stdout/stderr

As root, the launcher is the sandbox's PID 1 itself, forked from the zygote
(:mod:`orchard.env.backends.zygote`); without root, it is ``unshare`` running ``sandbox_init.sh``.
Either runs in its own session, so the sandbox outlives the orchestrator process: a restarted
orchestrator re-adopts it through the store, or reaps it.

A sandbox made from an image (``SandboxSpec.image``: a ``docker save`` tarball or an OCI layout in
``images_dir``) has the image's root filesystem, unpacked once into ``<state_dir>/image-cache`` and
shared read-only, below its writable layer instead of the host's; the agent bundle
(:mod:`orchard.env.bundle`) is bind-mounted at ``/.orchard``, and commands get the image's
environment, working directory and user. Image sandboxes need root (an overlay of an arbitrary
directory, and ``setpriv`` to the image's user).

Isolation needs root or unprivileged user namespaces (then the root is built from read-only bind
mounts rather than an overlay, which the kernel refuses there); without both, creation fails with
``isolation_unavailable`` unless the spec says ``isolation="none"``, which runs the agent as a
plain host process confined only in what the file API will touch (unsafe; for debugging).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import resources

from orchard.env.api import ErrorCode, SandboxSpec, SnapshotInfo
from orchard.env.backends.base import SANDBOX_CAPS, BackendError, SandboxHandle
from orchard.env.backends.cgroups import CgroupManager, Limits, rlimit_argv
from orchard.env.backends.etc import build_etc_layer, etc_layer_path, reap_etc_layers
from orchard.env.backends.procfs import start_time
from orchard.env.backends.rootfs import MS_NODEV, MS_NOSUID, RootPlan, mount, umount
from orchard.env.backends.snapshots import RootSpec, SnapshotStore
from orchard.env.backends.zygote import Zygote
from orchard.env.bundle import AGENT, SETPRIV
from orchard.env.images import ImageConfig, ImageError, ImageUser, resolve_user, unpack_image

log = logging.getLogger(__name__)

# What a sandbox on the host's root sees of the host, read-only: the system's directories. Every
# other top-level entry (/work, /home, /root, /tmp, /srv, a checkout, a data disk...) is hidden
# behind an empty private directory, and so are these paths inside the shown ones.
SHOWN_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt", "var", "proc", "dev", "sys")
DEFAULT_HIDE = ("/var/tmp", "/var/lib", "/var/cache", "/var/log", "/var/mail", "/var/spool", "/var/backups")
# The parts of the orchard package a sandbox's agent runs: everything else in it (the tasks, their
# shipped repositories and answers, the recipes) is hidden inside the package's bind mount.
AGENT_PACKAGES = ("env", "__pycache__")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class HostView:
    """What a sandbox on the host's root sees of the host (see :func:`host_view`)."""

    hide: tuple[str, ...]  # replaced by empty private directories (or empty files)
    runtime: tuple[str, ...]  # the agent's interpreter and package, bound read-only at their host paths
    mask: tuple[str, ...]  # hidden again inside the runtime binds


def _outermost(paths: set[str]) -> list[str]:
    """``paths`` less those nested in another: a bind of the parent covers them."""
    return sorted(p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths))


def host_view(extra_hide: tuple[str, ...] = (), root: str = "/") -> HostView:
    """The host as a sandbox sees it: the system directories read-only, the agent's Python (the base
    interpreter and the virtualenv) and the ``orchard`` package's agent parts bound in, and
    nothing else: no checkout, no workdir, no pip cache, no other sandbox's state.

    ``extra_hide`` adds paths an operator wants hidden inside the shown directories.
    """
    import orchard

    top = {f"/{name}" for name in os.listdir(root) if name not in SHOWN_TOP_LEVEL}
    package = os.path.realpath(os.path.dirname(os.path.abspath(orchard.__file__)))
    runtime = _outermost({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, package)})
    mask = tuple(os.path.join(package, name) for name in sorted(os.listdir(package))
                 if name not in AGENT_PACKAGES and os.path.isdir(os.path.join(package, name)))
    hide = tuple(dict.fromkeys((*sorted(top), *DEFAULT_HIDE, *extra_hide)))
    return HostView(hide, tuple(runtime), mask)


@dataclass(frozen=True)
class Image:
    """An image a sandbox starts from: its unpacked root, its config and its resolved user."""

    rootfs: str
    config: ImageConfig
    user: ImageUser


def user_namespaces_work() -> bool:
    """Whether this unprivileged user can create a user namespace (needed without root)."""
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class LocalBackend:
    name = "local"

    def __init__(self, state_dir: str, hide: tuple[str, ...] = (), images_dir: str | None = None,
                 agent_bundle: str | None = None, seccomp: bool = True) -> None:
        """``hide``: host paths to hide on top of :func:`host_view`'s; ``seccomp``: confine every
        sandbox with no_new_privs and the seccomp filter (:mod:`orchard.env.agent.confine`)."""
        self.state_dir = os.path.realpath(state_dir)
        self.images_dir = os.path.realpath(images_dir) if images_dir else None
        self.agent_bundle = os.path.realpath(agent_bundle) if agent_bundle else None
        self.image_cache = os.path.join(self.state_dir, "image-cache")
        self.snapshots = SnapshotStore(self.state_dir)
        self._unpacking: dict[str, asyncio.Lock] = {}
        self.sandboxes_dir = os.path.join(self.state_dir, "sandboxes")
        os.makedirs(self.sandboxes_dir, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        self.view = host_view((*hide, self.state_dir))
        for path in (*self.view.hide, *self.view.runtime, *self.view.mask):
            if any(c.isspace() for c in path):
                raise ValueError(f"paths with whitespace are not supported here: {path!r}")
        # One cgroup group per state dir, so that orchestrators with different state dirs never
        # mistake each other's sandboxes for orphans.
        digest = hashlib.sha256(self.state_dir.encode()).hexdigest()[:10]
        self.cgroups = CgroupManager(group=f"orchard-{digest}")
        self.rootful = os.geteuid() == 0
        self.etc_layer: str | None = None  # mounted with the first sandbox on the host's root (:meth:`_etc_layer`)
        self._etc_failed = False
        self.seccomp = seccomp
        self._userns: bool | None = None
        self._launchers: dict[str, asyncio.subprocess.Process] = {}
        self._zygote = Zygote(os.path.join(self.state_dir, f"zygote-{os.getpid()}.sock"))  # one per process

    # ---------------------------------------------------------------- helpers

    def _etc_layer(self) -> str | None:
        """The allow-listed /etc every sandbox on the host's root gets (:mod:`~orchard.env.backends.etc`), on a
        tmpfs of this process's own under the state dir (about 1 MiB), mounted on first use and unmounted by
        :meth:`close`; None, with a warning, where a tmpfs cannot be mounted. Only root backends start sandboxes
        this way (``sandbox_init.sh`` binds :meth:`_rootless_etc` instead). A layer unmounted from outside this
        process (a host's clean-up) is mounted again: an overlay over its empty directory fails to mount."""
        if self.etc_layer is not None and not os.path.ismount(self.etc_layer):
            log.warning("the sandboxes' /etc layer %s was unmounted from outside; mounting it again", self.etc_layer)
            self.etc_layer = None
        if self.etc_layer is not None or self._etc_failed:
            return self.etc_layer
        reap_etc_layers(self.state_dir)  # those of orchestrators on this state dir killed before their close
        layer = etc_layer_path(self.state_dir)
        os.makedirs(layer, exist_ok=True)
        try:
            if os.path.ismount(layer):  # a dead process's, whose pid this one reuses
                umount(layer)
            mount("tmpfs", layer, "tmpfs", MS_NOSUID | MS_NODEV, "size=128m,mode=0755")
            self.etc_layer = build_etc_layer(layer)
        except OSError as error:
            self._etc_failed = True
            log.warning("sandboxes will see the host's /etc: could not build their own (%s)", error)
        return self.etc_layer

    def _rootless_etc(self) -> str:
        """The allow-listed /etc of a backend without root: a plain directory under the state dir, built once,
        that ``sandbox_init.sh`` binds read-only over each sandbox's /etc."""
        layer = os.path.join(self.state_dir, "etc-rootless")
        if not os.path.isdir(layer):  # built aside and renamed: a crash mid-build leaves no half of one
            building = f"{layer}.{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)
            os.replace(build_etc_layer(building, opaque=False), layer)
        return os.path.join(layer, "etc")

    def _dir(self, sandbox_id: str) -> str:
        if not sandbox_id.isalnum():
            raise BackendError(f"invalid sandbox id {sandbox_id!r}", 400, ErrorCode.INVALID_REQUEST)
        return os.path.join(self.sandboxes_dir, sandbox_id)

    def _check_isolation(self) -> None:
        if self.rootful:
            return
        if self._userns is None:
            self._userns = user_namespaces_work()
        if not self._userns:
            raise BackendError(
                "sandbox isolation needs root or unprivileged user namespaces, and this kernel allows "
                "neither (see /proc/sys/user/max_user_namespaces and kernel.apparmor_restrict_"
                "unprivileged_userns). Run as root, enable user namespaces, or create the sandbox with "
                "isolation='none' (unsafe: commands run directly on the host).",
                status=501, code=ErrorCode.ISOLATION_UNAVAILABLE,
            )

    async def _image(self, name: str) -> tuple[str, ImageConfig]:
        """The cached root filesystem and config of the image ``name`` in ``images_dir``."""
        # A registry reference ("repo/name:tag") is for the Kubernetes backend; here only file names.
        path = os.path.join(self.images_dir, name) if self.images_dir and "/" not in name else None
        if path is None or not os.path.exists(path):
            offered = sorted(os.listdir(self.images_dir)) if self.images_dir else []
            raise BackendError(f"unknown image {name!r}; this orchestrator offers {offered or 'no images'} "
                               f"(the files and OCI layouts in --images {self.images_dir})", 404,
                               ErrorCode.IMAGE_NOT_FOUND)
        if self.agent_bundle is None:
            raise BackendError("image sandboxes need the agent bundle: build it with `orchard env bundle --out DIR` "
                               "and start the orchestrator with --agent-bundle DIR", 501,
                               ErrorCode.ISOLATION_UNAVAILABLE)
        lock = self._unpacking.setdefault(name, asyncio.Lock())
        async with lock:  # one unpack per image; the sandboxes that wait share its result
            try:
                return await asyncio.to_thread(unpack_image, path, self.image_cache)
            except ImageError as error:
                raise BackendError(f"image {name!r} cannot be used: {error}", 400, ErrorCode.IMAGE_INVALID) from None

    def _hostname(self, sandbox_id: str) -> str:
        return f"sandbox-{sandbox_id[:12]}"

    def _zygote_request(self, sandbox_id: str, sandbox_dir: str, spec: SandboxSpec, root: RootSpec,
                        image: Image | None, join: list[str]) -> dict:
        """How the zygote starts a sandbox of a root backend (see zygote.py)."""
        hostname = self._hostname(sandbox_id)
        plan = RootPlan(sandbox_dir, image.rootfs if image else "/", root.workdir, hostname,
                        hide=() if image else self.view.hide, runtime=() if image else self.view.runtime,
                        mask=() if image else self.view.mask,
                        bundle=self.agent_bundle if image else None, etc_layer=None if image else self._etc_layer())
        agent_args = ["--uds", "/run/orchard/agent.sock", "--token-file", "/run/orchard/token", "--env-file",
                      "/run/orchard/env.json", "--state-dir", "/run/orchard/state", "--workdir", root.workdir]
        caps = ",".join(f"+{cap}" for cap in SANDBOX_CAPS)
        if image:  # the bundle's agent, with only the hostname: commands get the image's env from env.json
            user = [f"--user={image.user.uid}:{image.user.gid}"] if image.user.uid else []
            command = [SETPRIV, "--bounding-set", f"-all,{caps}", AGENT, *agent_args, *user]
            agent_env = {"HOSTNAME": hostname}
        else:
            command, agent_env = [], {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "HOSTNAME": hostname}
        return {"plan": asdict(plan), "join": join, "memory": spec.memory_bytes, "pids": spec.pids,
                "log": os.path.join(sandbox_dir, "agent.log"), "net": spec.network == "none",
                "caps": list(SANDBOX_CAPS), "exec": command, "agent_env": agent_env, "agent_args": agent_args,
                "confine": self.seccomp}

    def _init_env(self, sandbox_id: str, sandbox_dir: str, workdir: str, isolated: bool) -> dict[str, str]:
        """The environment of ``sandbox_init.sh`` (the rootless path; ``isolated``: namespaces, not the host)."""
        return {
            "ORCHARD_SANDBOX_DIR": sandbox_dir,
            "ORCHARD_HIDE": " ".join(self.view.hide),
            "ORCHARD_RUNTIME": " ".join(self.view.runtime),
            "ORCHARD_MASK": " ".join(self.view.mask),
            "ORCHARD_WORKDIR": workdir,
            "ORCHARD_HOSTNAME": self._hostname(sandbox_id),
            "ORCHARD_PYTHON": sys.executable,
            "ORCHARD_ETC": self._rootless_etc() if isolated else "",
            "ORCHARD_PATH": DEFAULT_PATH,
            "ORCHARD_CAPS": ",".join(f"+{cap}" for cap in SANDBOX_CAPS),
            "ORCHARD_CONFINE": "--confine" if self.seccomp else "",
            "PATH": DEFAULT_PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
        }

    def _launch_argv(self, sandbox_dir: str, spec: SandboxSpec, workdir: str, join: list[str],
                     limits: Limits) -> list[str]:
        """The launcher without root: set rlimits (or join cgroups), then create a user namespace and
        the others, and run ``sandbox_init.sh``; with ``isolation="none"``, the agent on the host."""
        if spec.isolation == "none":
            root = os.path.join(sandbox_dir, "fs")
            inner = [sys.executable, "-m", "orchard.env.agent", "--uds", f"{sandbox_dir}/run/agent.sock",
                     "--token-file", f"{sandbox_dir}/run/token", "--env-file", f"{sandbox_dir}/run/env.json",
                     "--state-dir", f"{sandbox_dir}/run/state", "--root", root, "--workdir", workdir]
        else:
            flags = ["--user", "--map-root-user", "--pid", "--mount", "--uts", "--ipc", "--fork"]
            if spec.network == "none":
                flags.append("--net")
            init = str(resources.files("orchard.env.backends").joinpath("sandbox_init.sh"))
            inner = ["unshare", *flags, "/bin/sh", init]
        if not join:
            inner = [*rlimit_argv(limits), *inner]
        joins = " ".join(shlex.quote(path) for path in join)
        return ["/bin/sh", "-c", f'for f in {joins}; do echo $$ > "$f" || exit 1; done; exec "$@"', "launcher",
                *inner]

    # ------------------------------------------------------------- lifecycle

    async def create(self, sandbox_id: str, spec: SandboxSpec) -> SandboxHandle:
        if spec.egress or spec.dns:  # a request this backend refuses by design: a client error
            raise BackendError("the local backend cannot filter a sandbox's traffic by destination: use "
                               "network='host' (the host's network), or the kubernetes backend for egress and dns",
                               400, ErrorCode.UNSUPPORTED)
        if spec.isolation != "none":
            self._check_isolation()
        base = RootSpec(env=dict(spec.env))
        if spec.from_snapshot:
            _, base = self.snapshots.get(spec.from_snapshot)
            if spec.image and spec.image != base.image:
                raise BackendError(f"snapshot {spec.from_snapshot!r} was taken from image {base.image!r}, not "
                                   f"{spec.image!r}", 400, ErrorCode.INVALID_REQUEST)
            base.env.update(spec.env)
        image_name = spec.image or base.image
        if (image_name or spec.from_snapshot) and (spec.isolation == "none" or not self.rootful):
            raise BackendError("image and snapshot sandboxes need namespace isolation as root", 501,
                               ErrorCode.ISOLATION_UNAVAILABLE)
        image = None
        if image_name:
            rootfs, config = await self._image(image_name)
            try:
                user = resolve_user(rootfs, config.user)
            except ImageError as error:
                raise BackendError(f"image {image_name!r}: {error}", 400, ErrorCode.IMAGE_INVALID) from None
            image = Image(rootfs, config, user)
            if not spec.from_snapshot:
                # Docker's rules: a default PATH and the user's HOME, then the image's ENV, then the spec's.
                base.env = {"PATH": DEFAULT_PATH, "HOME": user.home, **config.env, **spec.env}
                base.workdir = config.workdir
        workdir = spec.workdir or base.workdir
        root = RootSpec(image_name, workdir, base.env)
        sandbox_dir = self._dir(sandbox_id)
        run_dir = os.path.join(sandbox_dir, "run")
        os.makedirs(os.path.join(sandbox_dir, "rw"), exist_ok=True)
        if spec.disk_bytes:
            if not self.rootful:
                raise BackendError("a disk quota needs a backend running as root", 501, ErrorCode.ISOLATION_UNAVAILABLE)
            mount("tmpfs", os.path.join(sandbox_dir, "rw"), "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={spec.disk_bytes},mode=755")
        for sub in ("rw/upper", "rw/work", "merged", "rw/private", "run/state"):
            os.makedirs(os.path.join(sandbox_dir, sub), exist_ok=True)
        if spec.isolation == "none":
            os.makedirs(os.path.join(sandbox_dir, "fs", workdir.lstrip("/")), exist_ok=True)
        else:
            if spec.from_snapshot:
                await asyncio.to_thread(self.snapshots.seed, spec.from_snapshot, sandbox_dir)
            root.save(sandbox_dir)
        token = secrets.token_urlsafe(32)
        fd = os.open(os.path.join(run_dir, "token"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token)
        with open(os.path.join(run_dir, "env.json"), "w") as handle:
            json.dump(root.env, handle)

        limits = Limits(memory_bytes=spec.memory_bytes, pids=spec.pids, cpu=spec.cpu)
        join = self.cgroups.create(sandbox_id, limits) if self.cgroups.available else []
        if self.rootful and spec.isolation != "none":
            pid = await self._zygote.launch(self._zygote_request(sandbox_id, sandbox_dir, spec, root, image, join))
            return self._launched(sandbox_id, sandbox_dir, pid, token)
        with open(os.path.join(sandbox_dir, "agent.log"), "wb") as agent_log:
            process = await asyncio.create_subprocess_exec(
                *self._launch_argv(sandbox_dir, spec, root.workdir, join, limits),
                stdin=subprocess.DEVNULL, stdout=agent_log, stderr=agent_log, start_new_session=True,
                # not the orchestrator's environment (its API key)
                env=self._init_env(sandbox_id, sandbox_dir, root.workdir, spec.isolation != "none"),
            )
        self._launchers[sandbox_id] = process
        return self._launched(sandbox_id, sandbox_dir, process.pid, token)

    def _launched(self, sandbox_id: str, sandbox_dir: str, pid: int, token: str) -> SandboxHandle:
        """Record the launcher (or, from the zygote, the sandbox's PID 1) to find it again."""
        data = {"pid": pid, "start_time": start_time(pid), "dir": sandbox_dir}
        with open(os.path.join(sandbox_dir, "launcher.json"), "w") as handle:
            json.dump(data, handle)
        return SandboxHandle(sandbox_id, f"unix://{sandbox_dir}/run/agent.sock", token, data)

    async def failure(self, handle: SandboxHandle) -> str | None:
        if await self.alive(handle):
            return None
        try:
            with open(os.path.join(handle.data["dir"], "agent.log"), errors="replace") as log_file:
                tail = log_file.read()[-2000:]
        except FileNotFoundError:
            tail = ""
        return f"the sandbox's agent exited before it was ready: {tail.strip() or 'no output'}"

    async def alive(self, handle: SandboxHandle) -> bool:
        process = self._launchers.get(handle.id)
        if process is not None:
            return process.returncode is None
        pid, started = handle.data.get("pid"), handle.data.get("start_time")
        return bool(pid) and started is not None and start_time(pid) == started

    async def delete(self, handle_or_id: SandboxHandle | str) -> None:
        sandbox_id = handle_or_id if isinstance(handle_or_id, str) else handle_or_id.id
        sandbox_dir = self._dir(sandbox_id)
        self._kill(sandbox_id, sandbox_dir)
        if self.cgroups.available:
            await self.cgroups.kill_and_remove(sandbox_id)
        process = self._launchers.pop(sandbox_id, None)
        if process is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 10)
        if os.path.ismount(os.path.join(sandbox_dir, "rw")):  # a disk quota's tmpfs, on the host
            umount(os.path.join(sandbox_dir, "rw"))
        await asyncio.to_thread(shutil.rmtree, sandbox_dir, True)

    # ------------------------------------------------------------- snapshots

    async def snapshot(self, sandbox_id: str) -> SnapshotInfo:
        """Copy the sandbox's files (frozen meanwhile, so they hold still) into a new snapshot."""
        sandbox_dir = self._dir(sandbox_id)

        def capture() -> SnapshotInfo:
            with self.cgroups.frozen(sandbox_id):
                return self.snapshots.capture(sandbox_id, sandbox_dir)

        return await asyncio.to_thread(capture)

    async def list_snapshots(self) -> list[SnapshotInfo]:
        return await asyncio.to_thread(self.snapshots.list)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await asyncio.to_thread(self.snapshots.delete, snapshot_id)

    def _kill(self, sandbox_id: str, sandbox_dir: str) -> None:
        """Kill the sandbox's pid namespace: its init takes every process with it (a few system calls;
        the cgroup, if any, is emptied and removed after)."""
        try:
            with open(os.path.join(sandbox_dir, "launcher.json")) as handle:
                data = json.load(handle)
        except (FileNotFoundError, json.JSONDecodeError):
            data = {}
        pid = data.get("pid")
        if pid and start_time(pid) == data.get("start_time"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # launcher session: unshare and, with isolation=none, the agent
            for child in _children(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)  # the pid namespace's init

    async def list(self) -> set[str]:
        found = {e.name for e in os.scandir(self.sandboxes_dir) if e.is_dir()}
        if self.cgroups.available:
            found |= self.cgroups.list()
        return found

    async def close(self) -> None:
        self._launchers.clear()
        await self._zygote.close()
        if self.etc_layer:
            with contextlib.suppress(OSError):
                umount(self.etc_layer)
            shutil.rmtree(self.etc_layer, ignore_errors=True)
        if self.cgroups.available:
            self.cgroups.remove_group()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []
