"""``str_replace_editor`` in a real sandbox: every command, and the edge cases models hit."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from orchard.env.client import AsyncSandbox
from orchard.harness.editor import ToolError, str_replace_editor

DIR = "/workspace/edit"
TEXT = "alpha\nbeta\ngamma\nbeta\n"


@pytest.fixture(scope="module")
async def box(aclient) -> AsyncIterator[AsyncSandbox]:
    async with aclient.create(memory="512Mi") as sandbox:
        yield sandbox


@pytest.fixture
async def path(box, request) -> str:
    """A fresh file holding TEXT, named after the test."""
    name = f"{DIR}/{request.node.name}.txt"
    await box.write_file(name, TEXT)
    return name


async def edit(box: AsyncSandbox, command: str, path: str, **arguments) -> str:
    return await str_replace_editor(box, command, path, **arguments)


async def content(box: AsyncSandbox, path: str) -> str:
    return (await box.read_file(path)).decode()


async def test_view_numbers_lines_like_cat_n(box, path):
    assert await edit(box, "view", path) == (f"Here's the result of running `cat -n` on {path}:\n"
                                             "     1\talpha\n     2\tbeta\n     3\tgamma\n     4\tbeta\n     5\t\n")
    assert (await edit(box, "view", path, view_range=[2, 3])).endswith("     2\tbeta\n     3\tgamma\n")
    assert (await edit(box, "view", path, view_range=[4, -1])).endswith("     4\tbeta\n     5\t\n")
    for bad, message in [([0, 2], "first element `0`"), ([2, 9], "second element `9` should be smaller"),
                         ([3, 2], "should be larger or equal"), ([1], "list of two integers")]:
        with pytest.raises(ToolError, match=message):
            await edit(box, "view", path, view_range=bad)


async def test_view_of_a_directory_lists_two_levels_without_hidden_entries(box):
    for name in ["top.py", "pkg/mod.py", "pkg/deep/far.py", ".hidden/secret.py", "pkg/.env"]:
        await box.write_file(f"{DIR}/tree/{name}", "x = 1\n")
    listing = await edit(box, "view", f"{DIR}/tree")
    assert listing == (f"Here's the files and directories up to 2 levels deep in {DIR}/tree, excluding hidden "
                       f"items:\n{DIR}/tree\n{DIR}/tree/pkg\n{DIR}/tree/pkg/deep\n{DIR}/tree/pkg/mod.py\n"
                       f"{DIR}/tree/top.py\n")
    with pytest.raises(ToolError, match="not allowed when `path` points to a directory"):
        await edit(box, "view", f"{DIR}/tree", view_range=[1, 2])
    with pytest.raises(ToolError, match="is a directory and only the `view` command"):
        await edit(box, "str_replace", f"{DIR}/tree", old_str="a", new_str="b")


async def test_create_writes_new_files_and_refuses_to_overwrite(box, path):
    new = f"{DIR}/made/by/create.py"
    assert await edit(box, "create", new, file_text="print('hi')\n") == f"File created successfully at: {new}"
    assert await content(box, new) == "print('hi')\n"
    with pytest.raises(ToolError, match=f"File already exists at: {path}. Cannot overwrite"):
        await edit(box, "create", path, file_text="gone\n")
    with pytest.raises(ToolError, match="File already exists"):
        await edit(box, "create", DIR, file_text="gone\n")
    assert await content(box, path) == TEXT
    with pytest.raises(ToolError, match="`file_text` is required"):
        await edit(box, "create", f"{DIR}/empty.py")


async def test_str_replace_needs_exactly_one_match(box, path):
    with pytest.raises(ToolError, match=f"old_str `delta` did not appear verbatim in {path}"):
        await edit(box, "str_replace", path, old_str="delta", new_str="x")
    with pytest.raises(ToolError, match=r"Multiple occurrences of old_str `beta` in lines \[2, 4\]"):
        await edit(box, "str_replace", path, old_str="beta", new_str="x")
    with pytest.raises(ToolError, match="must be different"):
        await edit(box, "str_replace", path, old_str="gamma", new_str="gamma")
    with pytest.raises(ToolError, match="`old_str` is required"):
        await edit(box, "str_replace", path)
    assert await content(box, path) == TEXT  # nothing was written by the refusals

    result = await edit(box, "str_replace", path, old_str="gamma\nbeta", new_str="GAMMA\nBETA\nextra")
    assert await content(box, path) == "alpha\nbeta\nGAMMA\nBETA\nextra\n"
    assert result.startswith(f"The file {path} has been edited. Here's the result of running `cat -n` on a "
                             f"snippet of {path}:\n     1\talpha\n")
    assert "     5\textra\n" in result and result.endswith("Edit the file again if necessary.")
    await edit(box, "str_replace", path, old_str="extra\n")  # new_str defaults to nothing: a deletion
    assert await content(box, path) == "alpha\nbeta\nGAMMA\nBETA\n"


async def test_insert_goes_after_the_given_line(box, path):
    await edit(box, "insert", path, insert_line=0, new_str="first")
    await edit(box, "insert", path, insert_line=3, new_str="after beta\nand more")
    assert await content(box, path) == "first\nalpha\nbeta\nafter beta\nand more\ngamma\nbeta\n"
    with pytest.raises(ToolError, match=r"Invalid `insert_line` parameter: 99. .* \[0, 8\]"):
        await edit(box, "insert", path, insert_line=99, new_str="x")
    with pytest.raises(ToolError, match="`new_str` is required"):
        await edit(box, "insert", path, insert_line=1)


async def test_paths_must_be_absolute_and_exist(box, path):
    with pytest.raises(ToolError, match="is not an absolute path"):
        await edit(box, "view", "workspace/edit")
    with pytest.raises(ToolError, match=f"The path {DIR}/nope.py does not exist"):
        await edit(box, "view", f"{DIR}/nope.py")
    with pytest.raises(ToolError, match="Unrecognized command 'undo_edit'"):
        await edit(box, "undo_edit", path)
    # Paths the sandbox refuses are messages for the model, not errors that end the run.
    with pytest.raises(ToolError, match=f"The path {path}/x does not exist"):
        await edit(box, "view", f"{path}/x")
    with pytest.raises(ToolError, match=f"A parent of {path}/x is not a directory"):
        await edit(box, "create", f"{path}/x", file_text="y")
    with pytest.raises(ToolError, match="is outside the sandbox"):
        await edit(box, "view", "/../../etc")


async def test_edits_keep_the_file_mode_and_tabs(box):
    script = f"{DIR}/run.sh"
    await box.write_file(script, "#!/bin/sh\n\techo one\n", mode=0o755)
    await edit(box, "str_replace", script, old_str="one", new_str="two")
    assert (await box.stat(script)).mode == 0o755
    assert await content(box, script) == "#!/bin/sh\n\techo two\n"
    assert (await box.exec([script], timeout=30)).stdout == "two\n"


async def test_binary_files_and_links(box):
    await box.write_file(f"{DIR}/blob.bin", b"\xff\xfe\x00")
    with pytest.raises(ToolError, match="not UTF-8 text"):
        await edit(box, "view", f"{DIR}/blob.bin")
    await box.write_file(f"{DIR}/linked/target.txt", "linked\n")
    await box.exec(f"cd {DIR} && ln -sf linked/target.txt file-link && ln -sfn linked dir-link", timeout=30)
    assert (await edit(box, "view", f"{DIR}/file-link")).endswith("     1\tlinked\n     2\t\n")
    assert (await edit(box, "view", f"{DIR}/dir-link")).endswith(f"{DIR}/dir-link\n{DIR}/dir-link/target.txt\n")
