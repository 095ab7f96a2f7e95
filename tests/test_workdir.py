"""Stage records: reuse what the same config made, resume what it started, refuse what another made."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

import pytest

from orchard.workdir import Stage, StaleStage, file_fingerprint, made_by


def test_a_stage_is_new_then_resumed_then_done(tmp_path):
    directory = str(tmp_path / "sft")
    stage = Stage(directory, "sft", {"steps": 10}, {"examples": "abc"})
    assert stage.open() == "new"
    assert json.loads((tmp_path / "sft" / "config.json").read_text()) == {"steps": 10}
    with pytest.raises(StaleStage, match="no finished stage"):
        made_by(directory)
    assert Stage(directory, "sft", {"steps": 10}, {"examples": "abc"}).open() == "resume"  # killed mid-way
    stage.finish({"loss": 0.5})
    again = Stage(directory, "sft", {"steps": 10}, {"examples": "abc"})
    assert again.open() == "done" and again.summary() == {"loss": 0.5}
    assert made_by(directory) == stage.fingerprint


def test_another_config_or_other_inputs_are_refused_unless_rerun(tmp_path):
    directory = str(tmp_path / "rl")
    first = Stage(directory, "rl", {"optim": {"lr": 0.1}, "steps": 4}, {"policy": "p1"})
    first.open()
    (tmp_path / "rl" / "checkpoint").write_text("old")
    first.finish()
    with pytest.raises(StaleStage, match=r"config changed: optim.lr: 0.1 -> 0.2") as stale:
        Stage(directory, "rl", {"optim": {"lr": 0.2}, "steps": 4}, {"policy": "p1"}).open()
    assert "--rerun" in str(stale.value)
    with pytest.raises(StaleStage, match=r"inputs changed: policy"):
        Stage(directory, "rl", {"optim": {"lr": 0.1}, "steps": 4}, {"policy": "p2"}).open()
    redo = Stage(directory, "rl", {"optim": {"lr": 0.2}, "steps": 4}, {"policy": "p2"})
    assert redo.open(rerun=True) == "new" and not (tmp_path / "rl" / "checkpoint").exists()  # the old output is gone
    assert redo.fingerprint != first.fingerprint


def test_output_with_no_record_is_not_trusted(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "instances.jsonl").write_text("{}\n")
    with pytest.raises(StaleStage, match="no stage record"):
        Stage(str(tmp_path / "tasks"), "tasks", {}).open()
    assert Stage(str(tmp_path / "tasks"), "tasks", {}).open(rerun=True) == "new"
    assert set(os.listdir(tmp_path / "tasks")) == {"config.json", "stage.json"}  # the untrusted output is gone
    (tmp_path / "a").write_bytes(b"x" * 3)
    assert file_fingerprint(str(tmp_path / "a")) != file_fingerprint(str(tmp_path / "tasks" / "stage.json"))


def _make_stage(directory: str, started: str, release: str) -> None:
    """Another process: open the stage, say so, wait for the word to finish, finish."""
    stage = Stage(directory, "teacher", {"samples": 2})
    assert stage.open() == "new"
    open(started, "w").close()
    while not os.path.exists(release):
        time.sleep(0.01)
    stage.finish({"kept": 3})


def test_a_second_process_waits_for_a_stage_another_is_making_and_then_reuses_it(tmp_path):
    directory, started, release = str(tmp_path / "teacher"), str(tmp_path / "started"), str(tmp_path / "release")
    maker = multiprocessing.get_context("spawn").Process(target=_make_stage, args=(directory, started, release))
    maker.start()
    try:
        while not os.path.exists(started):
            assert maker.is_alive()
            time.sleep(0.01)
        threading.Timer(0.3, lambda: open(release, "w").close()).start()
        stage = Stage(directory, "teacher", {"samples": 2})
        # Without the lock this would be "resume": the record says running while the other process makes it.
        assert stage.open() == "done" and stage.summary() == {"kept": 3}
    finally:
        open(release, "w").close()
        maker.join(timeout=60)
    assert maker.exitcode == 0
    again = Stage(directory, "teacher", {"samples": 2})
    assert again.open() == "done"  # in this process too, reopening what it reused
