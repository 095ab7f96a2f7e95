"""NcclWeightTransfer against fake vLLM replicas that answer vLLM's weight-transfer routes as its source does,
with a fake NCCL group (tests/rollout/test_vllm_fake.py) in place of the trainer's communicator. The real
communicator (CuPy's NCCL) needs GPUs: only its unique-id pickle is checked here."""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
import types

import numpy as np
import pytest
from safetensors import safe_open

from orchard.models.weights import ModelWeights, hf_tensor_specs, save_pretrained
from orchard.rollout.openai_client import OpenAIError
from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
from orchard.rollout.weight_transfer import (
    UNIQUE_ID_CLASS,
    CupyNcclCommunicator,
    NcclWeightTransfer,
    WeightTransferError,
    nccl_unique_id_pickle,
)
from orchard.train.rl import EngineConfig, make_engine
from tests.rollout.test_vllm_fake import FAST, FakeNcclGroup, tiny

JOIN = ["/get_world_size", "/init_weight_transfer_engine"]
UPDATE = ["/pause?mode=wait", "/start_weight_update", "/update_weights", "/finish_weight_update",
          "/reset_prefix_cache", "/resume"]


def nccl_engine(group: FakeNcclGroup, *fakes) -> OpenAIEngine:
    sync = NcclWeightTransfer("10.1.2.3", 29555, dtype="bfloat16", communicator=group)
    return OpenAIEngine([fake.url for fake in fakes], "policy", weight_sync=sync, retry=FAST)


def body(fake, path: str) -> list:
    return [sent for called, sent in fake.calls if called == path]


def hf_checkpoint(model, tmp_path) -> dict[str, np.ndarray]:
    """The model's tensors as save_pretrained writes them (fp32), by name, in file order."""
    save_pretrained(model, str(tmp_path))
    with safe_open(str(tmp_path / "model.safetensors"), "np") as tensors:
        return {name: tensors.get_tensor(name) for name in tensors.keys()}  # noqa: SIM118


def test_one_group_spans_every_replica_and_each_update_follows_vllms_order(replicas, tmp_path):
    group = FakeNcclGroup()
    wide, narrow = replicas(nccl=group, world_size=2), replicas(nccl=group)
    engine = nccl_engine(group, wide, narrow)
    for version in (1, 2):
        engine.update_weights(ModelWeights.of(tiny(seed=version), version))
    assert group.trainer_inits == [("10.1.2.3", 29555, 0, 4)]  # trainer 0, wide's workers 1-2, narrow's 3
    inits = [body(fake, "/init_weight_transfer_engine") for fake in (wide, narrow)]
    assert inits == [[{"init_info": {"master_address": "10.1.2.3", "master_port": 29555, "world_size": 4,
                                     "rank_offset": offset}}] for offset in (1, 3)]
    checkpoint = hf_checkpoint(tiny(seed=2), tmp_path)
    for fake in (wide, narrow):
        assert fake.sync_calls() == JOIN + UPDATE * 2 and not fake.paused
        assert body(fake, "/start_weight_update") == [None, None]
        assert body(fake, "/finish_weight_update") == [{"weight_version": "1"}, {"weight_version": "2"}]
        [info, _] = [sent["update_info"] for sent in body(fake, "/update_weights")]
        assert info["names"] == list(checkpoint) and info["packed"] is False  # save_pretrained's names and order
        assert info["shapes"] == [list(t.shape) for t in checkpoint.values()]
        assert set(info["dtype_names"]) == {"bfloat16"}  # the served dtype
        assert list(fake.received) == list(checkpoint)
        for name, tensor in checkpoint.items():  # the last update's values, in the HF layout
            np.testing.assert_allclose(fake.received[name].astype(np.float32), tensor, rtol=1e-2, atol=1e-2,
                                       err_msg=name)
    assert len(group.sent) == 2 * len(checkpoint)  # each tensor broadcast once an update, to both replicas
    assert engine.weight_version == 2 and group.closes == 0


def test_a_broadcast_that_fails_midway_resumes_every_replica_and_the_next_update_forms_the_group_again(replicas):
    group = FakeNcclGroup(timeout=1.0, fail_at=3)
    first, second = replicas(nccl=group), replicas(nccl=group)
    engine = nccl_engine(group, first, second)
    engine.weight_version = 0
    names = [name for name, _, _ in hf_tensor_specs(tiny(), "bfloat16")]
    with pytest.raises(WeightTransferError, match=f"broadcasting {names[3]} ") as error:
        engine.update_weights(ModelWeights.of(tiny(seed=1), 1))
    assert first.root_url() in str(error.value) and second.root_url() in str(error.value)
    for fake in (first, second):
        assert fake.sync_calls() == JOIN + UPDATE[:3] + ["/resume"] and not fake.paused
    assert engine.weight_version is None and group.closes == 1 and len(group.sent) == 3

    with group.cond:  # the workers' receives give up (vLLM's would wait on: a restart)
        group.cond.wait_for(lambda: not first.receiving and not second.receiving, 5)
    group.fail_at = None
    engine.update_weights(ModelWeights.of(tiny(seed=2), 2))
    assert len(group.trainer_inits) == 2 and engine.weight_version == 2
    assert first.sync_calls()[-len(JOIN + UPDATE):] == JOIN + UPDATE


def test_a_replica_whose_update_fails_is_named_and_every_replica_resumes(replicas):
    group = FakeNcclGroup(timeout=1.0)
    good, bad = replicas(nccl=group), replicas(nccl=group, fail_update=True)
    engine = nccl_engine(group, good, bad)
    with pytest.raises(OpenAIError, match="Internal Server Error") as error:
        engine.update_weights(ModelWeights.of(tiny(), 1))
    assert f"replica {bad.root_url()} failed /update_weights" in str(error.value) and error.value.status == 500
    for fake in (good, bad):
        assert fake.sync_calls()[-1] == "/resume" and not fake.paused
        assert "/finish_weight_update" not in fake.sync_calls()
    assert engine.weight_version is None and group.closes == 1


def test_a_replica_served_without_weight_transfer_is_named_and_nothing_pauses(replicas):
    group = FakeNcclGroup(timeout=1.0)
    ready, plain = replicas(nccl=group), replicas()  # plain: no --weight-transfer-config
    engine = nccl_engine(group, ready, plain)
    with pytest.raises(OpenAIError, match=f"replica {plain.root_url()} failed /init_weight_transfer_engine"):
        engine.update_weights(ModelWeights.of(tiny(), 1))
    assert all("/pause?mode=wait" not in fake.sync_calls() for fake in (ready, plain))
    assert engine.weight_version is None


def test_the_unique_id_pickle_loads_as_vllms_ncclUniqueId(monkeypatch):
    class ncclUniqueId(ctypes.Structure):  # vllm/distributed/device_communicators/pynccl_wrapper.py
        _fields_ = [("internal", ctypes.c_byte * 128)]

    module, name = UNIQUE_ID_CLASS
    parts = module.split(".")
    for i in range(1, len(parts) + 1):  # a stand-in for vLLM's modules, for the unpickler to find the class
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    ncclUniqueId.__module__, ncclUniqueId.__qualname__ = module, name
    setattr(sys.modules[module], name, ncclUniqueId)
    unique_id = os.urandom(128)
    loaded = pickle.loads(nccl_unique_id_pickle(unique_id))
    assert isinstance(loaded, ncclUniqueId) and bytes(loaded) == unique_id
    assert bytes(pickle.loads(pickle.dumps(loaded))) == unique_id  # what pickle itself writes reads the same
    with pytest.raises(ValueError, match="128 bytes"):
        nccl_unique_id_pickle(b"short")


def test_the_engine_config_picks_the_weight_sync(tmp_path):
    served = str(tmp_path)
    with open(os.path.join(served, "config.json"), "w") as handle:
        handle.write('{"torch_dtype": "bfloat16"}')
    disk = make_engine(EngineConfig(kind="vllm", url="http://a:8000", weights_dir=served), None, None)
    assert isinstance(disk.weight_sync, ReloadFromDisk)
    nccl = make_engine(EngineConfig(kind="vllm", url="http://a:8000,http://b:8000", weights_dir=served,
                                    weight_sync="nccl", nccl_master_address="10.0.0.5", nccl_master_port=29600),
                       None, None)
    sync = nccl.weight_sync
    assert isinstance(sync, NcclWeightTransfer) and isinstance(sync.communicator, CupyNcclCommunicator)
    assert (sync.master_address, sync.master_port, sync.dtype) == ("10.0.0.5", 29600, "bfloat16")
    with pytest.raises(ValueError, match="nccl_master_address"):
        make_engine(EngineConfig(kind="vllm", url="http://a:8000", weight_sync="nccl"), None, None)
    with pytest.raises(ValueError, match="unknown weight sync 'ipc'"):
        make_engine(EngineConfig(kind="vllm", url="http://a:8000", weight_sync="ipc"), None, None)
