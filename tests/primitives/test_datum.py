"""Datum construction (the shift onto targets) and validation errors that name the datum and field."""

from __future__ import annotations

import math

import pytest

from agl_bridge.primitives import Datum, DatumError
from agl_bridge.primitives.datum import to_tensors

RL_FIELDS = ("target_tokens", "logprobs", "advantages")


def test_from_sequence_shifts_onto_targets() -> None:
    datum = Datum.from_sequence(
        tokens=[5, 6, 7, 8, 9],
        loss_mask=[0, 0, 1, 1, 0],
        sampler_logprobs=[None, None, -0.5, -1.5, None],
        advantages=2.0,
    )
    assert datum.model_input == [5, 6, 7, 8]
    assert datum.loss_fn_inputs == {
        "target_tokens": [6, 7, 8, 9],
        "weights": [0.0, 1.0, 1.0, 0.0],
        "logprobs": [0.0, -0.5, -1.5, 0.0],
        "advantages": [0.0, 2.0, 2.0, 0.0],  # zero where the target is masked
    }
    assert datum.num_tokens == 4


def test_from_sequence_takes_per_token_advantages() -> None:
    datum = Datum.from_sequence([1, 2, 3], [0, 1, 1], [None, -1.0, -2.0], advantages=[9.0, 0.5, -0.5])
    assert datum.loss_fn_inputs["advantages"] == [0.5, -0.5]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tokens": [1], "loss_mask": [0]}, "tokens"),
        ({"tokens": [1, 2, 3], "loss_mask": [0, 1]}, "loss_mask"),
        ({"tokens": [1, 2, 3], "loss_mask": [1, 1, 1]}, "loss_mask"),
        ({"tokens": [1, 2, 3], "loss_mask": [0, 1, 1], "sampler_logprobs": [-1.0, -1.0]}, "sampler_logprobs"),
        ({"tokens": [1, 2, 3], "loss_mask": [0, 1, 1], "advantages": [1.0]}, "advantages"),
    ],
)
def test_from_sequence_refuses_misaligned_inputs(kwargs: dict, field: str) -> None:
    with pytest.raises(DatumError) as info:
        Datum.from_sequence(**kwargs)
    assert info.value.field == field


def _rl(n: int = 3, **overrides) -> Datum:
    inputs = {"target_tokens": [2] * n, "weights": [1.0] * n, "logprobs": [-1.0] * n, "advantages": [0.5] * n}
    inputs.update(overrides)
    return Datum(model_input=[1] * n, loss_fn_inputs=inputs)


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        (_rl(advantages=[1.0, 2.0]), "loss_fn_inputs['advantages']", "length 2 but model_input has 3"),
        (_rl(advantages=[1.0, math.nan, 0.0]), "loss_fn_inputs['advantages']", "position 1 is nan"),
        (_rl(logprobs=[-1.0, -1.0, math.inf]), "loss_fn_inputs['logprobs']", "position 2 is inf"),
        (_rl(logprobs=[0.5, -1.0, -1.0]), "loss_fn_inputs['logprobs']", "not probabilities"),
        (_rl(weights=[1.0, -1.0, 1.0]), "loss_fn_inputs['weights']", ">= 0"),
        (_rl(target_tokens=[2, 5000, 2]), "loss_fn_inputs['target_tokens']", "vocabulary 0..2047"),
        (_rl(advantage=[1.0, 1.0, 1.0]), "loss_fn_inputs['advantage']", "use forward_backward_custom"),
        (
            Datum(model_input=[1, 2], loss_fn_inputs={"target_tokens": [2, 3], "logprobs": [-1.0, -1.0]}),
            "loss_fn_inputs['advantages']",
            "is missing; this loss needs",
        ),
        (Datum(model_input=[], loss_fn_inputs={"target_tokens": []}), "model_input", "is empty"),
        (Datum(model_input=[1.5, 2.0], loss_fn_inputs={"target_tokens": [1, 2]}), "model_input", "integer token ids"),
    ],
)
def test_validation_errors_name_the_datum_index_and_field(bad: Datum, field: str, words: str) -> None:
    with pytest.raises(DatumError) as info:
        to_tensors(bad, 7, required=RL_FIELDS, vocab_size=2048)
    assert info.value.index == 7
    assert info.value.field == field
    assert str(info.value).startswith(f"datum 7, {field}:")
    assert words in str(info.value)


def test_bad_values_where_the_weight_is_zero_are_ignored_and_zeroed() -> None:
    datum = _rl(weights=[1.0, 0.0, 1.0], advantages=[1.0, math.nan, 2.0], logprobs=[-1.0, math.inf, -2.0])
    tensors = to_tensors(datum, 0, required=RL_FIELDS)
    assert tensors.fields["advantages"].tolist() == [1.0, 0.0, 2.0]
    assert tensors.fields["logprobs"].tolist() == [-1.0, 0.0, -2.0]
    assert tensors.active.tolist() == [True, False, True]


def test_missing_weights_default_to_ones_for_rl_losses() -> None:
    datum = Datum([1, 2], {"target_tokens": [2, 3], "logprobs": [-1.0, -1.0], "advantages": [1.0, 1.0]})
    assert to_tensors(datum, 0, required=RL_FIELDS).weights.tolist() == [1.0, 1.0]


def test_the_client_reports_the_failing_datum_of_a_batch(make_client) -> None:
    client = make_client()
    good = _rl()
    with pytest.raises(DatumError, match=r"^datum 2, loss_fn_inputs\['advantages'\]"):
        client.forward_backward([good, good, _rl(advantages=[0.1, math.nan, 0.0])], "importance_sampling")
    with pytest.raises(DatumError, match=r"^datum 0, loss_fn_inputs\['weights'\]: is missing"):
        client.forward_backward([Datum([1], {"target_tokens": [2]})], "cross_entropy")
    assert all(p.grad is None for p in client.trainable_parameters())


def test_numpy_and_torch_inputs_are_accepted() -> None:
    import numpy as np
    import torch

    datum = Datum.from_sequence(np.array([1, 2, 3]), [0, 1, 1], [None, -1.0, -2.0], advantages=np.float32(0.5))
    assert datum.loss_fn_inputs["advantages"] == [0.5, 0.5]
    arrays = Datum(
        np.array([1, 2]),
        {
            "target_tokens": torch.tensor([2, 3]),
            "logprobs": np.array([-1.0, -2.0]),
            "advantages": torch.tensor([1.0, 0.0]),
        },
    )
    tensors = to_tensors(arrays, 0, required=RL_FIELDS, vocab_size=2048)
    assert tensors.fields["logprobs"].tolist() == [-1.0, -2.0]
    assert tensors.target_tokens.tolist() == [2, 3]
