"""SamplingParams validation: each bad value is refused with the field and the allowed range."""

from __future__ import annotations

import pytest

from agl_bridge.sampler.base import SamplingParams


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(max_tokens=-3), "max_tokens"),
        (SamplingParams(top_k=-2), "top_k"),
        (SamplingParams(stop=[999_999]), "stop token id 999999"),
        (SamplingParams(stop=[-1]), "stop token id -1"),
        (SamplingParams(stop=[""]), "stop strings"),
        (SamplingParams(seed=1.5), "seed"),  # type: ignore[arg-type]
    ],
)
def test_invalid_params_name_the_field(params: SamplingParams, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        params.validate(vocab_size=2048)


def test_valid_params_pass() -> None:
    SamplingParams(max_tokens=1, temperature=0, top_p=1.0, top_k=5, stop=["\n", 3], seed=7).validate(2048)


def test_stop_accessors_split_strings_and_ids() -> None:
    params = SamplingParams(stop=["END", 5, "x"])
    assert params.stop_strings == ("END", "x")
    assert params.stop_token_ids == (5,)
    assert SamplingParams(stop="END").stop_strings == ("END",)
    assert SamplingParams().stop_token_ids == ()
