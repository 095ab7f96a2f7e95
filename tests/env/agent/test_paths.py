"""Confinement of API paths to the sandbox root."""

from __future__ import annotations

import os

import pytest

from orchard.env.agent.paths import SandboxRoot
from orchard.env.problems import ProblemError


@pytest.fixture
def root(tmp_path):
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "inside.txt").write_text("ok")
    os.symlink("/etc", tmp_path / "workspace" / "etc_link")
    os.symlink("inside.txt", tmp_path / "workspace" / "good_link")
    os.symlink("../../..", tmp_path / "workspace" / "up_link")
    return SandboxRoot(str(tmp_path), "/workspace")


def test_absolute_and_relative_paths_map_into_root(root, tmp_path):
    assert root.host_path("/workspace/inside.txt") == str(tmp_path / "workspace" / "inside.txt")
    assert root.host_path("inside.txt") == str(tmp_path / "workspace" / "inside.txt")
    assert root.host_path("/") == str(tmp_path)
    assert root.api_path(root.host_path("inside.txt")) == "/workspace/inside.txt"


@pytest.mark.parametrize("path", ["/../etc/passwd", "../../etc/passwd", "/workspace/../../x", "a/../../../b"])
def test_dotdot_above_root_is_refused(root, path):
    with pytest.raises(ProblemError) as error:
        root.host_path(path)
    assert error.value.status == 403 and error.value.code == "path_outside_sandbox"


@pytest.mark.parametrize("path", ["/workspace/etc_link/passwd", "/workspace/etc_link", "/workspace/up_link/etc"])
def test_symlinks_out_of_root_are_refused(root, path):
    with pytest.raises(ProblemError) as error:
        root.host_path(path)
    assert error.value.code == "path_outside_sandbox"


def test_symlinks_inside_root_are_followed(root, tmp_path):
    assert root.host_path("/workspace/good_link") == str(tmp_path / "workspace" / "inside.txt")


def test_the_link_itself_can_be_addressed(root, tmp_path):
    assert root.host_path("/workspace/etc_link", follow_last=False) == str(tmp_path / "workspace" / "etc_link")


def test_nul_and_empty_paths_are_invalid(root):
    for path in ("", "/a\0b"):
        with pytest.raises(ProblemError) as error:
            root.host_path(path)
        assert error.value.status == 400
