"""Toy learning on the tiny model: GSPO moves each sequence's likelihood the way its advantage says.

(DPO's is in test_dpo.py, distillation's — through the proxy — in test_algorithms_e2e.py.)
"""

from __future__ import annotations

import pytest
import torch
from datum_helpers import random_sequences

from agl_bridge.primitives import AdamParams, Datum

PROMPT = 4


def _mean_logprobs(client, sequences: list[list[int]]) -> list[float]:
    """Each sequence's mean logprob over its completion: GSPO's length-normalised sequence likelihood."""
    data = [Datum.from_sequence(s, [0] * PROMPT + [1] * (len(s) - PROMPT)) for s in sequences]
    return [float(out["logprobs"][PROMPT - 1 :].mean()) for out in client.forward(data).loss_fn_outputs]


@pytest.mark.parametrize(
    "config",
    [{}, {"tis_cap": 2.0, "correction_level": "sequence"}],
    ids=["paper-clip", "decoupled-sequence-tis"],
)
def test_gspo_raises_good_sequences_and_lowers_bad_ones(make_client, config: dict) -> None:
    client = make_client()
    sequences = random_sequences(6, seed=21)
    advantages = [1.0, -1.0, 1.0, -1.0, 1.0, -1.0]
    start = _mean_logprobs(client, sequences)
    for _ in range(6):
        # On-policy each step: the sampler's logprobs are the policy's own (ratio 1, inside GSPO's narrow clip).
        current = client.forward([Datum.from_sequence(s, [0] * PROMPT + [1] * (len(s) - PROMPT)) for s in sequences])
        data = [
            Datum.from_sequence(s, [0] * PROMPT + [1] * (len(s) - PROMPT), [None, *out["logprobs"].tolist()], a)
            for s, out, a in zip(sequences, current.loss_fn_outputs, advantages, strict=True)
        ]
        output = client.forward_backward(data, "gspo", config)
        assert output.metrics["clip_low_frac"] == output.metrics["clip_high_frac"] == 0.0
        client.optim_step(AdamParams(learning_rate=1e-2))
    end = _mean_logprobs(client, sequences)
    moved = [(e - s) * a for s, e, a in zip(start, end, advantages, strict=True)]
    assert all(m > 0.05 for m in moved), moved


def test_gspo_clip_stops_a_sequence_that_moved_too_far(make_client) -> None:
    """Off-policy data past the clip: the clipped sequences get no gradient, the others do."""
    client = make_client()
    sequences = random_sequences(2, seed=5)
    scored = client.forward([Datum.from_sequence(s, [0] * PROMPT + [1] * (len(s) - PROMPT)) for s in sequences])
    data = []
    for index, (s, out) in enumerate(zip(sequences, scored.loss_fn_outputs, strict=True)):
        shift = 0.5 if index == 0 else 0.0  # sequence 0: the sampler was e^0.5 less likely -> ratio e^0.5 > 1.0004
        logprobs = [None] + [lp - shift for lp in out["logprobs"].tolist()]
        data.append(Datum.from_sequence(s, [0] * PROMPT + [1] * (len(s) - PROMPT), logprobs, 1.0))
    client.forward_backward(data[:1], "gspo")
    clipped = sum(float(p.grad.abs().sum()) for p in client.trainable_parameters() if p.grad is not None)
    client.zero_grad()
    client.forward_backward(data[1:], "gspo")
    kept = sum(float(p.grad.abs().sum()) for p in client.trainable_parameters() if p.grad is not None)
    assert clipped == 0.0 and kept > 0.0
    assert torch.isfinite(torch.tensor(kept))
