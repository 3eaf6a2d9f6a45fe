"""`Datum`: one training sequence in Tinker's shape, and its validation.

A datum is aligned on *targets*: ``model_input[i]`` is the token the model reads at position i and
``loss_fn_inputs["target_tokens"][i]`` the next token it is scored on, so every per-token field
has the same length L as ``model_input``. Fields:

* ``target_tokens`` — the next token at each position (ints).
* ``weights`` — how much each target counts (>= 0; 0 masks prompt/observation tokens).
* ``logprobs`` — the sampler's raw logprob of each target (RL losses; anything where weight is 0).
* ``advantages`` — the advantage of each target (RL losses).
* ``old_logprobs`` — optional, PPO/CISPO only: the behaviour policy's logprobs when it is not the
  sampler (e.g. the trainer's own logprobs before the first of several updates on one batch).

Values may be Python lists, numpy arrays or 1-D torch tensors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

TARGET_TOKENS = "target_tokens"
WEIGHTS = "weights"
LOGPROBS = "logprobs"
ADVANTAGES = "advantages"
OLD_LOGPROBS = "old_logprobs"

KNOWN_FIELDS: tuple[str, ...] = (TARGET_TOKENS, WEIGHTS, LOGPROBS, ADVANTAGES, OLD_LOGPROBS)
"""The loss_fn_inputs keys the built-in losses understand."""

_FLOAT_FIELDS = (WEIGHTS, LOGPROBS, ADVANTAGES, OLD_LOGPROBS)
# Fields that must be finite wherever the weight is > 0 (elsewhere anything goes, even NaN/None).
_CHECKED_WHERE_ACTIVE = (LOGPROBS, ADVANTAGES, OLD_LOGPROBS)
# A raw logprob is <= 0; allow float noise, catch probabilities or flipped signs passed by mistake.
_LOGPROB_SLACK = 1e-3


class DatumError(ValueError):
    """A datum is malformed; `index` (position in the batch, None outside one) and `field` name it."""

    def __init__(self, index: int | None, field: str, message: str) -> None:
        where = f"datum {index}" if index is not None else "datum"
        super().__init__(f"{where}, {field}: {message}")
        self.index = index
        self.field = field


@dataclass
class Datum:
    """One training sequence: input token ids and per-target loss inputs (see the module docs)."""

    model_input: list[int]
    loss_fn_inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """L: the number of input positions (= number of targets)."""
        return len(self.model_input)

    @classmethod
    def from_sequence(
        cls,
        tokens: Sequence[int],
        loss_mask: Sequence[float],
        sampler_logprobs: Sequence[float | None] | None = None,
        advantages: float | Sequence[float] | None = None,
    ) -> Datum:
        """Build a datum from a whole sequence by shifting it onto its targets.

        All arguments are aligned with `tokens` (entry i describes token i): `loss_mask[i]` is the
        weight of predicting token i (0 for prompt/observation tokens; `loss_mask[0]` must be 0,
        nothing predicts the first token), `sampler_logprobs[i]` the sampler's logprob of token i
        (None or anything where the mask is 0), `advantages` one number for the whole sequence or
        one per token. The result has model_input = tokens[:-1], target_tokens = tokens[1:], and
        the mask/logprobs/advantages of each target; advantages are zeroed where the mask is 0.
        """
        n = len(tokens)
        if n < 2:
            raise DatumError(None, "tokens", f"need at least 2 tokens (one input, one target), got {n}")
        if len(loss_mask) != n:
            raise DatumError(None, "loss_mask", f"has {len(loss_mask)} entries but tokens has {n}; give one per token")
        if loss_mask[0]:
            raise DatumError(
                None,
                "loss_mask",
                "entry 0 is nonzero, but no position predicts the first token; "
                "the mask is aligned with tokens (mask[i] weighs token i), so set mask[0] = 0",
            )
        mask = [float(m) for m in loss_mask[1:]]
        inputs: dict[str, Any] = {TARGET_TOKENS: [int(t) for t in tokens[1:]], WEIGHTS: mask}
        if sampler_logprobs is not None:
            if len(sampler_logprobs) != n:
                raise DatumError(
                    None,
                    "sampler_logprobs",
                    f"has {len(sampler_logprobs)} entries but tokens has {n}; "
                    "give one per token (None where the mask is 0)",
                )
            inputs[LOGPROBS] = [0.0 if lp is None else float(lp) for lp in sampler_logprobs[1:]]
        if advantages is not None:
            if isinstance(advantages, numbers.Real) or getattr(advantages, "ndim", None) == 0:
                per_token = [float(cast(float, advantages))] * (n - 1)
            else:
                advantages = cast(Sequence[float], advantages)
                if len(advantages) != n:
                    raise DatumError(
                        None,
                        "advantages",
                        f"has {len(advantages)} entries but tokens has {n}; give one "
                        "per token or a single number for the whole sequence",
                    )
                per_token = [float(a) for a in advantages[1:]]
            # Masked targets get advantage 0 so they carry no signal even in losses without weights.
            inputs[ADVANTAGES] = [a if m > 0 else 0.0 for a, m in zip(per_token, mask, strict=True)]
        return cls(model_input=[int(t) for t in tokens[:-1]], loss_fn_inputs=inputs)


@dataclass
class DatumTensors:
    """A validated datum as 1-D tensors on one device; float fields are float32 and zero where inactive."""

    input_ids: torch.Tensor
    target_tokens: torch.Tensor
    weights: torch.Tensor
    fields: dict[str, torch.Tensor]
    extra: dict[str, Any]

    @property
    def active(self) -> torch.Tensor:
        """Boolean mask of the targets that count (weight > 0)."""
        return self.weights > 0


def to_tensors(
    datum: Datum,
    index: int,
    *,
    required: Iterable[str] = (TARGET_TOKENS,),
    allow_unknown: bool = False,
    vocab_size: int | None = None,
    device: torch.device | str = "cpu",
) -> DatumTensors:
    """Validate one datum and convert it; raise DatumError naming `index` and the field on any problem.

    required: loss_fn_inputs keys that must be present (a missing `weights` defaults to all ones
      unless required). allow_unknown: keep keys other than KNOWN_FIELDS (custom losses) in `extra`
      instead of refusing them.
    """
    if not isinstance(datum, Datum):
        raise DatumError(index, "datum", f"expected a Datum, got {type(datum).__name__}")
    ids = _int_tensor(datum.model_input, index, "model_input", vocab_size)
    length = ids.numel()
    if length == 0:
        raise DatumError(index, "model_input", "is empty; a datum needs at least one input token")
    inputs = datum.loss_fn_inputs
    if not isinstance(inputs, Mapping):
        raise DatumError(index, "loss_fn_inputs", f"must be a dict, got {type(inputs).__name__}")
    unknown = [k for k in inputs if k not in KNOWN_FIELDS]
    if unknown and not allow_unknown:
        raise DatumError(
            index,
            f"loss_fn_inputs[{unknown[0]!r}]",
            f"is not an input of the built-in losses (known: {', '.join(KNOWN_FIELDS)}); fix the name, "
            "or use forward_backward_custom to pass extra inputs",
        )
    for name in required:
        if name not in inputs:
            raise DatumError(
                index,
                f"loss_fn_inputs[{name!r}]",
                f"is missing; this loss needs {', '.join(repr(r) for r in required)}",
            )
    if TARGET_TOKENS not in inputs:
        raise DatumError(index, "loss_fn_inputs['target_tokens']", "is missing; every datum needs its next tokens")
    targets = _int_tensor(inputs[TARGET_TOKENS], index, "loss_fn_inputs['target_tokens']", vocab_size)
    _check_length(targets, length, index, TARGET_TOKENS)
    weights = _float_tensor(inputs[WEIGHTS], index, WEIGHTS) if WEIGHTS in inputs else torch.ones(length)
    _check_length(weights, length, index, WEIGHTS)
    if not torch.isfinite(weights).all() or (weights < 0).any():
        bad = int(torch.nonzero(~torch.isfinite(weights) | (weights < 0))[0])
        raise DatumError(
            index,
            "loss_fn_inputs['weights']",
            f"position {bad} is {weights[bad].item()}; weights must be finite and >= 0 (0 masks a token)",
        )
    active = weights > 0
    fields: dict[str, torch.Tensor] = {}
    for name in _FLOAT_FIELDS[1:]:
        if name not in inputs:
            continue
        values = _float_tensor(inputs[name], index, name)
        _check_length(values, length, index, name)
        if name in _CHECKED_WHERE_ACTIVE:
            bad_mask = active & ~torch.isfinite(values)
            if bad_mask.any():
                bad = int(torch.nonzero(bad_mask)[0])
                raise DatumError(
                    index,
                    f"loss_fn_inputs[{name!r}]",
                    f"position {bad} is {values[bad].item()} where the weight is {weights[bad].item()}; "
                    "values must be finite wherever weight > 0 (set the weight to 0 to drop the token)",
                )
        if name in (LOGPROBS, OLD_LOGPROBS):
            too_high = active & (values > _LOGPROB_SLACK)
            if too_high.any():
                bad = int(torch.nonzero(too_high)[0])
                raise DatumError(
                    index,
                    f"loss_fn_inputs[{name!r}]",
                    f"position {bad} is {values[bad].item()}, but a logprob is <= 0; pass log-probabilities, "
                    "not probabilities",
                )
        # Inactive positions may hold NaN/None placeholders; zero them so no NaN enters the graph
        # (NaN * 0 is still NaN).
        fields[name] = torch.where(active, torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
    extra = {k: v for k, v in inputs.items() if k not in KNOWN_FIELDS}
    return DatumTensors(
        input_ids=ids.to(device),
        target_tokens=targets.to(device),
        weights=weights.to(device),
        fields={k: v.to(device) for k, v in fields.items()},
        extra=extra,
    )


def _int_tensor(values: Any, index: int, name: str, vocab_size: int | None) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DatumError(index, name, f"could not be read as a list of token ids ({exc})") from None
    if tensor.dim() != 1:
        raise DatumError(index, name, f"must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        return tensor.long()  # an empty list reads as float32; the caller decides if empty is allowed
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise DatumError(index, name, f"must hold integer token ids, got dtype {tensor.dtype}")
    tensor = tensor.long()
    low, high = int(tensor.min()), int(tensor.max())
    limit = vocab_size if vocab_size is not None else math.inf
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        allowed = f"0..{int(limit) - 1}" if vocab_size is not None else "ids >= 0"
        raise DatumError(
            index,
            name,
            f"token id {bad} is outside the model's vocabulary {allowed}; were these ids made with another tokenizer?",
        )
    return tensor


def _float_tensor(values: Any, index: int, name: str) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        tensor = values.detach().to("cpu", torch.float32)
    elif isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
        tensor = torch.from_numpy(values.astype(np.float32, copy=False))
    else:
        try:
            tensor = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise DatumError(index, f"loss_fn_inputs[{name!r}]", f"could not be read as numbers ({exc})") from None
    if tensor.dim() != 1:
        raise DatumError(index, f"loss_fn_inputs[{name!r}]", f"must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor


def _check_length(tensor: torch.Tensor, length: int, index: int, name: str) -> None:
    if tensor.numel() != length:
        raise DatumError(
            index,
            f"loss_fn_inputs[{name!r}]",
            f"has length {tensor.numel()} but model_input has {length} tokens; every per-token field is "
            "aligned with model_input (entry i is about target i = the token after input i)",
        )
