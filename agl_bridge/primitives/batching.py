"""Micro-batches: datums split so no forward pass holds more than `max_batch_tokens` padded tokens,
each right-padded into tensors (the one knob that bounds a training client's activation memory)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agl_bridge.primitives.datum import LOGPROBS, OLD_LOGPROBS, DatumTensors


@dataclass
class MicroBatch:
    """A right-padded micro-batch: which datums (`indices`) and their unpadded `lengths`."""

    indices: list[int]
    lengths: list[int]
    input_ids: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    fields: dict[str, torch.Tensor]
    has_logprobs: torch.Tensor


def batch_groups(lengths: list[int], max_batch_tokens: int) -> list[list[int]]:
    """The indices of each micro-batch, in order: cut so each batch's longest row × its rows stays
    within `max_batch_tokens` (a datum longer than that goes alone)."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index, length in enumerate(lengths):
        if current and max(longest, length) * (len(current) + 1) > max_batch_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    groups.append(current)
    return groups


def micro_batches(tensors: list[DatumTensors], max_batch_tokens: int, device: torch.device) -> list[MicroBatch]:
    """The datums in order, right-padded into the micro-batches `batch_groups` cuts."""
    lengths = [datum.input_ids.numel() for datum in tensors]
    return [collate(tensors, group, device) for group in batch_groups(lengths, max_batch_tokens)]


def collate(tensors: list[DatumTensors], indices: list[int], device: torch.device) -> MicroBatch:
    """The datums at `indices` right-padded into one batch (a missing field is zeros; a missing
    old_logprobs is the datum's own sampler logprobs)."""
    rows = [tensors[i] for i in indices]
    lengths = [row.input_ids.numel() for row in rows]

    def pad(values: list[torch.Tensor], fill: float = 0) -> torch.Tensor:
        return torch.nn.utils.rnn.pad_sequence(values, batch_first=True, padding_value=fill)

    names = {name for row in rows for name in row.fields}
    fields: dict[str, torch.Tensor] = {}
    for name in names:
        # A datum without old_logprobs means "old policy = sampler", so it takes its own logprobs.
        fallback = (
            (lambda row: row.fields.get(LOGPROBS, torch.zeros_like(row.weights)))
            if name == OLD_LOGPROBS
            else (lambda row: torch.zeros_like(row.weights))
        )
        fields[name] = pad([row.fields.get(name, fallback(row)) for row in rows])
    return MicroBatch(
        indices=indices,
        lengths=lengths,
        input_ids=pad([row.input_ids for row in rows]),
        targets=pad([row.target_tokens for row in rows]),
        weights=pad([row.weights for row in rows]),
        fields=fields,
        has_logprobs=torch.tensor([LOGPROBS in row.fields for row in rows], device=device),
    )
