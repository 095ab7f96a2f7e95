"""The shared stages' copying lessons: examples and training in their own folders, the policy SFT starts from."""

from __future__ import annotations

import json
import os

from configs.swe_bar import get_config
from orchard.data.tokenizer import Tokenizer
from orchard.recipes.stages import Made, pretrain_stage, shared_stages, starting_from
from orchard.recipes.swe import SWE

CORPUS = ["def fold_kovel(zantri, pelmu):\n    return zantri + pelmu * 3\n", "$ python -m pytest -q\n1 failed"] * 20


def test_the_lessons_train_a_policy_sft_then_starts_from(tmp_path):
    config = get_config("tiny")
    config.pretrain.update({"num_steps": 2, "examples": 40, "min_span": 4, "max_span": 8, "seq_len": 64,
                            "batch_size": 2})
    settings = SWE.typed(config)
    tokenizer = Tokenizer.train(CORPUS, 300)
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    made = Made(str(tmp_path / "tokenizer"), "tokenizer-fingerprint")
    policy = pretrain_stage(settings, str(tmp_path), tokenizer, made, rerun=False)
    assert policy.directory == str(tmp_path / "pretrain" / "model")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert os.path.exists(os.path.join(policy.directory, name)), name
    lines = (tmp_path / "pretrain_data" / "train.jsonl").read_text().splitlines()
    assert len(lines) == 40 and all(len(json.loads(line)["token_ids"]) <= 16 for line in lines)
    metrics = [json.loads(line) for line in (tmp_path / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 2
    # A rerun finds both stages done and trains nothing more.
    stamp = os.path.getmtime(os.path.join(policy.directory, "model.safetensors"))
    assert pretrain_stage(settings, str(tmp_path), tokenizer, made, rerun=False) == policy
    assert os.path.getmtime(os.path.join(policy.directory, "model.safetensors")) == stamp
    # SFT, and evaluation at init, start from the taught policy.
    started = starting_from(settings, policy.directory)
    assert started.model.path == started.sft.model.path == policy.directory
    assert started.rl == settings.rl and shared_stages(config)[0]["pretrain"] == settings.pretrain
