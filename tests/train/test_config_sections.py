"""The sections of a run config: each key belongs to the kinds of run its section names, and the
docs' table of sections is the code's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from agl_bridge.train.config import SECTIONS, ConfigError, GRPOConfig, config_from_dict

DOCS = Path(__file__).resolve().parents[2] / "docs" / "training.md"
DPO = {"mode": "dpo", "dpo": {"data": "pairs.jsonl"}}


@pytest.mark.parametrize(
    ("raw", "key", "run"),
    [
        ({**DPO, "loss_fn": "ppo"}, "loss_fn", "a DPO run"),
        ({**DPO, "warm_start": {"steps": 3}}, "warm_start", "a DPO run"),
        ({"offline_data": "x.jsonl", "sampler": "remote"}, "sampler", "an offline run"),
        ({"offline_data": "x.jsonl", "eval_every": 2}, "eval_every", "an offline run"),
        ({"mode": "follow", "eval_every": 2}, "eval_every", "a follow run"),
        ({"mode": "follow", "repetition_penalty": {"ngram": 3}}, "repetition_penalty", "a follow run"),
        ({"follow": {"port": 0}}, "follow", "an online run"),
        ({"dpo": {"beta": 0.2}}, "dpo", "an online run"),
    ],
)
def test_a_key_of_another_kind_of_run_is_refused_naming_the_key_and_the_run(
    raw: dict[str, Any], key: str, run: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_dict(raw)
    message = str(refused.value)
    assert message.startswith(f"{key} is a setting of ") and f"this run is {run}" in message, message


def test_keys_at_their_defaults_are_never_refused() -> None:
    for raw in ({**DPO}, {"offline_data": "x.jsonl", "eval_every": 5, "sampler": "hf"}, {"mode": "follow"}):
        config_from_dict(raw)


def test_every_key_is_in_exactly_one_section() -> None:
    per_section = [{f.name for f in dataclasses.fields(section)} for section, _ in SECTIONS]
    assert sum(map(len, per_section)) == len(dataclasses.fields(GRPOConfig)) == len(set().union(*per_section))


def test_the_docs_table_of_sections_is_the_codes() -> None:
    rows = re.findall(r"^\| [^|]+ \| ([a-z, ]+run|[a-z, ]+) \| (`.+`) \|$", DOCS.read_text(), flags=re.M)
    documented = [set(re.findall(r"`([a-z_0-9]+)`", keys)) for _, keys in rows if keys.startswith("`")]
    sections = [{f.name for f in dataclasses.fields(section)} for section, _ in SECTIONS]
    assert [keys for keys in documented if keys in sections] == sections, "docs/training.md: the table of sections"


def test_fsdp_sharding_is_refused_for_dpo_and_an_unknown_sharding_is_named() -> None:
    config_from_dict({"trainer_ranks": 2, "trainer_sharding": "fsdp"})
    with pytest.raises(ConfigError, match='trainer_sharding = "fsdp" cannot train DPO'):
        config_from_dict({**DPO, "trainer_sharding": "fsdp"})
    with pytest.raises(ConfigError, match="trainer_sharding"):
        config_from_dict({"trainer_sharding": "zero3"})


def test_full_weights_are_refused_with_a_trained_unembedding_or_an_adapter_sampler() -> None:
    config_from_dict({"train_full_weights": True, "trainer_sharding": "fsdp", "trainer_ranks": 2})
    with pytest.raises(ConfigError, match="trains the output layer already"):
        config_from_dict({"train_full_weights": True, "train_unembedding": True})
    with pytest.raises(ConfigError, match='only sampler = "hf" loads live'):
        config_from_dict({"train_full_weights": True, "sampler": "remote", "sampler_urls": ["http://127.0.0.1:1"]})
