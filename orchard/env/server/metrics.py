"""Prometheus metrics of one orchestrator (a registry per app, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sandboxes = Gauge("orchard_sandboxes", "Sandboxes this replica knows about", registry=self.registry)
        self.created = Counter("orchard_sandboxes_created", "Sandboxes created", registry=self.registry)
        self.deleted = Counter("orchard_sandboxes_deleted", "Sandboxes deleted", ["reason"], registry=self.registry)
        self.create_seconds = Histogram("orchard_sandbox_create_seconds", "Create to ready",
                                        registry=self.registry)
        self.snapshot_seconds = Histogram("orchard_snapshot_seconds", "Time to snapshot a sandbox's files",
                                          registry=self.registry)
        self.hot_requests = Counter("orchard_hot_requests", "Requests forwarded to agents", ["route", "status"],
                                    registry=self.registry)
        self.hot_seconds = Histogram(
            "orchard_hot_request_seconds", "Forwarded request latency", ["route"], registry=self.registry,
            buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
