"""A learner over several processes (hosts): joining them, and the few operations that differ from one process.

On one process (a laptop, one GPU host) every function here is the plain single-process operation, so the
trainers call them unconditionally. On several, a learner is one JAX program over the devices of all of
its processes (``jax.distributed``, multi-controller): every process runs the same trainer code over its
own devices, and

* the **controller** (process 0) alone does what must happen once: tasks, sandboxes, rollouts, weight
  syncs, metrics, progress bars, stage records and file writes (:func:`is_controller`);
* the others follow the controller (:func:`follow`): it leads them into each training stage (:func:`lead`,
  which the trainers call), and they wait for it meanwhile;
* a batch every process holds whole (each runs the same deterministic input pipeline, or receives the
  controller's rows by :func:`broadcast`) becomes one global array of which each process places only
  the rows its devices hold (:func:`global_array`, over ``jax.make_array_from_process_local_data``);
* an array spread over processes is gathered for a writer by :func:`host_array`, a collective every
  process calls (a checkpoint export gathers each parameter in turn; only the controller writes it).

:func:`initialize` joins the processes. The settings come from the environment:

* explicit: ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0), ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID``, or, in a Kubernetes Indexed Job (JobSet), ``JOB_COMPLETION_INDEX`` for the id, so a
  manifest sets the first two and the pod's index is its id (``infra/gke/manifests``);
* detected: on a multi-host TPU slice on GKE (``TPU_WORKER_HOSTNAMES`` names several hosts), JAX's own
  cluster detection, with nothing to set;
* otherwise one process, and nothing to join.

On the CPU, cross-process collectives go over gloo (the tests run two learner processes on one machine).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Sharding

log = logging.getLogger(__name__)

COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "JAX_NUM_PROCESSES"
PROCESS_ID_ENV = "JAX_PROCESS_ID"
INDEXED_JOB_ENV = "JOB_COMPLETION_INDEX"  # a Kubernetes Indexed Job's pod index (JobSet sets it too)
TPU_HOSTS_ENV = "TPU_WORKER_HOSTNAMES"  # GKE's TPU webhook: the slice's hosts, comma-separated


@dataclass(frozen=True)
class ProcessGroup:
    """Explicit settings for ``jax.distributed.initialize``: where process 0 listens, how many processes, which
    one this is."""

    coordinator: str
    num_processes: int
    process_id: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProcessGroup | None:
        """The settings in ``environ`` (default ``os.environ``); None when no coordinator is named. A named
        coordinator without a process count or id is an error that names the variable."""
        environ = os.environ if environ is None else environ
        coordinator = environ.get(COORDINATOR_ENV, "").strip()
        if not coordinator:
            return None
        if ":" not in coordinator:
            raise ValueError(f"{COORDINATOR_ENV}={coordinator!r} is not host:port")
        count = environ.get(NUM_PROCESSES_ENV, "").strip()
        index = environ.get(PROCESS_ID_ENV, environ.get(INDEXED_JOB_ENV, "")).strip()
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{COORDINATOR_ENV} is set, so {NUM_PROCESSES_ENV} must be a process count, got {count!r}")
        if not index.isdigit():
            raise ValueError(f"{COORDINATOR_ENV} is set, so {PROCESS_ID_ENV} (or {INDEXED_JOB_ENV}) must be this "
                             f"process's index, got {index!r}")
        if int(index) >= int(count):
            raise ValueError(f"process id {index} is not below the process count {count}")
        return cls(coordinator, int(count), int(index))


def detected_tpu_slice(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this is one host of a multi-host TPU slice whose peers JAX finds by itself."""
    environ = os.environ if environ is None else environ
    return len([h for h in environ.get(TPU_HOSTS_ENV, "").split(",") if h.strip()]) > 1


def initialize(environ: Mapping[str, str] | None = None) -> None:
    """Join this process to the learner's others (see the module docstring); once per process, before any
    computation. Does nothing on one process, or when already joined."""
    if jax.distributed.is_initialized():
        return
    group = ProcessGroup.from_env(environ)
    if group is None and not detected_tpu_slice(environ):
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the CPU backend's; others ignore it
    if group is None:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(group.coordinator, group.num_processes, group.process_id)
    log.info("process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())


def is_multiprocess() -> bool:
    """Whether this learner spans several processes."""
    return jax.process_count() > 1


def is_controller() -> bool:
    """Whether this process does the once-only work (process 0; the only process on one host)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (nothing on one process), as long as
    :func:`broadcast` waits."""
    if is_multiprocess():
        _coordination_client().wait_at_barrier(f"orchard/{name}/{next(_barriers)}", _wait_ms())


def broadcast(value: Any) -> Any:
    """The controller's ``value`` (any picklable object), on every process; the others' argument is ignored.
    Every process calls it at the same point (the n-th call of each is one broadcast).

    It goes through the coordination service's key-value store, not a device collective, so a process may
    wait in it as long as the controller works alone (an RL step's rollouts, a teacher's collection): up to
    ``ORCHARD_FOLLOWER_WAIT_S`` seconds (default a day). A value is deleted once every process has read it."""
    if not is_multiprocess():
        return value
    client = _coordination_client()
    number = next(_broadcasts)
    key = f"{_PREFIX}/value/{number}"
    if is_controller():
        _forget_read(client)
        client.key_value_set_bytes(key, pickle.dumps(value))
        _unread.append(number)
        return value
    payload = client.blocking_key_value_get_bytes(key, _wait_ms())
    client.key_value_set(f"{_PREFIX}/read/{number}/{jax.process_index()}", "1")
    return pickle.loads(payload)


_PREFIX = "orchard/broadcast"
_broadcasts = itertools.count()
_barriers = itertools.count()
_unread: list[int] = []  # the controller's broadcasts some process has not read yet


def _wait_ms() -> int:
    return int(float(os.environ.get("ORCHARD_FOLLOWER_WAIT_S", 24 * 3600)) * 1000)


def _coordination_client() -> Any:
    from jax._src import distributed as jax_distributed  # the client jax.distributed.initialize connected

    return jax_distributed.global_state.client


def _forget_read(client: Any) -> None:
    """Delete the values every other process has read (the controller's bookkeeping)."""
    for number in list(_unread):
        if len(client.key_value_dir_get(f"{_PREFIX}/read/{number}/")) == jax.process_count() - 1:
            client.key_value_delete(f"{_PREFIX}/value/{number}")
            client.key_value_delete(f"{_PREFIX}/read/{number}/")
            _unread.remove(number)


RELEASE = "release"


def lead(entry: str, **arguments: Any) -> None:
    """On the controller of a learner over several processes: have every other process, waiting in
    :func:`follow`, call its ``entry`` with ``arguments`` (picklable), as the controller is about to do
    itself. Nothing on one process. The trainers lead into themselves (``"sft"``, ``"rl"``)."""
    if is_multiprocess() and is_controller():
        broadcast((entry, arguments))


def follow(entries: Mapping[str, Callable[..., Any]]) -> None:
    """A process other than the controller, for the whole run: call each entry the controller leads into
    (:func:`lead`), in turn, until it calls :func:`release`."""
    while True:
        entry, arguments = broadcast(None)
        if entry == RELEASE:
            return
        if entry not in entries:
            raise RuntimeError(f"the controller led into {entry!r}, which this process does not know "
                               f"(known: {sorted(entries)})")
        entries[entry](**arguments)


def release() -> None:
    """On the controller: end the other processes' :func:`follow` (at the end of the run)."""
    if is_multiprocess() and is_controller():
        broadcast((RELEASE, {}))


def local_block(sharding: Sharding, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The block of a global array of ``shape`` that this process's devices hold under ``sharding``
    (the bounding box of their shards: a contiguous block on meshes laid out by
    :func:`orchard.models.sharding.make_mesh`)."""
    indices = list(sharding.addressable_devices_indices_map(shape).values())
    block = []
    for dim, size in enumerate(shape):
        starts = [index[dim].indices(size)[0] for index in indices]
        stops = [index[dim].indices(size)[1] for index in indices]
        block.append(slice(min(starts), max(stops)))
    return tuple(block)


def global_array(value: np.ndarray, sharding: Sharding) -> jax.Array:
    """The global array ``value`` (which every process holds whole, equal) placed by ``sharding``: each
    process hands over only its block (:func:`local_block`). On one process, ``jax.device_put``."""
    value = np.asarray(value)
    if not is_multiprocess():
        return jax.device_put(value, sharding)
    local = np.ascontiguousarray(value[local_block(sharding, value.shape)])
    return jax.make_array_from_process_local_data(sharding, local, value.shape)


def global_batch(batch: Mapping[str, np.ndarray], sharding: Sharding) -> dict[str, jax.Array]:
    """:func:`global_array` of each array of a batch."""
    return {name: global_array(value, sharding) for name, value in batch.items()}


def host_array(value: jax.Array) -> np.ndarray:
    """The whole of ``value`` in this host's memory. For an array spread over processes, a collective (every
    process calls it; each gets the whole)."""
    if not isinstance(value, jax.Array) or value.is_fully_addressable:
        return np.asarray(jax.device_get(value))
    return np.asarray(multihost_utils.process_allgather(value, tiled=True))
