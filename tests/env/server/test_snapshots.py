"""Snapshots and fork: a sandbox's files, deletions and private directories carried into new,
independent sandboxes; bad references get clear errors."""

from __future__ import annotations

import os

import pytest

from orchard.env import InvalidRequest, SandboxNotFound
from orchard.env.client import SnapshotNotFound

SET_UP = ("mkdir -p repo && echo v1 > repo/code.py && echo cache > /tmp/build.log && rm /etc/hostname "
          "&& mkdir -p /root/.local && echo pip > /root/.local/site")


def test_a_snapshot_carries_files_deletions_and_private_dirs(client, orchestrator):
    with client.create() as source:
        source.exec(SET_UP).check()
        snapshot = source.snapshot()
        assert snapshot.source == source.id and snapshot.size_bytes > 0
        assert snapshot.id in {s.id for s in client.snapshots()}
        source.exec("echo v2 > repo/code.py && touch late").check()  # after the snapshot: not in it

        with client.create(from_snapshot=snapshot.id) as copy:
            out = copy.exec("cat repo/code.py /tmp/build.log /root/.local/site; test -e /etc/hostname; echo $?; "
                            "test -e late; echo $?").stdout
            assert out.split() == ["v1", "cache", "pip", "1", "1"]
            copy.exec("echo mine > repo/code.py").check()
            assert source.exec("cat repo/code.py").stdout == "v2\n"  # independent both ways
            # A snapshot can go while sandboxes made from it live: each has its own copy.
            client.delete_snapshot(snapshot.id)
            assert snapshot.id not in {s.id for s in client.snapshots()}
            assert copy.exec("cat repo/code.py").stdout == "mine\n"
    assert not os.path.exists(os.path.join(orchestrator.state_dir, "snapshots", snapshot.id))


def test_fork_gives_independent_copies_and_keeps_no_snapshot(client):
    before = {s.id for s in client.snapshots()}
    with client.create(env={"TASK": "t1"}, ttl=300) as source:
        source.exec(SET_UP).check()
        forks = source.fork(3, ttl=120)
        try:
            assert len({f.id for f in forks} | {source.id}) == 4
            assert all(f.info.spec.ttl == 120 for f in forks)
            for index, fork in enumerate(forks):
                fork.exec(f"echo rollout{index} >> repo/code.py").check()
            for index, fork in enumerate(forks):
                assert fork.exec("cat repo/code.py; echo $TASK").stdout == f"v1\nrollout{index}\nt1\n"
            assert source.exec("cat repo/code.py").stdout == "v1\n"
        finally:
            for fork in forks:
                fork.delete()
    assert {s.id for s in client.snapshots()} == before  # the fork's own snapshot is gone


def test_snapshot_errors_are_clear(client):
    with pytest.raises(SnapshotNotFound):
        client.create(from_snapshot="0" * 32)
    with pytest.raises(SnapshotNotFound):
        client.delete_snapshot("0" * 32)
    with pytest.raises(InvalidRequest):
        client.create(from_snapshot="../../etc")
    with pytest.raises(SandboxNotFound):
        client.get("f" * 32)
    with client.create() as sandbox:
        with pytest.raises(InvalidRequest):
            sandbox.fork(0)
        sandbox.delete()
        with pytest.raises(SandboxNotFound):
            sandbox.snapshot()
