"""Reading GGUF files: each file is parsed once per process, and again when it changes."""

from __future__ import annotations

import os

import gguf

from orchard.models.gguf import read_gguf


def write_gguf(path: str, name: str) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_file_is_parsed_once_and_again_when_it_changes(tmp_path):
    path = str(tmp_path / "model.gguf")
    write_gguf(path, "first")
    first = read_gguf(path)
    assert read_gguf(path) is first and read_gguf(os.path.relpath(path)) is first
    assert first.fields["general.name"].contents() == "first"
    write_gguf(path, "second")
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a new version, even in the same tick
    assert read_gguf(path).fields["general.name"].contents() == "second"
