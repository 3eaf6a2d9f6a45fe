"""Building the sampler a command or a run asks for: `hf` (in-process transformers), `remote`
(vLLM-protocol servers over HTTP) or `vllm` (an in-process vLLM engine, GPU only).

The CLI (`agl-bridge serve --sampler ...`) and the trainer config (`sampler = ...`) both describe a
sampler with a `SamplerSpec`; `SamplerSpecError.field` names the option that is wrong so each caller
can report it in its own words (a flag, or a config key).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from agl_bridge import semconv

SamplerKind = Literal["hf", "remote", "vllm"]
SAMPLER_KINDS: tuple[str, ...] = ("hf", "remote", "vllm")


class SamplerSpecError(ValueError):
    """A sampler option is wrong; `field` names it (sampler, sampler_urls, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class SamplerSpec:
    """Which sampler to build and its options.

    kind: hf | remote | vllm. urls: the remote servers. api_key: their key (default the
    AGL_SAMPLER_API_KEY environment variable). remote_model: the name they serve the base model
    under (default: the served model name). timeout_s: longest wait for one remote answer.
    adapter_dir: where adapters are written for remote servers to load. max_batch_size: most
    sequences sampled together (hf) / most samples per request.
    """

    kind: str = "hf"
    urls: list[str] = field(default_factory=list)
    api_key: str | None = None
    remote_model: str | None = None
    timeout_s: float = 600.0
    adapter_dir: str | None = None
    max_batch_size: int = 64
    seed: int | None = None

    def validate(self) -> None:
        """Raise SamplerSpecError naming the first option that is wrong."""
        from agl_bridge.sampler.remote_pool import normalize_url

        if self.kind not in SAMPLER_KINDS:
            raise SamplerSpecError("sampler", f"sampler must be one of {', '.join(SAMPLER_KINDS)}, got {self.kind!r}")
        if self.kind == "remote":
            if not self.urls:
                raise SamplerSpecError(
                    "sampler_urls",
                    "sampler 'remote' needs at least one server URL (e.g. http://gpu-1:8000), comma-separated for "
                    "several",
                )
            for url in self.urls:
                try:
                    normalize_url(url)
                except ValueError as error:
                    raise SamplerSpecError("sampler_urls", str(error)) from None
        elif self.urls:
            raise SamplerSpecError(
                "sampler_urls", f"sampler URLs are only used with sampler 'remote' (sampler is {self.kind!r})"
            )
        if not isinstance(self.timeout_s, (int, float)) or isinstance(self.timeout_s, bool) or self.timeout_s <= 0:
            raise SamplerSpecError(
                "sampler_timeout_s", f"sampler_timeout_s must be a number of seconds > 0, got {self.timeout_s!r}"
            )


def split_urls(values: list[str] | str | None) -> list[str]:
    """URLs from repeated and/or comma-separated values."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def build_sampler(spec: SamplerSpec, model_path: str, tokenizer: Any, *, served_name: str) -> Any:
    """The sampler `spec` describes over the model at `model_path` (weights are loaded only for hf)."""
    spec.validate()
    if spec.kind == "hf":
        from agl_bridge.models.loading import load_causal_lm
        from agl_bridge.sampler.hf import HFSampler

        return HFSampler(load_causal_lm(model_path), tokenizer, max_batch_size=spec.max_batch_size, seed=spec.seed)
    if spec.kind == "vllm":
        from agl_bridge.sampler.vllm import VLLMSampler

        return VLLMSampler(
            model_path,
            tokenizer=tokenizer,
            max_batch_size=spec.max_batch_size,
            adapter_dir=spec.adapter_dir,
            seed=spec.seed,
        )
    from agl_bridge.sampler.remote import RemoteSampler

    return RemoteSampler(
        spec.urls,
        model=spec.remote_model or served_name,
        api_key=spec.api_key or os.environ.get(semconv.ENV_SAMPLER_API_KEY) or None,
        vocab_size=len(tokenizer),
        max_context=model_context(model_path),
        max_batch_size=spec.max_batch_size,
        timeout_s=spec.timeout_s,
        adapter_dir=spec.adapter_dir,
    )


def model_context(model_path: str, default: int = 32768) -> int:
    """The model's context window from its config (no weights loaded); `default` if it says none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return default
    return int(getattr(config, "max_position_embeddings", None) or default)
