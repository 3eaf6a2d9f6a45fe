"""The SDK's custom losses, as they reach the server: `forward_backward_custom` runs the user's loss on the
client, then sends a `cross_entropy` step whose weights are the loss's gradient with respect to each
logprob, negated, so some are negative. Our datums keep weights >= 0 (a negative weight is a mistake
everywhere else), so such a call runs as a custom loss, −Σ w·lp with the signed weights, whose
gradient is exactly the one the SDK asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from agl_bridge.primitives.datum import TARGET_TOKENS, WEIGHTS, Datum

SIGNED_WEIGHTS = "signed_weights"


def has_negative_weights(data: Sequence[Datum]) -> bool:
    """Whether any datum carries a negative weight."""
    return any(
        WEIGHTS in datum.loss_fn_inputs and (np.asarray(datum.loss_fn_inputs[WEIGHTS]) < 0).any() for datum in data
    )


def signed_cross_entropy(data: Sequence[Datum]) -> list[Datum]:
    """The datums for `signed_loss`: weights made >= 0 (they mark the tokens that count), the signs kept aside."""
    return [
        Datum(
            datum.model_input,
            {
                TARGET_TOKENS: datum.loss_fn_inputs[TARGET_TOKENS],
                WEIGHTS: np.abs(np.asarray(datum.loss_fn_inputs[WEIGHTS], dtype=np.float32)),
                SIGNED_WEIGHTS: np.asarray(datum.loss_fn_inputs[WEIGHTS], dtype=np.float32),
            },
        )
        for datum in data
    ]


def signed_loss(data: Sequence[Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """−Σ w·lp over every datum with its signed weights (a `forward_backward_custom` loss)."""
    total = sum(
        (
            -(torch.as_tensor(datum.loss_fn_inputs[SIGNED_WEIGHTS], device=lp.device, dtype=lp.dtype) * lp).sum()
            for datum, lp in zip(data, logprobs, strict=True)
        ),
        start=torch.zeros((), device=logprobs[0].device),
    )
    return total, {}
