"""Helpers shared by the training-primitive tests: synthetic sequences and on-policy batches."""

from __future__ import annotations

import torch

from agl_bridge.primitives import Datum, TrainingClient


def random_sequences(count: int, seed: int = 0, low: int = 8, high: int = 24) -> list[list[int]]:
    """`count` random token sequences of random lengths in [low, high)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=generator).tolist()
    return [torch.randint(10, 1900, (n,), generator=generator).tolist() for n in lengths]


def rl_batch(client: TrainingClient, count: int = 3, seed: int = 0, prompt_len: int = 4) -> list[Datum]:
    """Datums whose sampler logprobs are the client's own current logprobs (on-policy), advantages ±1.

    Completion tokens (after `prompt_len`) are trained on; advantages alternate in sign.
    """
    sequences = random_sequences(count, seed)
    plain = [Datum.from_sequence(s, [0] * prompt_len + [1] * (len(s) - prompt_len)) for s in sequences]
    scored = client.forward(plain).loss_fn_outputs
    data = []
    for i, (sequence, out) in enumerate(zip(sequences, scored, strict=True)):
        logprobs = [None, *out["logprobs"].tolist()]
        mask = [0] * prompt_len + [1] * (len(sequence) - prompt_len)
        data.append(Datum.from_sequence(sequence, mask, logprobs, advantages=1.0 if i % 2 == 0 else -1.0))
    return data
