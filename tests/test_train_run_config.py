"""Typed configs and the one option parser: --set, PE specs and Python values follow the same rules."""

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from pope.encodings import parse_pe_spec
from pope.model import GPTConfig
from pope.parsing import parse_value
from pope.presets import PRESETS, Recipe, get_preset
from pope.train.run_config import RunConfig, TrainOptions, parse_overrides, resolve_run_config

RESULTS = Path(__file__).resolve().parents[1] / "results"
MODEL = dict(vocab_size=10, n_layer=1, n_head=2, d_model=8, max_seq_len=8)


@pytest.mark.parametrize(
    "word, value",
    [
        ("true", True),
        ("YES", True),
        ("On", True),
        ("1", True),
        ("false", False),
        ("no", False),
        ("OFF", False),
        ("0", False),
    ],
)
def test_one_boolean_rule_for_set_and_pe_specs(word, value):
    assert parse_pe_spec(f"pope:use_delta={word}")[1]["use_delta"] is value
    assert parse_overrides([f"train.compile={word}"])["train"]["compile"] is value


def test_bad_words_and_numbers_name_the_key_and_what_is_accepted():
    with pytest.raises(ValueError, match=r"use_delta='maybe'.*true/false \(also yes/no, on/off, 1/0\)"):
        parse_pe_spec("pope:use_delta=maybe")
    with pytest.raises(ValueError, match=r"train\.tensorboard='nope'.*true/false"):
        parse_overrides(["train.tensorboard=nope"])
    with pytest.raises(ValueError, match=r"model\.n_layer='2\.0'.*an integer"):
        parse_overrides(["model.n_layer=2.0"])
    with pytest.raises(ValueError, match="an integer"):
        parse_overrides(["model.n_layer=true"])
    with pytest.raises(ValueError, match=r"rotary_dim='2\.0'.*an integer or none"):
        parse_pe_spec("pope:rotary_dim=2.0")
    with pytest.raises(ValueError, match=r"train\.device='gpu'.*one of 'auto', 'cpu', 'cuda'"):
        parse_overrides(["train.device=gpu"])
    assert parse_overrides(["train.eval_batch_size=none"])["train"]["eval_batch_size"] is None
    assert parse_value("3", float, key="x") == 3.0 and parse_value(" 7 ", int, key="x") == 7


def test_repeated_options_are_errors():
    with pytest.raises(ValueError, match="'use_delta' is given twice"):
        parse_pe_spec("pope:use_delta=false,use_delta=true")
    with pytest.raises(ValueError, match="'recipe.lr' is given twice"):
        parse_overrides(["recipe.lr=1e-3", "recipe.lr=2e-3"])


def test_python_configs_take_real_types():
    with pytest.raises(TypeError, match=r"GPTConfig\.n_kv_head must be an int or None; got 2\.0 \(float\)"):
        GPTConfig(**MODEL, n_kv_head=2.0)
    with pytest.raises(TypeError, match=r"GPTConfig\.tie_embeddings must be True or False; got 'no'"):
        GPTConfig(**MODEL, tie_embeddings="no")
    with pytest.raises(TypeError, match="GPTConfig.n_layer"):
        GPTConfig(**{**MODEL, "n_layer": True})
    assert GPTConfig(**MODEL, dropout=0).dropout == 0.0 and isinstance(GPTConfig(**MODEL, dropout=0).dropout, float)
    with pytest.raises(TypeError, match="TrainOptions.compile must be True or False or None"):
        TrainOptions(compile="no")
    with pytest.raises(ValueError, match="TrainOptions.parallel must be one of 'ddp', 'fsdp'"):
        TrainOptions(parallel="zero3")
    with pytest.raises(TypeError, match="Recipe.max_steps must be an int"):
        replace(get_preset("jsb").recipe, max_steps=10.0)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.stop_at_step=-1", r"train\.stop_at_step must be positive"),
        ("train.stop_at_step=0", r"train\.stop_at_step must be positive"),
        ("train.stop_at_step=301", r"train\.stop_at_step 301 is past recipe\.max_steps 300"),
        ("train.max_seconds=0", r"train\.max_seconds must be positive"),
        ("train.log_interval=0", r"train\.log_interval must be positive"),
        ("train.data_seed=-2", r"train\.data_seed must be non-negative"),
        (
            "recipe.warmup_steps=301",
            r"recipe\.warmup_steps \(301\) must be in \[0, recipe\.max_steps = 300\]; set one that fits, e\.g\. "
            r"--set recipe\.warmup_steps=30, or leave it unset",
        ),
    ],
)
def test_out_of_range_values_are_refused_with_the_fix(override, message):
    with pytest.raises(ValueError, match=message):
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=[override])


def test_negative_seed_is_refused():
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        resolve_run_config("indirect-indexing-tiny", "pope", seed=-1)


def test_run_config_is_typed_and_config_json_keeps_its_layout():
    config = resolve_run_config("jsb-tiny", "pope:use_delta=no", seed=2, overrides=["train.device=cpu"])
    assert isinstance(config.model, GPTConfig) and isinstance(config.recipe, Recipe)
    assert config.train.device == "cpu" and config.model.pe == "pope:use_delta=no,delta_init=uniform"
    data = config.to_dict()
    assert set(data) == {"preset", "pe", "seed", "model", "recipe", "train"}
    assert RunConfig.from_dict(json.loads(json.dumps(data))) == config
    with pytest.raises(ValueError, match="unknown run-config keys"):
        RunConfig.from_dict({**data, "extra": 1})
    with pytest.raises(ValueError, match="unknown TrainOptions fields"):
        RunConfig.from_dict({**data, "train": {**data["train"], "devices": "cpu"}})
    # config.json of runs written before the typed config (every run of results/*/runs.csv) load unchanged (and
    # would resume)
    stored = [json.loads(row["config"]) for table in RESULTS.glob("*/runs.csv") for row in csv.DictReader(table.open())]
    assert len(stored) > 100
    for config in stored:
        assert RunConfig.from_dict(config).to_dict() == config


# The *-tiny presets as they were written out by hand before tiny() derived them from the full presets:
# shared values, then each preset's own (model fields, recipe fields, PoPE delta init).
_TINY_MODEL = dict(n_layer=2, d_model=64, n_head=4, max_seq_len=256)
_TINY_RECIPE = dict(
    batch_size=8, seq_len=256, lr=2e-3, min_lr=2e-4, warmup_steps=20, max_steps=300, eval_interval=100, eval_batches=8
)
_TINY_BY_HAND = {
    "indirect-indexing-tiny": (
        dict(max_seq_len=48, dropout=0.0),
        dict(dataset="indirect-indexing", batch_size=32, seq_len=48, lr=1e-3, min_lr=1e-4, beta2=0.99),
        "uniform",
    ),
    "jsb-tiny": (dict(vocab_size=90, dropout=0.1), dict(dataset="jsb", beta2=0.99), "uniform"),
    "maestro-tiny": (dict(vocab_size=328, dropout=0.1), dict(dataset="maestro", beta2=0.99), "uniform"),
    "genome-tiny": (dict(vocab_size=4107, dropout=0.1), dict(dataset="genome", beta2=0.999), "uniform"),
    "owt-tiny": (dict(vocab_size=50257, dropout=0.0), dict(dataset="openwebtext", beta2=0.95), "zero"),
}


@pytest.mark.parametrize("name", sorted(_TINY_BY_HAND))
def test_derived_tiny_presets_equal_the_hand_written_ones(name):
    model, recipe, delta_init = _TINY_BY_HAND[name]
    preset = PRESETS[name]
    assert preset.model == {**_TINY_MODEL, **model}
    assert preset.recipe == Recipe(**{**_TINY_RECIPE, **recipe})  # every other field at its default, as before
    assert preset.pope_delta_init == delta_init and preset.paper == {}
