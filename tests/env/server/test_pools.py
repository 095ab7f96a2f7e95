"""Warm pools: a matching create claims a ready sandbox, the pool refills, idle members stay out of
the listing, failures are reported without a retry storm, and removing a pool deletes its members."""

from __future__ import annotations

import os

import pytest

from orchard.env import InvalidRequest
from tests.conftest import wait_until

SPEC = {"memory": "384Mi", "env": {"POOLED": "yes"}}  # a shape no other test creates


def _pool(client, **spec):
    [pool] = [p for p in client.pools() if p.spec.memory == spec.get("memory", SPEC["memory"])]
    return pool


def test_a_matching_create_claims_a_ready_sandbox_and_the_pool_refills(client, orchestrator):
    client.set_pool(2, **SPEC)
    try:
        wait_until(lambda: _pool(client).ready == 2, timeout=60, what="the pool to fill")
        # Idle members are sandboxes on disk that the listing leaves out.
        idle_dirs = set(os.listdir(os.path.join(orchestrator.state_dir, "sandboxes"))) - {
            info.id for info in client.list()}
        assert len(idle_dirs) == 2

        with client.create(**SPEC, ttl=45, labels={"run": "a"}) as claimed:
            assert claimed.id in idle_dirs  # a claim, not a new sandbox
            assert claimed.info.spec.ttl == 45 and claimed.info.spec.labels == {"run": "a"}
            assert claimed.exec("echo $POOLED").stdout == "yes\n"
            assert claimed.id in {info.id for info in client.list()}
            pool = _pool(client)
            assert pool.claims == 1 and pool.misses == 0
            wait_until(lambda: _pool(client).ready == 2, timeout=60, what="the pool to refill")

        with client.create(memory="384Mi") as other:  # another shape (no env): not from the pool
            assert other.id not in idle_dirs
        assert _pool(client).claims == 1
    finally:
        client.set_pool(0, **SPEC)
    assert not [p for p in client.pools() if p.spec.memory == "384Mi"]
    wait_until(lambda: not set(os.listdir(os.path.join(orchestrator.state_dir, "sandboxes"))) & idle_dirs,
               timeout=30, what="idle members to be deleted")


def test_a_failing_pool_reports_its_error_and_backs_off(client):
    client.set_pool(1, memory="320Mi", from_snapshot="0" * 32)
    try:
        wait_until(lambda: _pool(client, memory="320Mi").last_error, timeout=30, what="the error")
        pool = _pool(client, memory="320Mi")
        assert "no snapshot" in pool.last_error and pool.ready == 0
    finally:
        client.set_pool(0, memory="320Mi", from_snapshot="0" * 32)


def test_bad_pool_requests_are_refused(client):
    with pytest.raises(InvalidRequest):
        client.set_pool(-1, **SPEC)
    with pytest.raises(InvalidRequest):
        client.set_pool(5000, **SPEC)
    with pytest.raises(InvalidRequest):
        client.set_pool(1, memory="lots")


def test_removing_a_pool_while_it_fills_leaves_nothing(client, orchestrator):
    sandboxes = os.path.join(orchestrator.state_dir, "sandboxes")
    before = set(os.listdir(sandboxes))
    client.set_pool(4, memory="320Mi")
    wait_until(lambda: set(os.listdir(sandboxes)) - before, what="the pool's creates to start")
    client.set_pool(0, memory="320Mi")  # its creates are cancelled mid-start: each deletes its sandbox
    wait_until(lambda: set(os.listdir(sandboxes)) <= before, timeout=30, what="nothing left of the pool")
    assert not [p for p in client.pools() if p.spec.memory == "320Mi"]
