"""Writing new policy weights into an inference model in place: full tensors or a merged LoRA.

LoRA adapters are merged (W = W_base + scaling · B @ A) so sampling pays nothing per token for
them. The untouched base weight of every merged module is kept once, so each new adapter replaces
the previous one exactly instead of accumulating rounding drift; the cost is one extra copy of the
adapted weights.

Merging needs the layer's weight layout: `nn.Linear` stores `[out, in]`, GPT-2's `Conv1D` stores
`[in, out]` (peft's `fan_in_fan_out`), so its delta is transposed — decided by the module's type,
never by the shape, which a square `Conv1D` would pass either way. Other adapted module types
(embeddings, convolutions) are refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

PEFT_PREFIX = "base_model.model."
"""What peft puts before a base model's module names in an adapter's keys."""
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?:embedding_)?(?P<part>[AB])(?:\.[^.]+)?(?:\.weight)?$")
_MODULES_TO_SAVE_KEY = re.compile(r"^(?P<module>.+)\.modules_to_save\.[^.]+\.(?P<param>[^.]+)$")
MERGEABLE_LAYERS: dict[type[nn.Module], bool] = {nn.Linear: False, Conv1D: True}
"""Module types a LoRA delta can be merged into → whether their weight is stored transposed ([in, out]).

The trainer adapts only these by default (`lora_target_modules = "all-linear"`), so every adapter it
makes can be merged here."""


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
        # Everything is checked before the first weight changes, so a refused adapter leaves the model as it was.
        plan: list[tuple[str, torch.Tensor, bool]] = []
        for module, parts in pairs.items():
            if set(parts) != {"A", "B"}:
                raise ValueError(f"LoRA module {module!r} needs both lora_A and lora_B weights, got {sorted(parts)}")
            transposed = self._weight_layout(module)
            shape = (parts["B"].shape[0], parts["A"].shape[1])
            weight_name = f"{module}.weight"
            target = self._target(weight_name, weight_name, torch.Size(shape[::-1] if transposed else shape))
            plan.append((module, target, transposed))
        for name, value in full.items():
            self._target(name, name, value.shape)
        for module, target, transposed in plan:
            delta = (pairs[module]["B"].to(torch.float32) @ pairs[module]["A"].to(torch.float32)) * scaling
            base = self._base_weights.setdefault(f"{module}.weight", target.detach().clone())
            target.copy_((base.to(torch.float32) + (delta.T if transposed else delta).to(base.device)).to(target.dtype))
        merged = {f"{module}.weight" for module, _, _ in plan}
        for weight_name, base in self._base_weights.items():
            if weight_name not in merged:
                self._tensors[weight_name].copy_(base)
        self.load_full(full)

    @torch.no_grad()
    def reset(self) -> None:
        """Undo every merged adapter (full-weight loads are kept)."""
        for weight_name, base in self._base_weights.items():
            self._tensors[weight_name].copy_(base)

    def _weight_layout(self, module_name: str) -> bool:
        """Whether `module_name`'s weight is stored [in, out]; ValueError if a LoRA cannot be merged into it."""
        # peft nests wrappers when it adapts several parameters of one module (MoE experts): `<module>.base_layer`.
        owner = module_name.replace(".base_layer", "")
        try:
            module = self._model.get_submodule(owner)
        except AttributeError:
            raise ValueError(f"LoRA module {module_name!r} does not exist in the sampler's model") from None
        transposed = MERGEABLE_LAYERS.get(type(module))
        if transposed is None or owner != module_name:
            supported = ", ".join(f"{kind.__module__}.{kind.__name__}" for kind in MERGEABLE_LAYERS)
            raise ValueError(
                f"LoRA module {owner!r} is a {type(module).__name__}, which the sampler cannot merge an adapter into "
                f"(it merges into {supported} layers); leave it out of target_modules, e.g. list the attention "
                "projections instead of 'all-linear'"
            )
        return transposed

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
    return name[len(PEFT_PREFIX) :] if name.startswith(PEFT_PREFIX) else name


def embeddings_tied(model: Any) -> bool:
    """Whether a transformers model's output layer shares its weight with the input embeddings (None: no model)."""
    if model is None:
        return False
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    return output is not None and inputs is not None and output.weight.data_ptr() == inputs.weight.data_ptr()
