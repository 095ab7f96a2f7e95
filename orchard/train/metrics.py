"""Training metrics: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard."""

from __future__ import annotations

import json
import os
from typing import Any

from orchard.distributed import is_controller


class MetricsWriter:
    """Appends to ``workdir/metrics.jsonl`` and TensorBoard; in a learner over several processes, only the
    controller writes (the others' writes are dropped)."""

    def __init__(self, workdir: str) -> None:
        from tensorboardX import SummaryWriter

        self.enabled = is_controller()
        if not self.enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._jsonl = open(self.path, "a")  # noqa: SIM115 (closed in close())
        self._tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        scalars = {name: float(value) for name, value in metrics.items()}
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self._jsonl.flush()
        for name, value in scalars.items():
            self._tensorboard.add_scalar(name, value, step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._jsonl.close()
        self._tensorboard.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_metrics(workdir: str) -> dict[int, dict[str, float]]:
    """The last record of every step in ``metrics.jsonl`` (a resumed run logs some steps again)."""
    records: dict[int, dict[str, float]] = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                records.setdefault(record["step"], {}).update(record)
    return records
