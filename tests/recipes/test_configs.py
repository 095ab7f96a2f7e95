"""Every shipped config is the whole record of its run: each field a stage reads is named in the file, none is
left to a dataclass default, and each one passes its family's checks."""

from __future__ import annotations

import importlib

import pytest

from orchard.config import missing_fields
from orchard.recipes.claw import CLAW
from orchard.recipes.claw_cross_harness import ClawCrossConfig
from orchard.recipes.cross_harness import CrossHarnessConfig
from orchard.recipes.gui import GUI
from orchard.recipes.swe import SWE
from orchard.recipes.swe_ablations import CreditConfig, RLStudyConfig, ScaleConfig

SHIPPED = [  # (config file, its variants, the family its stages are, the study blocks beside them)
    ("swe_bar", ("tiny", "qwen3_30b_a3b"), SWE, {}),
    ("gui_grpo", ("tiny", "elements", "smoke", "qwen3vl_4b"), GUI, {}),
    ("claw_grpo", ("tiny", "smoke", "skills", "qwen3_30b_a3b"), CLAW, {}),
    ("swe_cross_harness", ("tiny", "small"), SWE, {"cross": CrossHarnessConfig}),
    ("claw_cross_harness", ("tiny", "small"), CLAW, {"cross": ClawCrossConfig}),
    ("swe_ablations", ("tiny", "small"), SWE, {"credit": CreditConfig, "scale": ScaleConfig, "rl_study": RLStudyConfig}),
]


@pytest.mark.parametrize(("name", "variant", "family", "studies"),
                         [(name, v, family, studies) for name, variants, family, studies in SHIPPED for v in variants],
                         ids=[f"{name}:{v}" for name, variants, _, _ in SHIPPED for v in variants])
def test_a_shipped_config_names_every_field_its_stages_read(name, variant, family, studies):
    config = importlib.import_module(f"configs.{name}").get_config(variant)
    assert family.config_gaps(config) == []
    for block, typed in studies.items():
        assert missing_fields(typed, config[block], block) == []
    assert family.check_config(config) == []


def test_a_field_left_to_its_default_is_named():
    config = importlib.import_module("configs.swe_bar").get_config("tiny")
    del config.rl.engine["weight_sync"]
    del config.sft.examples["selection_seed"]
    del config.model["remat"]
    assert SWE.config_gaps(config) == ["model.remat", "rl.engine.weight_sync", "examples.selection_seed"]
