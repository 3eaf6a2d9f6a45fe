"""`SamplerSpec` is the one description of the sampler settings: the `serve` flags and the run-config keys
are built from it, with its defaults, and its errors name the setting as each side spells it."""

from __future__ import annotations

import dataclasses

import pytest
import typer

from agl_bridge.sampler.factory import SamplerSpec, SamplerSpecError
from agl_bridge.train.config import GRPOConfig


def test_every_flag_is_a_serve_option_with_the_spec_default_and_help() -> None:
    from agl_bridge.cli import app

    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    options = {opt: param for param in serve.params for opt in param.opts}
    defaults = SamplerSpec()
    flagged = {name: s for name, s in SamplerSpec.settings().items() if s.flag}
    assert {s.flag for s in flagged.values()} >= {"--sampler", "--sampler-url", "--sampler-timeout", "--max-batch-size"}
    for name, setting in flagged.items():
        option = options[setting.flag]
        assert option.default == getattr(defaults, name) and option.help == setting.help, name


def test_every_key_is_a_config_field_with_the_spec_default() -> None:
    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    config, defaults = GRPOConfig(), SamplerSpec()
    keyed = {name: s.key for name, s in SamplerSpec.settings().items() if s.key}
    assert set(keyed.values()) >= {"sampler", "sampler_urls", "sampler_timeout_s", "adapter_dir"}
    for name, key in keyed.items():
        assert key in fields and getattr(config, key) == getattr(defaults, name), key


def test_errors_name_the_flag_and_the_key_and_urls_are_split() -> None:
    with pytest.raises(SamplerSpecError) as caught:
        SamplerSpec(kind="remote", urls=" , ").validate()
    assert (caught.value.field, caught.value.flag, caught.value.key) == ("urls", "--sampler-url", "sampler_urls")
    assert SamplerSpec(kind="remote", urls="http://a:1, http://b:2").urls == ["http://a:1", "http://b:2"]
    with pytest.raises(SamplerSpecError, match="must be an integer >= 1") as caught:
        SamplerSpec(max_batch_size=0).validate()
    assert caught.value.flag == "--max-batch-size"


def test_where_the_hf_sampler_runs_is_a_switch_left_to_each_command_unless_said() -> None:
    from agl_bridge.cli import app

    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    for args, expected in (([], None), (["--sampler-process"], True), (["--no-sampler-process"], False)):
        assert serve.make_context("serve", list(args)).params["sampler_option_process"] is expected, args
    with pytest.raises(SamplerSpecError, match="true or false") as caught:
        SamplerSpec(process="yes").validate()  # type: ignore[arg-type]
    assert (caught.value.flag, caught.value.key) == ("--sampler-process", "sampler_process")
