"""Where synthetic bugs come from: a repository as files on disk, its code and its tests.

A :class:`RepoSource` maps repository paths to local files or directories, and says which parts
are code (to put bugs in) and which are tests (to decide which bugs count). Two kinds:

* :func:`shipped_source`: the small packages Orchard ships under ``orchard/tasks/swe/repos/``
  (``intervals``, ``minicalc``, ``textkit``, ``stockroom``), each a project with its own
  ``pyproject.toml`` and ``tests/``; the tiny embedded default, no downloads.
* :func:`package_source`: an installed package that ships its tests inside itself, as toolz
  (``toolz/tests``), simplejson, pyflakes and mpmath do. The repository is the package directory
  alone; test directories are those named ``tests`` or ``test`` inside it. Compiled extensions
  are left out, so the pure-Python code is what runs (simplejson falls back from its C speedups).
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from importlib import resources

SHIPPED = ("intervals", "minicalc", "textkit", "stockroom", "opkit")
DEFAULT_IGNORE = ("__pycache__", "*.pyc", "*.pyo", "*.so", "*.pyd", "*.dylib", ".pytest_cache", "*.egg-info")
_TEST_DIRS = ("tests", "test")


@dataclass(frozen=True)
class RepoSource:
    name: str  # short name, used in instance ids
    repo: str  # SWE-bench's "owner/name": "orchard/intervals", "pypi/toolz"
    version: str
    entries: dict[str, str]  # repository path -> local file or directory
    test_dirs: tuple[str, ...]  # repository paths of the test directories
    ignore: tuple[str, ...] = field(default=DEFAULT_IGNORE)
    # What instances from this source record in their metadata: about the source (a generated repository's
    # style, vocabulary, constant range), and about the function a bug is in ("path:function" -> tags).
    tags: dict[str, str] = field(default_factory=dict)
    function_tags: dict[str, dict[str, str]] = field(default_factory=dict)

    def _ignored(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for pattern in self.ignore)

    def materialize(self, dest: str) -> None:
        """Copy the repository into ``dest`` (created), without ignored files."""
        os.makedirs(dest, exist_ok=True)
        for repo_path, local in self.entries.items():
            target = os.path.join(dest, repo_path)
            if os.path.isdir(local):
                shutil.copytree(local, target, ignore=lambda _dir, names: [n for n in names if self._ignored(n)],
                                dirs_exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target) or dest, exist_ok=True)
                shutil.copy2(local, target)

    def is_test(self, repo_path: str) -> bool:
        name = os.path.basename(repo_path)
        in_tests = any(repo_path == d or repo_path.startswith(d + "/") for d in self.test_dirs)
        return in_tests or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"

    def code_files(self, root: str) -> list[str]:
        """Repository paths of the Python files under ``root`` (a materialized copy) to put bugs in."""
        found = []
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not self._ignored(d))
            for name in sorted(files):
                path = os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")
                if name.endswith(".py") and not self.is_test(path):
                    found.append(path)
        return found


def shipped_source(name: str) -> RepoSource:
    """One of the repositories Orchard ships (:data:`SHIPPED`)."""
    if name not in SHIPPED:
        raise ValueError(f"unknown shipped repository {name!r}; shipped: {', '.join(SHIPPED)}")
    root = resources.files("orchard.tasks.swe") / "repos" / name
    if not root.is_dir():
        raise FileNotFoundError(f"shipped repository {name!r} is missing from the installed package ({root})")
    entries = {entry.name: str(entry) for entry in root.iterdir() if not entry.name.startswith(".")}
    version = "0"
    with open(os.path.join(str(root), "pyproject.toml"), encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("version"):
                version = line.split("=", 1)[1].strip().strip('"')
                break
    return RepoSource(name=name, repo=f"orchard/{name}", version=version, entries=entries, test_dirs=("tests",))


def package_source(package: str, distribution: str | None = None) -> RepoSource:
    """An installed package with its tests inside it (``package_source("toolz")``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package!r} is not an installed package (install it, e.g. `pip install {package}`)")
    local = next(iter(spec.submodule_search_locations))
    test_dirs = []
    for directory, dirs, _ in os.walk(local):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(directory, os.path.dirname(local)).replace(os.sep, "/")
        if os.path.basename(directory) in _TEST_DIRS:
            test_dirs.append(rel)
    if not test_dirs:
        raise ValueError(f"package {package!r} ships no tests/ or test/ directory at {local}")
    try:
        version = importlib.metadata.version(distribution or package)
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    return RepoSource(name=package, repo=f"pypi/{distribution or package}", version=version,
                      entries={package: local}, test_dirs=tuple(test_dirs))


def resolve_source(name: str) -> RepoSource:
    """A shipped repository by name, or ``package:NAME`` (or any other name) as an installed package."""
    if name.startswith("package:"):
        return package_source(name.split(":", 1)[1])
    return shipped_source(name) if name in SHIPPED else package_source(name)
