"""Preset names: the smaller genome setup is `genome-small`, and the earlier name its runs recorded still loads."""

import json

import pytest

from pope.presets import PRESET_ALIASES, PRESETS, get_preset, list_presets
from pope.train import resolve_run_config


def test_genome_small_says_what_it_is():
    preset = get_preset("genome-small")
    assert (preset.model["n_layer"], preset.model["d_model"], preset.model["n_head"]) == (8, 512, 8)
    assert preset.recipe.max_steps == 2000
    assert "2000 steps" in preset.description and "2000-step schedule" in preset.recipe.assumed
    for text in (preset.description, preset.recipe.assumed):
        assert "H200" not in text and "minute" not in text


def test_an_earlier_preset_name_resolves_so_its_runs_resume():
    """A run started as `pope train genome-h200` recorded that name in config.json; resuming it names the same
    preset, and the config it resolves to must equal the recorded one (resume refuses any difference)."""
    assert get_preset("genome-h200") is get_preset("genome-small")
    recorded = json.loads(json.dumps(resolve_run_config("genome-h200", "pope", seed=1, vocab_size=4101).to_dict()))
    assert recorded["preset"] == "genome-h200"
    again = resolve_run_config("genome-h200", "pope", seed=1, vocab_size=4101).to_dict()
    assert again == recorded
    renamed = resolve_run_config("genome-small", "pope", seed=1, vocab_size=4101).to_dict()
    assert {**renamed, "preset": "genome-h200"} == recorded  # the same setup under its new name


def test_aliases_are_not_listed_and_point_at_presets():
    assert set(PRESET_ALIASES).isdisjoint(list_presets())
    assert set(PRESET_ALIASES.values()) <= set(PRESETS)
    with pytest.raises(ValueError, match="valid presets: .*genome-small"):
        get_preset("genome-h100")
