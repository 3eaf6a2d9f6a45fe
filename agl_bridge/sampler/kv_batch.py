"""A left-padded, batched KV cache that sequences can join and leave between decode steps.

Continuous batching needs three operations a plain `DynamicCache` does not offer together: merge
two batches whose caches have different lengths, drop finished rows, and trim padding columns that
no remaining row needs. Rows are left-padded so that every row's newest token sits in the last
column, which keeps a decode step a single `[batch, 1]` forward.

The cache is built from the model's own config, as `generate` builds it (`DynamicCache(config=...)`):
full-attention layers keep every column, sliding-window layers only the newest `window - 1` (their
`DynamicSlidingWindowLayer`). Left padding shifts a whole row by the same number of columns, so a
window measured in columns is the window measured in tokens. Architectures whose layers keep any
other state (linear attention, convolutions, recurrent or shared caches) cannot be merged, forked or
trimmed this way: `CacheLayout.of` refuses them when the sampler loads, naming what is missing.

transformers 5.23 has no public way to rebuild a sliding-window layer from tensors (its `update`
counts only the kept columns), so `_fill` sets the layer's fields directly; it is the one place
that knows them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, get_layer_types_and_kwargs

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
SERVABLE_LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
"""Layer types (transformers' `config.layer_types` names) whose cache the sampler can batch exactly."""

_ALTERNATIVE = "serve it with vLLM: --sampler remote (docs/remote.md)"


class UnsupportedArchitectureError(ValueError):
    """A model the HF sampler cannot serve exactly; the one-line message names its type, what is missing, and
    the alternative."""

    def __init__(self, model_type: str, missing: str) -> None:
        super().__init__(f"model type {model_type!r} cannot be served by the HF sampler: {missing}; {_ALTERNATIVE}")
        self.model_type = model_type
        self.missing = missing

    def __reduce__(self) -> tuple[type[UnsupportedArchitectureError], tuple[str, str]]:  # crosses processes whole
        return type(self), (self.model_type, self.missing)


@dataclass(frozen=True)
class CacheLayout:
    """How many columns each layer's cache keeps, read from the model's config: None = all, W = a W-token window."""

    config: PretrainedConfig
    windows: tuple[int | None, ...]

    @classmethod
    def of(cls, model: Any) -> CacheLayout:
        """The layout of a transformers causal LM; UnsupportedArchitectureError if it cannot be batched exactly."""
        config = model.config
        model_type = str(getattr(config, "model_type", type(model).__name__))
        if getattr(config, "is_encoder_decoder", False):
            raise UnsupportedArchitectureError(
                model_type, "it is an encoder-decoder model, not a decoder-only causal LM"
            )
        if "past_key_values" not in inspect.signature(model.forward).parameters:
            raise UnsupportedArchitectureError(
                model_type, f"{type(model).__name__}.forward takes no past_key_values (it keeps a recurrent state)"
            )
        supports_cache = getattr(model, "_supports_default_dynamic_cache", None)
        if supports_cache is not None and not supports_cache():
            raise UnsupportedArchitectureError(
                model_type, f"{type(model).__name__} keeps a custom cache, not a KV cache"
            )
        text_config = config.get_text_config(decoder=True)
        layer_types, layer_kwargs = get_layer_types_and_kwargs(text_config)
        unservable = sorted({t for t in layer_types if t not in SERVABLE_LAYER_TYPES})
        if unservable:
            layers = [i for i, t in enumerate(layer_types) if t not in SERVABLE_LAYER_TYPES]
            raise UnsupportedArchitectureError(
                model_type,
                f"{_layers(layers)} {'/'.join(unservable)}, but continuous batching can merge, fork and trim "
                f"only {' and '.join(SERVABLE_LAYER_TYPES)} caches",
            )
        windows: list[int | None] = []
        for index, (layer_type, kwargs) in enumerate(zip(layer_types, layer_kwargs, strict=True)):
            window = kwargs.get("sliding_window") if layer_type == SLIDING_ATTENTION else None
            if layer_type == SLIDING_ATTENTION and not (isinstance(window, int) and window >= 2):
                raise UnsupportedArchitectureError(
                    model_type,
                    f"layer {index} is a sliding_attention layer but config.json gives no usable sliding_window "
                    f"({window!r}); set it there",
                )
            windows.append(window)
        layout = cls(config=text_config, windows=tuple(windows))
        layout._probe(model, model_type)
        return layout

    def _probe(self, model: Any, model_type: str) -> None:
        """Prefill two tokens and check the model filled the cache this layout describes."""
        device = next(model.parameters()).device
        mask = torch.ones((1, 2), dtype=torch.long, device=device)
        with torch.no_grad():
            output = model(input_ids=torch.zeros_like(mask), attention_mask=mask, past_key_values=self.new_cache())
        try:
            KVBatch(self, output.past_key_values, mask)
        except (AttributeError, RuntimeError) as error:
            raise UnsupportedArchitectureError(
                model_type, f"its cache is not the one its config describes ({error})"
            ) from error

    def new_cache(self) -> DynamicCache:
        """An empty cache for one forward pass, built as `generate` builds it."""
        return DynamicCache(config=self.config)

    def kept_columns(self, layer: int, columns: int) -> int:
        """How many of a batch's `columns` layer `layer` keeps (a window of W keeps the newest W - 1)."""
        window = self.windows[layer]
        return columns if window is None else min(columns, window - 1)


@dataclass
class KVBatch:
    """The cache of the running batch plus its `[rows, columns]` attention mask (0 = left padding).

    `columns` counts every token position the batch has seen; sliding-window layers hold only the
    newest of them (see `CacheLayout.kept_columns`).
    """

    layout: CacheLayout
    cache: DynamicCache
    attention_mask: torch.Tensor

    @property
    def rows(self) -> int:
        """Number of sequences in the batch."""
        return int(self.attention_mask.shape[0])

    @property
    def columns(self) -> int:
        """Cache length including left padding."""
        return int(self.attention_mask.shape[1])

    def __post_init__(self) -> None:
        for index, (keys, _) in enumerate(self.tensors()):
            kept = self.layout.kept_columns(index, self.columns)
            if keys.shape[0] != self.rows or keys.shape[-2] != kept:
                raise RuntimeError(
                    f"cache layer {index} holds keys of shape {tuple(keys.shape)}, expected {self.rows} rows x {kept} "
                    "columns: the model filled its cache differently from its config"
                )

    def tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values), `[rows, heads, kept columns, head_dim]`."""
        return [(_tensor(layer, "keys"), _tensor(layer, "values")) for layer in self.cache.layers]

    def with_tensors(self, layers: list[tuple[torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor) -> KVBatch:
        """A new batch of the same layout over these tensors and mask."""
        cache = self.layout.new_cache()
        columns = int(attention_mask.shape[1])
        for layer, (keys, values) in zip(cache.layers, layers, strict=True):
            _fill(layer, keys, values, columns)
        return KVBatch(self.layout, cache, attention_mask)

    def left_pad_to(self, columns: int) -> KVBatch:
        """The same batch with zero columns (masked out) added on the left up to `columns`."""
        if columns <= self.columns:
            return self
        layers = []
        for index, (keys, values) in enumerate(self.tensors()):
            extra = self.layout.kept_columns(index, columns) - keys.shape[-2]
            layers.append((F.pad(keys, (0, 0, extra, 0)), F.pad(values, (0, 0, extra, 0))))
        return self.with_tensors(layers, F.pad(self.attention_mask, (columns - self.columns, 0)))

    def concat(self, other: KVBatch) -> KVBatch:
        """Rows of `self` followed by rows of `other`, padded to a common length."""
        columns = max(self.columns, other.columns)
        a, b = self.left_pad_to(columns), other.left_pad_to(columns)
        layers = [
            (torch.cat([ka, kb], dim=0), torch.cat([va, vb], dim=0))
            for (ka, va), (kb, vb) in zip(a.tensors(), b.tensors(), strict=True)
        ]
        return self.with_tensors(layers, torch.cat([a.attention_mask, b.attention_mask], dim=0))

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
        layers = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.tensors()]
        return self.with_tensors(layers, self.attention_mask.index_select(0, rows))

    def trim_left(self) -> KVBatch:
        """Drop leading columns that are padding in every row (left behind by finished rows)."""
        real_columns = self.attention_mask.any(dim=0).nonzero()
        if real_columns.numel() == 0 or int(real_columns[0]) == 0:
            return self
        columns = self.columns - int(real_columns[0])
        layers = []
        for index, (keys, values) in enumerate(self.tensors()):
            # Every layer keeps the newest columns, so the trimmed ones are always its leftmost.
            start = keys.shape[-2] - self.layout.kept_columns(index, columns)
            layers.append((keys[:, :, start:].contiguous(), values[:, :, start:].contiguous()))
        return self.with_tensors(layers, self.attention_mask[:, -columns:].contiguous())


def _fill(layer: Any, keys: torch.Tensor, values: torch.Tensor, columns: int) -> None:
    """Load a fresh cache layer with tensors of a batch that has seen `columns` positions (transformers 5.23)."""
    if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
        raise TypeError(f"cannot refill a {type(layer).__name__} cache layer")
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    if isinstance(layer, DynamicSlidingWindowLayer):
        layer.cumulative_length = columns  # what the mask and the next update measure the window from


def _tensor(layer: object, name: str) -> torch.Tensor:
    value = getattr(layer, name, None)
    if not isinstance(value, torch.Tensor):
        raise RuntimeError(f"a {type(layer).__name__} cache layer holds no {name} tensor")
    return value


def _layers(indices: list[int]) -> str:
    if len(indices) == 1:
        return f"layer {indices[0]} is"
    shown = ", ".join(str(i) for i in indices[:8])
    return f"layers {shown}{f', ... ({len(indices)} in all)' if len(indices) > 8 else ''} are"
