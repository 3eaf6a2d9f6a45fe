"""A left-padded, batched KV cache that sequences can join and leave between decode steps.

Continuous batching needs three operations a plain `DynamicCache` does not offer together: merge
two batches whose caches have different lengths, drop finished rows, and trim padding columns that
no remaining row needs. Rows are left-padded so that every row's newest token sits in the last
column, which keeps a decode step a single `[batch, 1]` forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache

if TYPE_CHECKING:
    from transformers.cache_utils import CacheLayerMixin


@dataclass
class KVBatch:
    """Per-layer keys/values `[rows, heads, columns, head_dim]` plus the `[rows, columns]` mask."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    attention_mask: torch.Tensor

    @property
    def rows(self) -> int:
        """Number of sequences in the batch."""
        return int(self.attention_mask.shape[0])

    @property
    def columns(self) -> int:
        """Cache length including left padding."""
        return int(self.attention_mask.shape[1])

    @classmethod
    def from_cache(cls, cache: DynamicCache, attention_mask: torch.Tensor) -> KVBatch:
        """Take the tensors out of a cache returned by a forward pass."""
        # Full-attention caches only, filled by the forward pass: every layer holds key and value tensors.
        attention_layers = cast("list[CacheLayerMixin]", cache.layers)
        layers = [(cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)) for layer in attention_layers]
        return cls(layers=layers, attention_mask=attention_mask)

    def as_cache(self) -> DynamicCache:
        """A `DynamicCache` over these tensors, to pass as `past_key_values`."""
        return DynamicCache(ddp_cache_data=self.layers)

    def left_pad_to(self, columns: int) -> KVBatch:
        """The same batch with zero columns (masked out) added on the left up to `columns`."""
        extra = columns - self.columns
        if extra <= 0:
            return self
        layers = [(F.pad(k, (0, 0, extra, 0)), F.pad(v, (0, 0, extra, 0))) for k, v in self.layers]
        return KVBatch(layers=layers, attention_mask=F.pad(self.attention_mask, (extra, 0)))

    def concat(self, other: KVBatch) -> KVBatch:
        """Rows of `self` followed by rows of `other`, padded to a common length."""
        columns = max(self.columns, other.columns)
        a, b = self.left_pad_to(columns), other.left_pad_to(columns)
        layers = [
            (torch.cat([ka, kb], dim=0), torch.cat([va, vb], dim=0))
            for (ka, va), (kb, vb) in zip(a.layers, b.layers, strict=True)
        ]
        return KVBatch(layers=layers, attention_mask=torch.cat([a.attention_mask, b.attention_mask], dim=0))

    def repeat_rows(self, counts: list[int]) -> KVBatch:
        """Row i repeated counts[i] times (one prefill shared by several samples of a prompt)."""
        if all(c == 1 for c in counts):
            return self
        index = torch.repeat_interleave(
            torch.arange(len(counts), device=self.attention_mask.device),
            torch.tensor(counts, device=self.attention_mask.device),
        )
        return self.select(index)

    def select(self, rows: torch.Tensor) -> KVBatch:
        """Only the given rows (a LongTensor of row indices), in that order."""
        layers = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.layers]
        return KVBatch(layers=layers, attention_mask=self.attention_mask.index_select(0, rows))

    def trim_left(self) -> KVBatch:
        """Drop leading columns that are padding in every row (left behind by finished rows)."""
        real_columns = self.attention_mask.any(dim=0).nonzero()
        if real_columns.numel() == 0:
            return self
        first = int(real_columns[0])
        if first == 0:
            return self
        layers = [(k[:, :, first:].contiguous(), v[:, :, first:].contiguous()) for k, v in self.layers]
        return KVBatch(layers=layers, attention_mask=self.attention_mask[:, first:].contiguous())
