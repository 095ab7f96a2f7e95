"""One episode of the services: the config it started from, the world, the audit log and the faults."""

from dataclasses import dataclass

from .audit import AuditLog
from .config import ServicesConfig
from .faults import FaultInjector
from .world import World


@dataclass
class Episode:
    """Everything ``POST /_admin/reset`` replaces at once."""

    config: ServicesConfig
    world: World
    audit: AuditLog
    faults: FaultInjector

    @classmethod
    def start(cls, config: ServicesConfig) -> "Episode":
        """A fresh episode: fixtures copied into a new world, an empty audit log, fault counters at zero."""
        return cls(
            config=config,
            world=World.from_config(config),
            audit=AuditLog(),
            faults=FaultInjector(config.seed, config.fault_rate, config.faults),
        )
