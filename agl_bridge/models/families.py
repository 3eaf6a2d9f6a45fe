"""The architectures the tiny model can be built as: the model families users bring their checkpoints from.

Each family is a transformers `model_type` plus the config values that make a tiny, random, but
structurally faithful member of it: grouped-query attention where the family has it, a mixture of
experts for `qwen3_moe`, sliding-window layers for `mistral` / `gemma2` / `gemma3` (a window of
`SLIDING_WINDOW` tokens, so short tests already cross it), `Conv1D` layers and learned positions for
`gpt2`. The tokenizer and chat template are the same for every family (see `tiny.py`).
"""

from __future__ import annotations

from typing import Any

DEFAULT_FAMILY = "qwen3"
"""The family of the built-in `tiny` model."""

SLIDING_WINDOW = 8
"""Window, in tokens, of the sliding-window layers of the tiny mistral / gemma2 / gemma3 models."""

NUM_ATTENTION_HEADS = 4
NUM_KEY_VALUE_HEADS = 2

FAMILIES: dict[str, str] = {
    "qwen3": "qwen3",
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3_moe": "qwen3_moe",
    "mistral": "mistral",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "gpt2": "gpt2",
}
"""Family name → the transformers `model_type` it builds."""


def family_config(
    family: str,
    *,
    vocab_size: int,
    hidden: int,
    layers: int,
    max_positions: int,
    initializer_range: float,
    eos_id: int,
    pad_id: int,
) -> Any:
    """The transformers config of a tiny random model of `family` (a key of FAMILIES)."""
    from transformers import AutoConfig

    head_dim = hidden // NUM_ATTENTION_HEADS
    ids = {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": pad_id}
    if family == "gpt2":
        return AutoConfig.for_model(
            "gpt2",
            vocab_size=vocab_size,
            n_embd=hidden,
            n_inner=3 * hidden,
            n_layer=layers,
            n_head=NUM_ATTENTION_HEADS,
            n_positions=max_positions,
            initializer_range=initializer_range,
            tie_word_embeddings=True,
            dtype="float32",
            **ids,
        )
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_KEY_VALUE_HEADS,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "initializer_range": initializer_range,
        "tie_word_embeddings": True,
        **ids,
        "dtype": "float32",
    }
    sliding = {"sliding_window": SLIDING_WINDOW}
    alternating = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    extra: dict[str, dict[str, Any]] = {
        "qwen3": {"max_window_layers": layers},
        "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": hidden},
        "mistral": sliding,
        "gemma2": {**sliding, "query_pre_attn_scalar": head_dim, "layer_types": alternating},
        "gemma3": {**sliding, "query_pre_attn_scalar": head_dim, "layer_types": alternating},
    }
    return AutoConfig.for_model(FAMILIES[family], **common, **extra.get(family, {}))
