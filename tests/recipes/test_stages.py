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


def test_lengthening_phases_continue_from_the_policy_before_at_the_same_tokens_a_step(tmp_path):
    config = get_config("tiny")
    config.pretrain.update({"num_steps": 2, "kind": "recall", "examples": 40, "min_span": 4, "max_span": 8,
                            "seq_len": 32, "batch_size": 4, "lengthen": ((3, 30, 64),)})
    settings = SWE.typed(config)
    first, second = settings.pretrain.phases()
    assert (first.num_steps, first.max_span, first.seq_len, first.batch_size, first.examples) == (2, 8, 32, 4, 40)
    assert (second.num_steps, second.max_span, second.seq_len, second.batch_size) == (3, 30, 64, 2)  # 128 tokens
    assert (second.peak_lr, second.final_lr) == (settings.pretrain.final_lr, settings.pretrain.final_lr / 10)
    assert second.examples == 3 * 128 // (4 + 30)  # about as many lessons as its steps read
    tokenizer = Tokenizer.train(CORPUS, 300)
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    policy = pretrain_stage(settings, str(tmp_path), tokenizer, Made(str(tmp_path / "tokenizer"), "t"), rerun=False)
    assert policy.directory == str(tmp_path / "pretrain_2" / "model")
    assert os.path.exists(os.path.join(policy.directory, "tokenizer.json"))
    lessons = [json.loads(line) for line in (tmp_path / "pretrain_data_2" / "train.jsonl").read_text().splitlines()]
    assert len(lessons) == second.examples and max(len(lesson["token_ids"]) for lesson in lessons) > 16
    record = json.loads((tmp_path / "pretrain_2" / "config.json").read_text())
    assert record["model"]["path"] == str(tmp_path / "pretrain" / "model")  # the second phase starts from the first
    assert json.loads((tmp_path / "pretrain_2" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
    config.pretrain.lengthen = ((0, 30, 32),)  # no steps, and rows too short for a 30-token span and its copy
    assert "pretrain.lengthen phase (0, 30, 32) needs steps >= 1" in "\n".join(SWE.check_config(config))
