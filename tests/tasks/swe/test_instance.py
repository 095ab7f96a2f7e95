"""SWE-bench instances: both test-list encodings, JSON and JSONL, round trips, errors that say where."""

from __future__ import annotations

import json

import pytest

from orchard.tasks.swe.instance import (
    DEFAULT_TEST_CMD,
    InstanceError,
    SWEInstance,
    load_instances,
    save_instances,
)


def record(**overrides):
    base = {"instance_id": "acme__widgets-1", "repo": "acme/widgets", "base_commit": "a" * 40,
            "problem_statement": "It breaks.", "patch": "diff", "test_patch": "",
            "FAIL_TO_PASS": ["tests/test_a.py::test_x"], "PASS_TO_PASS": ["tests/test_b.py::test_y"]}
    return {**base, **overrides}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_swe_bench_json_encoded_test_lists_are_accepted(tmp_path):
    swe_bench = record(FAIL_TO_PASS='["tests/test_a.py::test_x", "tests/test_a.py::test_z[1]"]',
                       PASS_TO_PASS="[]", hints_text="", created_at="2023-01-01T00:00:00Z", version="1.2",
                       environment_setup_commit="b" * 40)
    [instance] = load_instances(write_jsonl(tmp_path / "swe.jsonl", [swe_bench]))
    assert instance.FAIL_TO_PASS == ("tests/test_a.py::test_x", "tests/test_a.py::test_z[1]")
    assert instance.PASS_TO_PASS == ()
    assert instance.version == "1.2" and instance.test_cmd == DEFAULT_TEST_CMD and instance.repo_path is None


def test_json_list_and_jsonl_load_the_same(tmp_path):
    records = [record(), record(instance_id="acme__widgets-2", FAIL_TO_PASS=["tests/test_b.py::test_q"])]
    (tmp_path / "list.json").write_text(json.dumps(records, indent=2))
    write_jsonl(tmp_path / "lines.jsonl", records)
    assert load_instances(tmp_path / "list.json") == load_instances(tmp_path / "lines.jsonl")


def test_round_trip_keeps_unknown_fields_and_relative_repo_paths(tmp_path):
    (tmp_path / "set").mkdir()
    source = write_jsonl(tmp_path / "set" / "in.jsonl",
                         [record(repo_path="repos/one", metadata={"kind": "off_by_one"}, model_name="x")])
    [instance] = load_instances(source)
    assert instance.repo_path == str(tmp_path / "set" / "repos" / "one")  # resolved against the file
    assert instance.extra == {"model_name": "x"}
    save_instances([instance], tmp_path / "set" / "out.jsonl")
    saved = json.loads((tmp_path / "set" / "out.jsonl").read_text())
    assert saved["repo_path"] == "repos/one" and saved["model_name"] == "x"
    assert saved["FAIL_TO_PASS"] == ["tests/test_a.py::test_x"]  # written back as a plain list
    assert load_instances(tmp_path / "set" / "out.jsonl") == [instance]


def test_test_files_in_first_seen_order():
    instance = SWEInstance.from_dict(record(
        FAIL_TO_PASS=["tests/b.py::t1", "tests/a.py::C::t2[x-y]"], PASS_TO_PASS=["tests/b.py::t3", "tests/c.py::t"]))
    assert instance.test_files == ["tests/b.py", "tests/a.py", "tests/c.py"]


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record()) + "\n\n" + '{"instance_id": "x", oops}\n')
    with pytest.raises(InstanceError, match=r"bad\.jsonl:3: invalid JSON"):
        load_instances(path)


def test_missing_field_names_line_instance_and_field(tmp_path):
    broken = record(instance_id="acme__widgets-7")
    del broken["problem_statement"]
    path = write_jsonl(tmp_path / "set.jsonl", [record(), broken])
    where = r"set\.jsonl:2: instance 'acme__widgets-7': field 'problem_statement': missing"
    with pytest.raises(InstanceError, match=where):
        load_instances(path)


@pytest.mark.parametrize(("value", "why"), [
    ("[not json", "a string must hold a JSON list"),
    (42, "expected a list of test ids, got int"),
    (["ok", 3], "item 1 must be a non-empty string"),
])
def test_bad_test_lists_are_explained(tmp_path, value, why):
    path = write_jsonl(tmp_path / "set.jsonl", [record(PASS_TO_PASS=value)])
    with pytest.raises(InstanceError, match=rf"set\.jsonl:1: .*field 'PASS_TO_PASS': {why}"):
        load_instances(path)


def test_json_list_errors_name_the_item(tmp_path):
    path = tmp_path / "set.json"
    path.write_text(json.dumps([record(), record(instance_id="acme__widgets-2", repo="")]))
    with pytest.raises(InstanceError, match=r"set\.json: item 1: instance 'acme__widgets-2': field 'repo'"):
        load_instances(path)
    path.write_text(json.dumps([record(), "not an object"]))
    with pytest.raises(InstanceError, match=r"item 1: expected a JSON object, got str"):
        load_instances(path)


def test_duplicate_ids_and_a_single_multiline_object(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [record(), record()])
    with pytest.raises(InstanceError, match=r"dup\.jsonl:2: duplicate instance_id 'acme__widgets-1' \(first at .*:1\)"):
        load_instances(path)
    path = tmp_path / "one.json"
    path.write_text(json.dumps(record(), indent=2))
    with pytest.raises(InstanceError, match=r"one\.json:1: invalid JSON.*must hold a list"):
        load_instances(path)
