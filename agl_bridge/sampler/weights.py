"""Writing new policy weights into an inference model in place: full tensors or a merged LoRA.

LoRA adapters are merged (W = W_base + scaling · B @ A) so sampling pays nothing per token for
them. The untouched base weight of every merged module is kept once, so each new adapter replaces
the previous one exactly instead of accumulating rounding drift; the cost is one extra copy of the
adapted weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")
_MODULES_TO_SAVE_KEY = re.compile(r"^(?P<module>.+)\.modules_to_save\.[^.]+\.(?P<param>[^.]+)$")


class WeightLoader:
    """Applies weight updates to one model; not thread-safe (the sampler's worker owns it)."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._tensors: dict[str, torch.Tensor] = dict(model.state_dict(keep_vars=True))
        self._base_weights: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def load_full(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy tensors by name (peft's `base_model.model.` prefix is accepted) into the model."""
        for raw_name, value in state_dict.items():
            name = _strip_peft_prefix(raw_name)
            target = self._target(name, raw_name, value.shape)
            target.copy_(value.to(dtype=target.dtype, device=target.device))
            if name in self._base_weights:
                # Full weights define a new base for this tensor; a later adapter merges onto it.
                self._base_weights[name] = target.detach().clone()

    @torch.no_grad()
    def load_lora(self, state_dict: Mapping[str, torch.Tensor], scaling: float) -> None:
        """Merge a LoRA adapter (peft state-dict layout) into the base weights, replacing the last one.

        `scaling` is peft's lora_alpha / r (or lora_alpha / sqrt(r) with rsLoRA). Keys of the form
        `<module>.modules_to_save.<adapter>.<param>` (e.g. a trained unembedding) are copied whole.
        """
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        full: dict[str, torch.Tensor] = {}
        for raw_name, value in state_dict.items():
            name = _strip_peft_prefix(raw_name)
            if match := _LORA_KEY.match(name):
                pairs.setdefault(match["module"], {})[match["part"]] = value
            elif match := _MODULES_TO_SAVE_KEY.match(name):
                full[f"{match['module']}.{match['param']}"] = value
            else:
                raise ValueError(
                    f"LoRA state dict key {raw_name!r} is neither a lora_A/lora_B weight nor a "
                    "modules_to_save tensor; pass peft.get_peft_model_state_dict(model) output"
                )
        merged: set[str] = set()
        for module, parts in pairs.items():
            if set(parts) != {"A", "B"}:
                raise ValueError(f"LoRA module {module!r} needs both lora_A and lora_B weights, got {sorted(parts)}")
            weight_name = f"{module}.weight"
            a, b = parts["A"], parts["B"]
            target = self._target(weight_name, weight_name, torch.Size((b.shape[0], a.shape[1])))
            base = self._base_weights.setdefault(weight_name, target.detach().clone())
            delta = (b.to(torch.float32) @ a.to(torch.float32)) * scaling
            target.copy_((base.to(torch.float32) + delta.to(base.device)).to(target.dtype))
            merged.add(weight_name)
        for weight_name, base in self._base_weights.items():
            if weight_name not in merged:
                self._tensors[weight_name].copy_(base)
        self.load_full(full)

    @torch.no_grad()
    def reset(self) -> None:
        """Undo every merged adapter (full-weight loads are kept)."""
        for weight_name, base in self._base_weights.items():
            self._tensors[weight_name].copy_(base)

    def _target(self, name: str, raw_name: str, shape: torch.Size) -> torch.Tensor:
        target = self._tensors.get(name)
        if target is None:
            raise ValueError(f"weight {raw_name!r} does not exist in the sampler's model (looked up as {name!r})")
        if target.shape != shape:
            raise ValueError(
                f"weight {raw_name!r} has shape {tuple(shape)} but the sampler's model expects {tuple(target.shape)}"
            )
        return target


def _strip_peft_prefix(name: str) -> str:
    return name[len(_PEFT_PREFIX) :] if name.startswith(_PEFT_PREFIX) else name
