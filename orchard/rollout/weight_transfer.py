"""``NcclWeightTransfer``: vLLM's native weight transfer over NCCL, a :class:`~orchard.rollout.openai_engine.WeightSync`.

The weights go from the learner's GPU memory to every vLLM worker's in NCCL broadcasts, with no
checkpoint on disk; vLLM's HTTP routes carry only the control. Read in vLLM's source (main branch, as
stored in the search index: ``vllm/entrypoints/rl/online/api_router.py`` at 39929f1,
``vllm/distributed/weight_transfer/nccl_engine.py`` at 04b06ef and ``base.py`` at 02f250b,
``vllm/distributed/utils.py`` (``StatelessProcessGroup``), ``vllm/distributed/device_communicators/pynccl.py``,
and the example ``examples/rl/rlhf_http_nccl.py`` at 27cb2fe). The routes are mounted only with
``VLLM_SERVER_DEV_MODE=1``, and the server must be started with
``--weight-transfer-config '{"backend": "nccl"}'``:

- ``GET /get_world_size`` → ``{"world_size": n}``: the replica's workers (TP x PP x DP).
- ``POST /init_weight_transfer_engine`` ``{"init_info": {"master_address", "master_port", "rank_offset",
  "world_size"}}`` → ``{"message": "Weight transfer initialized"}``. Every worker joins a
  ``StatelessProcessGroup`` at ``rank_offset`` + its own rank and builds a ``PyNcclCommunicator``; the
  call returns only once the whole group has formed, so the trainer joins (rank 0) while it waits.
- ``POST /start_weight_update`` (no body) → ``{"message": "Weight update started"}``: checkpoint-format
  engines begin a layerwise reload, so the tensors sent are the checkpoint's (HF names and layout).
- ``POST /update_weights`` ``{"update_info": {"names", "dtype_names", "shapes", "packed"}}`` →
  ``{"message": "Weights updated"}``: each worker allocates every announced tensor in turn
  (``getattr(torch, dtype_name)``), receives it in an NCCL broadcast from rank 0 and loads it; the call
  returns once all have arrived, so the trainer broadcasts while it waits.
- ``POST /finish_weight_update`` ``{"weight_version": "<str>"}`` → ``{"message": "Weight update finished"}``.

A missing ``init_info``/``update_info`` is a 400 with vLLM's error body; a failure in the engine is not
caught by these routes (a 500).

One update, as :class:`NcclWeightTransfer` runs it: on first use, ask every replica its world size, give
replica ``i`` the ranks after those of replicas ``0..i-1`` (rank 0 is the trainer: one group spans all
the replicas, and each broadcast reaches them all at once), and join the group; then pause every replica
(``/pause?mode=wait``), ``/start_weight_update``, announce the tensors with ``/update_weights`` (in the
served dtype) and broadcast each, in the announced order, ``/finish_weight_update``, reset the prefix
caches and resume (:func:`~orchard.rollout.openai_engine.while_paused`, shared with the disk sync).

Where this departs from vLLM's own trainer side (``NCCLWeightTransferEngine.trainer_init`` and
``trainer_send_weights``): it imports neither vLLM nor, in this module, JAX, and the trainer's end of the
group is a :class:`Communicator` (:class:`CupyNcclCommunicator`: CuPy's NCCL, with torch's ``TCPStore``
for the rendezvous that ``StatelessProcessGroup`` does). Tensors are sent one broadcast each
(``packed: false``), not in vLLM's packed buffers. The control calls that wait on the group
(``init_weight_transfer_engine``, ``update_weights``) are never retried: a repeat would wait on
broadcasts that never come.

What a failure leaves: a replica's error names it, and every replica that paused is asked to resume.
After a failure during the transfer the group is dropped and formed again on the next update; a vLLM
worker still waiting in an NCCL receive (NCCL has no timeout of its own) may not answer the resume, and
such a replica needs a restart.

Verified here only against a fake vLLM server (``tests/rollout/test_vllm_fake.py``) with a fake
communicator; :class:`CupyNcclCommunicator` has never run (no GPU here; see ``experiments/gpu_check``).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from orchard.rollout.openai_client import OpenAIClient, OpenAIError, RetryPolicy
from orchard.rollout.openai_engine import control, on_all, raise_first, while_paused
from orchard.rollout.types import Weights

if TYPE_CHECKING:
    from orchard.rollout.openai_engine import OpenAIEngine

ONCE = RetryPolicy(max_retries=0)  # for the calls that wait on the NCCL group: a repeat would wait forever

# NCCL's ncclDataType_t, by the dtype names vLLM's update_info uses (torch's attribute names).
NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
               "float32": 7, "float64": 8, "bfloat16": 9}
NCCL_SUM = 0
# Where vLLM's workers read the NCCL unique id that rank 0 publishes (StatelessProcessGroup.broadcast_obj's
# first key) and the class it unpickles it as (vllm/distributed/device_communicators/pynccl_wrapper.py).
UNIQUE_ID_KEY = "broadcast_from/0/0"
UNIQUE_ID_CLASS = ("vllm.distributed.device_communicators.pynccl_wrapper", "ncclUniqueId")


class WeightTransferError(OpenAIError):
    """A weight transfer that failed in the data plane (the NCCL group), not in one replica's route."""


class Communicator(Protocol):
    """The trainer's end of the weight-transfer group: rank 0, the sender."""

    def init(self, master_address: str, master_port: int, rank: int, world_size: int) -> None:
        """Form the group with the ``world_size - 1`` workers that join it at ``master_address:master_port``
        (returns once the group has formed)."""
        ...

    def broadcast(self, array: Any) -> None:
        """Send ``array`` (a JAX array, in the dtype and shape announced) from this rank to every other."""
        ...

    def close(self) -> None:
        """Leave the group."""
        ...


class NcclWeightTransfer:
    """Sync weights to vLLM replicas over NCCL (the module docstring has the protocol).

    ``master_address`` must be an address of this host that every replica's workers reach, and
    ``master_port`` a free port on it (rank 0 hosts the rendezvous store there). ``dtype`` is the dtype
    the servers hold the weights in (``None``: the parameters' own); the tensors are cast to it on the
    learner's devices. ``communicator`` defaults to :class:`CupyNcclCommunicator`. The weights handed to
    it must be a :class:`~orchard.models.weights.ModelWeights` (its graph gives the HF names).
    """

    def __init__(self, master_address: str, master_port: int, dtype: str | None = None,
                 communicator: Communicator | None = None) -> None:
        self.master_address, self.master_port, self.dtype = master_address, master_port, dtype
        self.communicator = communicator if communicator is not None else CupyNcclCommunicator()
        self.group: list[str] | None = None  # the roots of the replicas in the group, once it has formed

    def __call__(self, weights: Weights, engine: OpenAIEngine) -> None:
        replicas = engine.replicas
        if self.group != [r.root for r in replicas]:
            self.connect(replicas)
        from orchard.models.weights import hf_tensor_specs  # JAX only where weights are sent

        specs = hf_tensor_specs(weights, self.dtype)
        info = {"names": [name for name, _, _ in specs], "dtype_names": [dtype for _, _, dtype in specs],
                "shapes": [list(shape) for _, shape, _ in specs], "packed": False}
        while_paused(replicas, lambda: self.transfer(replicas, weights, info))

    def connect(self, replicas: list[OpenAIClient]) -> None:
        """Form the group: rank 0 here, then each replica's workers in turn (its world size from
        ``/get_world_size``)."""
        self.close()
        sizes = [_world_size(replica) for replica in replicas]
        world_size = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(replicas))]
        init = {"master_address": self.master_address, "master_port": self.master_port, "world_size": world_size}
        pool = ThreadPoolExecutor(len(replicas))
        futures = [pool.submit(control, replica, "/init_weight_transfer_engine",
                               {"init_info": {**init, "rank_offset": offset}}, ONCE)
                   for replica, offset in zip(replicas, offsets, strict=True)]
        try:
            self.communicator.init(self.master_address, self.master_port, 0, world_size)
        except BaseException as exc:
            pool.shutdown(wait=False, cancel_futures=True)
            self.communicator.close()
            raise_first(_failed(futures))  # a replica that refused names itself
            raise WeightTransferError(f"weight sync: forming the NCCL group at {self.master_address}:"
                                      f"{self.master_port} with {_roots(replicas)} failed: {exc}") from exc
        pool.shutdown(wait=True)
        if (error := _failed(futures)) is not None:
            self.communicator.close()
            raise error
        self.group = [r.root for r in replicas]

    def transfer(self, replicas: list[OpenAIClient], weights: Weights, info: dict[str, Any]) -> None:
        """The update proper (the replicas paused): start, announce and broadcast every tensor, finish."""
        from orchard.models.weights import hf_tensors

        raise_first(on_all(replicas, lambda r: control(r, "/start_weight_update"))[1])
        pool = ThreadPoolExecutor(len(replicas))
        futures = [pool.submit(control, replica, "/update_weights", {"update_info": info}, ONCE)
                   for replica in replicas]
        count, name = len(info["names"]), None
        try:
            for i, (name, tensor) in enumerate(hf_tensors(weights, self.dtype)):
                raise_first(_failed(futures))  # a replica that refused the announcement receives nothing
                if name != info["names"][i]:
                    raise WeightTransferError(f"weight sync: tensor {i} is {name}, announced {info['names'][i]}")
                self.communicator.broadcast(tensor)
        except BaseException as exc:
            pool.shutdown(wait=False, cancel_futures=True)
            self.close()  # the group's state is unknown: form it again next time
            raise_first(_failed(futures))
            if isinstance(exc, OpenAIError):
                raise
            raise WeightTransferError(f"weight sync: broadcasting {name} (of {count} tensors) to replicas "
                                      f"{_roots(replicas)} failed: {exc}") from exc
        pool.shutdown(wait=True)
        raise_first(_failed(futures))
        version = {"weight_version": str(weights.version)}
        raise_first(on_all(replicas, lambda r: control(r, "/finish_weight_update", version))[1])

    def close(self) -> None:
        """Leave the group (the next update forms it again)."""
        if self.group is not None:
            self.group = None
            self.communicator.close()


def _world_size(replica: OpenAIClient) -> int:
    try:
        reply = replica.get("/get_world_size")
        return int(reply["world_size"])
    except (OpenAIError, KeyError, TypeError, ValueError) as exc:
        raise OpenAIError(f"weight sync: replica {replica.root} gave no world size (/get_world_size: {exc}); "
                          "serve it with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config "
                          "'{\"backend\": \"nccl\"}'", getattr(exc, "status", None)) from exc


def _failed(futures: list[Future]) -> BaseException | None:
    """The first error among the calls that have finished (those still waiting are not waited for)."""
    return next((f.exception() for f in futures if f.done() and not f.cancelled() and f.exception()), None)


def _roots(replicas: list[OpenAIClient]) -> str:
    return ", ".join(r.root for r in replicas)


def nccl_unique_id_pickle(unique_id: bytes) -> bytes:
    """The pickle vLLM's workers read as rank 0's NCCL unique id: a ``ncclUniqueId`` (a ctypes structure of
    128 bytes, ``internal``) as ``pickle.dumps`` writes one (``_ctypes._unpickle(cls, (__dict__, bytes))``),
    written by hand, so the learner needs no vLLM to name the class."""
    if len(unique_id) != 128:
        raise ValueError(f"an NCCL unique id has 128 bytes, not {len(unique_id)}")
    module, name = UNIQUE_ID_CLASS
    return (b"\x80\x03c_ctypes\n_unpickle\n" + f"c{module}\n{name}\n".encode()
            + b"}C\x80" + unique_id + b"\x86\x86R.")


class CupyNcclCommunicator:
    """Rank 0 of vLLM's weight-transfer group, over CuPy's NCCL bindings (``cupy.cuda.nccl``).

    It does what vLLM's ``StatelessProcessGroup.create`` and ``PyNcclCommunicator`` do on rank 0: host a
    torch ``TCPStore`` at the master address (``use_libuv=False``, as vLLM's), publish an NCCL unique id
    under ``broadcast_from/0/0`` as the pickle the workers read (:func:`nccl_unique_id_pickle`), join the
    communicator as rank 0, and take part in its warm-up (an all-reduce of one float32 zero). Each
    broadcast hands the JAX array to CuPy through DLPack (a bfloat16 array as its uint16 bits: CuPy has no
    bfloat16) and waits for it on the communicator's stream. A sharded array is first gathered onto one
    device. Needs ``cupy-cuda12x`` and ``torch`` (the CPU build is enough: only its ``TCPStore`` is used),
    never vLLM.

    Untested: this machine has no GPU, and no run on one has happened yet. NCCL refuses two ranks on one
    GPU, so the learner and the vLLM workers it sends to must be on different GPUs.
    """

    def __init__(self, store_timeout: float = 300.0) -> None:
        self.store_timeout = store_timeout
        self._store: Any = None
        self._comm: Any = None
        self._stream: Any = None

    def init(self, master_address: str, master_port: int, rank: int, world_size: int) -> None:
        if rank != 0:
            raise ValueError("the trainer is rank 0 of the weight-transfer group (it hosts the store)")
        import cupy
        from cupy.cuda import nccl
        from torch.distributed import TCPStore

        self._store = TCPStore(master_address, master_port, world_size, is_master=True,
                               timeout=timedelta(seconds=self.store_timeout), wait_for_workers=False,
                               use_libuv=False)
        unique_id = nccl.get_unique_id()
        self._store.set(UNIQUE_ID_KEY, nccl_unique_id_pickle(bytes(b & 0xFF for b in unique_id)))
        self._comm = nccl.NcclCommunicator(world_size, unique_id, 0)
        self._stream = cupy.cuda.Stream(non_blocking=True)
        warm = cupy.zeros(1, dtype=cupy.float32)
        self._comm.allReduce(warm.data.ptr, warm.data.ptr, 1, NCCL_DTYPES["float32"], NCCL_SUM, self._stream.ptr)
        self._stream.synchronize()

    def broadcast(self, array: Any) -> None:
        import cupy
        import jax
        import jax.numpy as jnp

        if len(array.sharding.device_set) > 1:
            array = jax.device_put(array, jax.local_devices()[0])
        name = jnp.dtype(array.dtype).name
        if name not in NCCL_DTYPES:
            raise ValueError(f"NCCL cannot send {name}")
        if name == "bfloat16":
            array = jax.lax.bitcast_convert_type(array, jnp.uint16)
        buffer = cupy.from_dlpack(array)
        self._comm.broadcast(buffer.data.ptr, buffer.data.ptr, buffer.size, NCCL_DTYPES[name], 0, self._stream.ptr)
        self._stream.synchronize()

    def close(self) -> None:
        if self._comm is not None:
            self._comm.destroy()
        self._comm = self._store = self._stream = None
