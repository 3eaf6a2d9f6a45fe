"""The LoRA a training client adapts: which layers (those the sampler can merge into), and the
untied output layer a trained lm_head needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agl_bridge.sampler.weights import MERGEABLE_LAYERS, embeddings_tied


def lora_targets(model: torch.nn.Module, target_modules: str | Sequence[str], output_name: str) -> str | list[str]:
    """peft's `target_modules` for ours: "all-linear" becomes the layers the sampler can merge into.

    Those are `MERGEABLE_LAYERS` (nn.Linear, GPT-2's Conv1D) other than the output layer, by full
    name — in a dense model exactly what peft's "all-linear" adapts (and how peft records it), without
    the expert stacks and routers it also adapts in a mixture of experts.
    """
    if target_modules != "all-linear":
        return target_modules if isinstance(target_modules, str) else list(target_modules)
    return [name for name, module in model.named_modules() if type(module) in MERGEABLE_LAYERS and name != output_name]


def check_mergeable(lora_layers: dict[str, Any]) -> None:
    """ValueError naming the first adapted layer the in-process sampler could not merge a LoRA into."""
    for name, layer in lora_layers.items():
        base = layer.get_base_layer()
        if type(base) not in MERGEABLE_LAYERS:
            raise ValueError(
                f"LoRA target {name!r} is of type {type(base).__name__}, which the sampler cannot merge an adapter "
                "into (only linear layers); leave it out of target_modules / lora_target_modules — the default "
                '"all-linear" adapts only mergeable layers'
            )


def untie_output_embeddings(model: Any) -> None:
    """Give the output layer its own weight, so loading a trained lm_head leaves the embeddings alone."""
    if embeddings_tied(model):
        output = model.get_output_embeddings()
        output.weight = torch.nn.Parameter(output.weight.detach().clone(), requires_grad=False)
        if hasattr(model.config, "tie_word_embeddings"):
            model.config.tie_word_embeddings = False
