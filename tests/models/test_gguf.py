"""Reading GGUF files: each file is parsed once per process, and again when it changes."""

from __future__ import annotations

import os

import gguf
import numpy as np

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


def test_the_parse_over_a_plain_view_reads_what_the_stock_reader_reads(tmp_path):
    """The reader slices a plain ndarray view of the memory map (no np.memmap per slice): every field and tensor
    comes out as gguf's own reader gives them."""
    path = str(tmp_path / "model.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_token_list([f"token{i}" for i in range(300)])
    writer.add_token_scores([float(i) / 7 for i in range(300)])
    writer.add_tensor("token_embd.weight", np.arange(24, dtype=np.float32).reshape(4, 6))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours, stock = read_gguf(path), gguf.GGUFReader(path)
    assert type(ours.data) is np.ndarray and isinstance(stock.data, np.memmap)
    assert list(ours.fields) == list(stock.fields)
    for key, field in stock.fields.items():
        assert ours.fields[key].contents() == field.contents(), key
    [tensor], [stock_tensor] = ours.tensors, stock.tensors
    np.testing.assert_array_equal(tensor.data, stock_tensor.data)
    assert tensor.data.flags.writeable is False
